"""Goal: consumer groups as a user drives them from the command line, over three real
`raftlog serve` processes and real `raftlog consume --group` processes (members, as
in N terminals): three members split a 12-partition topic evenly; a fourth joins and
partitions move incrementally (old members only give), nothing read twice; a member
killed with SIGKILL loses its partitions to the others within the session timeout
and they go on from its committed offsets, skipping nothing; one stopped with Ctrl-C
leaves at once. Then `raftlog group reset-offsets` (refused while a member is in,
a dry run that changes nothing, then --execute), `group list|describe` (lag), and
`group delete`.

Its own ports (17950/18950), so it never meets the other integration modules.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client import Client, RaftlogError
from tests.free_ports import process_cluster

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 12
SESSION_TIMEOUT_MS = 3000
TOPIC = "jobs"
GROUP = "workers"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("group-cli-processes")
    with process_cluster(directory, HOSTS, 17950, 18950, "the consumer group CLI tests") as local:
        yield local


def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multiraft.cli", *args, "--server", ",".join(cluster.http_addresses)],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


class Consumer:
    """One `raftlog consume TOPIC --group G --follow --show-offsets` process; its lines are
    collected by two threads (stdout: records read; stderr: partitions assigned/revoked)."""

    def __init__(self, cluster: LocalCluster, name: str, *options: str) -> None:
        self.name = name
        self.read: list[tuple[int, int]] = []  # (partition, offset)
        self.notes: list[str] = []
        options = options or ("--group", GROUP, "--wait-ms", "300", "--session-timeout-ms", str(SESSION_TIMEOUT_MS))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "multiraft.cli", "consume", TOPIC, *options, "--follow", "--show-offsets",
             "--from-beginning", "--server", ",".join(cluster.http_addresses)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self._threads = [threading.Thread(target=self._collect, args=(stream, into), daemon=True)
                         for stream, into in ((self.process.stdout, self.read), (self.process.stderr, self.notes))]
        for thread in self._threads:
            thread.start()

    def _collect(self, stream: IO[str], into: list[Any]) -> None:
        for line in stream:
            if into is self.read:
                partition, offset, _key, _value = line.rstrip("\n").split("\t")
                into.append((int(partition), int(offset)))
            else:
                into.append(line.rstrip("\n"))

    def stop(self, signum: int) -> int:
        """Send `signum` and wait for the exit code; a process that outlives 30 s is killed
        (and its pipes closed) before the test fails, so nothing of it outlives the test."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"{self.name} did not exit within 30 s of signal {signum}: {self.notes}") from None
        finally:
            for thread in self._threads:
                thread.join(10)
            for stream in (self.process.stdout, self.process.stderr):
                assert stream is not None
                stream.close()


def _until(probe: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _produce(client: Client, first: int, count: int) -> None:
    client.produce(TOPIC, [{"value": f"{p}-{i}", "partition": p} for p in range(PARTITIONS)
                           for i in range(first, first + count)])


def _settled(client: Client, members: int) -> dict[str, set[int]] | None:
    """{member id: partitions} once the group has `members` members, stable, owning every
    partition once; else None."""
    try:
        group = client.describe_group(GROUP)
    except RaftlogError:  # not there yet, or the coordinator moving: ask again
        return None
    owned = {m["member_id"]: {p for a in m["assignment"] for p in a["partitions"]} for m in group["members"]}
    covered = sorted(p for ps in owned.values() for p in ps)
    if len(owned) != members or group["state"] != "stable" or covered != list(range(PARTITIONS)):
        return None
    return owned


def _read_all(consumers: list[Consumer], expected: int) -> collections.Counter[tuple[int, int]]:
    def count() -> collections.Counter[tuple[int, int]] | None:
        seen = collections.Counter(r for c in consumers for r in list(c.read))
        return seen if len(seen) >= expected else None

    return _until(count, f"{expected} distinct records read")


def _caught_up(client: Client) -> bool:
    try:
        return all(row["lag"] == 0 for row in client.describe_group(GROUP)["partitions"])
    except RaftlogError:
        return False


def test_cli_members_split_move_take_over_and_the_group_is_reset_and_deleted(cli_cluster: LocalCluster) -> None:
    consumers: list[Consumer] = []
    spawned: list[Consumer] = []  # every process, for the finally: `consumers` loses the stopped ones
    with Client(cli_cluster.http_addresses, attempts=6) as client:
        done = _cli(cli_cluster, "topic", "create", TOPIC, "--partitions", str(PARTITIONS))
        assert done.returncode == 0, done.stderr
        try:
            consumers = [Consumer(cli_cluster, f"c{i}") for i in range(3)]
            spawned += consumers
            three = _until(lambda: _settled(client, 3), "three members, stable")
            assert sorted(len(ps) for ps in three.values()) == [4, 4, 4]
            _produce(client, 0, 5)
            seen = _read_all(consumers, PARTITIONS * 5)
            for consumer in consumers:  # each read its own four partitions
                assert len({p for p, _ in consumer.read}) == 4, (consumer.name, consumer.notes)

            # A fourth joins: old members only give (sticky), nothing is read twice.
            _until(lambda: _caught_up(client), "commits of every read")
            consumers.append(Consumer(cli_cluster, "c3"))
            spawned.append(consumers[-1])
            four = _until(lambda: _settled(client, 4), "four members, stable")
            assert sorted(len(ps) for ps in four.values()) == [3, 3, 3, 3]
            for member_id, partitions in three.items():
                assert four[member_id] <= partitions
            _produce(client, 5, 5)
            seen = _read_all(consumers, PARTITIONS * 10)
            assert max(seen.values()) == 1, [r for r, n in seen.items() if n > 1]

            # SIGKILL one (idle, everything it read committed): the others take its partitions
            # within the session timeout and read on from its commits.
            _until(lambda: _caught_up(client), "commits of every read")
            killed = consumers.pop(1)
            started = time.monotonic()
            assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
            _until(lambda: _settled(client, 3), "three members after the kill")
            taken_over_s = time.monotonic() - started
            assert taken_over_s <= SESSION_TIMEOUT_MS / 1000 + 5, taken_over_s  # + scan, reconcile, a busy box
            _produce(client, 10, 5)
            seen = _read_all([*consumers, killed], PARTITIONS * 15)
            assert max(seen.values()) == 1, [r for r, n in seen.items() if n > 1]
            assert set(seen) == {(p, o) for p in range(PARTITIONS) for o in range(15)}  # nothing skipped

            # Ctrl-C: it leaves at once (no wait for its session to time out).
            stopped = consumers.pop(0)
            started = time.monotonic()
            assert stopped.stop(signal.SIGINT) == 0, stopped.notes
            _until(lambda: _settled(client, 2), "two members after a Ctrl-C")
            assert time.monotonic() - started < SESSION_TIMEOUT_MS / 1000

            listed = _cli(cli_cluster, "group", "list")
            assert listed.returncode == 0 and GROUP in listed.stdout, listed.stderr
            described = _cli(cli_cluster, "group", "describe", GROUP)
            assert described.returncode == 0, described.stderr
            assert "LAG-SECONDS" in described.stdout and described.stdout.count(f"\n{TOPIC} ") == PARTITIONS
            refused = _cli(cli_cluster, "group", "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest",
                           "--execute")
            assert refused.returncode == 1 and "NON_EMPTY_GROUP" in refused.stderr, refused
            for consumer in consumers:
                assert consumer.stop(signal.SIGINT) == 0, consumer.notes
            consumers = []
        finally:
            for consumer in spawned:
                if consumer.process.returncode is None:
                    with contextlib.suppress(AssertionError):
                        consumer.stop(signal.SIGKILL)

        assert client.fetch_offsets(GROUP, TOPIC) == dict.fromkeys(range(PARTITIONS), 15)
        described = _cli(cli_cluster, "group", "describe", GROUP, "--topic", TOPIC)
        assert described.returncode == 0 and "no active members" in described.stdout, described
        assert described.stdout.count(f"\n{TOPIC} ") == PARTITIONS
        plan = _cli(cli_cluster, "group", "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest")
        assert plan.returncode == 0 and "dry run" in plan.stderr, plan
        assert client.fetch_offsets(GROUP, TOPIC) == dict.fromkeys(range(PARTITIONS), 15)
        done = _cli(cli_cluster, "group", "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", "--execute")
        assert done.returncode == 0, done.stderr
        done = _cli(cli_cluster, "group", "reset-offsets", GROUP, "--topic", f"{TOPIC}:0,1", "--shift-by", "3",
                    "--execute")
        assert done.returncode == 0, done.stderr
        assert client.fetch_offsets(GROUP, TOPIC) == {**dict.fromkeys(range(PARTITIONS), 0), 0: 3, 1: 3}

        # A member after the reset reads from the new offsets (and, without --follow, stops).
        again = _cli(cli_cluster, "consume", TOPIC, "--group", GROUP, "--show-offsets", "--max-records",
                     str(PARTITIONS * 15 - 6))
        assert again.returncode == 0, again.stderr
        lines = [tuple(map(int, line.split("\t")[:2])) for line in again.stdout.splitlines()]
        assert sorted(lines) == sorted({(p, o) for p in range(PARTITIONS) for o in range(15)}
                                       - {(p, o) for p in (0, 1) for o in range(3)})

        deleted = _cli(cli_cluster, "group", "delete", GROUP)
        assert deleted.returncode == 0, deleted.stderr
        assert client.fetch_offsets(GROUP, TOPIC) == {}


@pytest.mark.parametrize("mode", ["partition", "member"])
def test_ctrl_c_ends_a_long_poll_at_once_and_what_was_printed_is_committed(cli_cluster: LocalCluster,
                                                                          mode: str) -> None:
    """A follower idle in a 30 s long poll (of one partition, or as a group member): Ctrl-C
    ends it at once (Kafka's wakeup()), not after the poll; the group's commit covers
    exactly the records printed, and a member has left (no member lingers for its session)."""
    group = f"followers-{mode}"
    with Client(cli_cluster.http_addresses, attempts=6) as client:
        if TOPIC not in {t["name"] for t in client.list_topics()}:
            client.create_topic(TOPIC, partitions=PARTITIONS)
        client.produce(TOPIC, [{"value": f"f-{i}", "partition": 0} for i in range(7)])
        ends = {p: end for p, (_start, end) in client.partition_offsets(TOPIC).items()}
        if mode == "partition":
            options = ("--partition", "0", "--group", group)
            ends = {0: ends[0]}
        else:
            options = ("--group", group, "--session-timeout-ms", "30000")
        follower = Consumer(cli_cluster, "follower", *options, "--wait-ms", "30000")
        try:
            _until(lambda: len(follower.read) == sum(ends.values()), f"{sum(ends.values())} records printed")
            time.sleep(1.0)  # into its long poll
            started = time.monotonic()
            assert follower.stop(signal.SIGINT) == 0, follower.notes
            assert time.monotonic() - started < 10  # not the 30 s of the poll
        finally:
            if follower.process.returncode is None:
                with contextlib.suppress(AssertionError):
                    follower.stop(signal.SIGKILL)
        assert sorted(follower.read) == sorted((p, o) for p, end in ends.items() for o in range(end))
        assert client.fetch_offsets(group, TOPIC) == {p: end for p, end in ends.items() if end}
        if mode == "member":
            assert client.describe_group(group, [TOPIC])["members"] == []  # it left: nobody waits 30 s for it
