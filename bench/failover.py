"""Failover tail (issue 26): kill -9 a partition leader again and again, under load.

A real 3-node cluster (the local launcher, 127.0.0.1-3, ports 19200/19280 unless
told otherwise), one topic of one partition, RF 3. One producer writes single
records to it back to back (acks=quorum, binary batches of one record, through
any node: followers forward). Then `--kills` times: find the partition leader,
SIGKILL it, and measure the longest gap between acknowledged writes around the
kill; read the survivors' logs to say which path elected the next leader; start
the killed node again, wait until it is back in the partition's ISR, and leave
the cluster alone for `--settle` seconds (the leadership balancer moves leaders
home every 5 s; a kill in the middle of a transfer measures something else).

Paths (from the survivors' JSON logs, for the partition's group):
- `fast`: the new leader logged `campaign_leader_gone` after the kill (its
  redial to the dead leader was refused: GroupRuntime._leader_gone);
- `fast-retry`: the same node won, but only on one of its `gone_retry` rounds
  (elected more than 40 ms after its first campaign);
- `timeout`: no `campaign_leader_gone` from the winner: its election timer ran out.

Per kill it prints the gap, the path, and the survivors' events in ms after the
kill (disconnect seen, redial refused, leader forgotten, campaign, leader), so a
slow kill shows where its time went. The box is shared: read the per-leg
breakdown and the counts before the absolute figures.

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/failover.py [--kills 20] [--settle 6]
        [--after-home 0.2]   # kill the restarted node right after it leads again: fresh links
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient, RaftlogError
from storage.batch import Record, encode_batch

TOPIC = "failover"
# The survivors' events worth a column, in the order they should happen.
EVENTS = ("peer_disconnected", "peer_refused_leader_gone", "leader_forgotten", "campaign_leader_gone",
          "role_changed", "became_leader")


@dataclass
class Kill:
    number: int
    victim: int
    wall_at: float  # time.time() of the kill, to compare with the nodes' log stamps
    gap_s: float = 0.0
    first_ack_s: float = 0.0  # kill -> first acknowledgement after it
    new_leader: int = 0
    path: str = "?"
    refusals: str = ""
    events: dict[int, list[tuple[str, float, dict[str, Any]]]] = field(default_factory=dict)


def one_record() -> bytes:
    return encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=int(time.time() * 1000))


async def partition_view(client: AsyncClient, server: str) -> dict[str, Any] | None:
    try:
        return (await client.describe_topic(TOPIC, server=server))["partitions"][0]
    except (RaftlogError, KeyError, IndexError):
        return None


async def leader_view(client: AsyncClient, cluster: LocalCluster, alive: set[int]) -> dict[str, Any] | None:
    """The partition as its leader sees it (the only view with the ISR), or None."""
    for node in cluster.nodes:
        if node.node_id not in alive:
            continue
        view = await partition_view(client, node.http_addr)
        if view and view.get("role") == "leader":
            return view
    return None


async def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(poll_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Producer:
    """Single records back to back; the monotonic time of every acknowledgement."""

    def __init__(self, servers: list[str]) -> None:
        self.servers = servers
        self.acknowledged: list[float] = []
        self.errors: list[tuple[float, str]] = []  # (monotonic time, error code) of every refused try
        self._stop = False

    async def run(self) -> None:
        batch = one_record()
        # One try per call and a fixed 2 ms pause after a refusal (the client moves on to
        # the next node): no client backoff hides the cluster's gap, and every refusal is
        # recorded with its code, which says what the cluster was doing meanwhile.
        async with AsyncClient(self.servers, timeout_s=2.0, attempts=1) as client:
            while not self._stop:
                try:
                    await client.produce_batch(TOPIC, 0, batch)
                    self.acknowledged.append(time.monotonic())
                except RaftlogError as error:
                    self.errors.append((time.monotonic(), error.code))
                    await asyncio.sleep(0.002)

    def stop(self) -> None:
        self._stop = True

    def gap_around(self, killed_at: float, after_s: float) -> tuple[float, float]:
        """(longest gap between acknowledgements in [kill - 0.5 s, kill + after_s], kill -> first ack)."""
        window = [t for t in self.acknowledged if killed_at - 0.5 <= t <= killed_at + after_s]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        first = next((t for t in window if t > killed_at), float("inf"))
        return max(gaps, default=float("inf")), first - killed_at

    def refusals_after(self, killed_at: float, until: float) -> str:
        """The refusals between the kill and `until`, as runs of one code: CODE xN @first-last ms."""
        runs: list[list] = []
        for at, code in self.errors:
            if killed_at <= at <= until:
                if runs and runs[-1][0] == code:
                    runs[-1][1] += 1
                    runs[-1][3] = at
                else:
                    runs.append([code, 1, at, at])
        return " ".join(f"{c}x{n}@{(a - killed_at) * 1000:.0f}-{(b - killed_at) * 1000:.0f}" for c, n, a, b in runs)


def read_events(log_file: Path, group_id: int, victim: int, since_wall: float,
                until_wall: float) -> list[tuple[str, float, dict[str, Any]]]:
    """(event, seconds after the kill, fields) of the survivor's lines that concern the kill."""
    found = []
    with open(log_file, "rb") as lines:
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            event = line.get("event")
            if event not in EVENTS:
                continue
            stamp = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()
            if not since_wall - 0.05 <= stamp <= until_wall:
                continue
            if event in ("peer_disconnected", "peer_refused_leader_gone"):
                if line.get("peer_id", line.get("peer")) != victim:
                    continue
            elif line.get("group_id") != group_id:
                continue
            if event == "role_changed" and line.get("role") != "leader":
                continue
            found.append((event, stamp - since_wall, line))
    return found


def classify(kill: Kill) -> str:
    events = kill.events.get(kill.new_leader, [])
    campaign = [t for e, t, _ in events if e == "campaign_leader_gone"]
    led = [t for e, t, _ in events if e in ("became_leader", "role_changed")]
    if not campaign:
        return "timeout"
    if led and led[0] - campaign[0] > 0.04:
        return "fast-retry"
    return "fast"


async def one_kill(number: int, cluster: LocalCluster, client: AsyncClient, producer: Producer,
                   group_id: int, observe_s: float) -> Kill:
    alive = {n.node_id for n in cluster.nodes}
    view = await wait_for(lambda: leader_view(client, cluster, alive), 30, "a partition leader")
    victim = int(view["leader"])
    kill = Kill(number, victim, time.time())
    killed_at = time.monotonic()
    cluster.kill_node(victim)
    await asyncio.sleep(observe_s)
    kill.gap_s, kill.first_ack_s = producer.gap_around(killed_at, observe_s)
    kill.refusals = producer.refusals_after(killed_at, killed_at + kill.first_ack_s)
    survivors = alive - {victim}
    after = await wait_for(lambda: leader_view(client, cluster, survivors), 30, "a new leader")
    kill.new_leader = int(after["leader"])
    for node_id in sorted(survivors):
        kill.events[node_id] = read_events(cluster.nodes[node_id - 1].log_file, group_id, victim,
                                           kill.wall_at, kill.wall_at + observe_s)
    kill.path = classify(kill)
    return kill


async def rejoin(cluster: LocalCluster, client: AsyncClient, victim: int, settle_s: float,
                 home_s: float | None) -> None:
    cluster.start_node(victim)
    await asyncio.to_thread(cluster.wait_healthy, 60, [victim])
    everyone = {n.node_id for n in cluster.nodes}

    async def in_sync() -> bool:
        view = await leader_view(client, cluster, everyone)
        return bool(view and view.get("isr") and victim in view["isr"] and len(view["isr"]) == len(everyone))

    await wait_for(in_sync, 60, f"node {victim} back in the ISR", poll_s=0.2)
    if home_s is not None:
        # The balancer hands the partition back to its preferred replica (the restarted
        # node, every time here) within 5 s; kill it `home_s` after that.
        async def home() -> bool:
            view = await leader_view(client, cluster, everyone)
            return bool(view and view["leader"] == view["replicas"][0])

        await wait_for(home, 30, "the leader back home", poll_s=0.02)
        await asyncio.sleep(home_s)
        return
    await asyncio.sleep(settle_s)
    await wait_for(in_sync, 60, f"node {victim} in the ISR after settling", poll_s=0.2)


def describe(kill: Kill) -> str:
    parts = []
    for node_id, events in sorted(kill.events.items()):
        seen = " ".join(f"{_short(e)}@{t * 1000:.0f}" for e, t, _ in events)
        parts.append(f"n{node_id}[{seen}]")
    return (f"kill {kill.number:2d}: node {kill.victim} -> leader {kill.new_leader}; gap {kill.gap_s * 1000:4.0f} ms,"
            f" first ack {kill.first_ack_s * 1000:4.0f} ms, path {kill.path:10s} " + " ".join(parts)
            + f"\n          client refusals: {kill.refusals or '-'}")


def _short(event: str) -> str:
    return {"peer_disconnected": "disc", "peer_refused_leader_gone": "refused", "leader_forgotten": "forgot",
            "campaign_leader_gone": "campaign", "role_changed": "leader", "became_leader": "won"}[event]


def summary(kills: list[Kill]) -> str:
    gaps = sorted(k.gap_s * 1000 for k in kills)
    p90 = gaps[max(0, round(0.9 * len(gaps)) - 1)]
    paths = {p: sum(1 for k in kills if k.path == p) for p in ("fast", "fast-retry", "timeout")}
    by_path = {p: statistics.median([k.gap_s * 1000 for k in kills if k.path == p])
               for p, n in paths.items() if n}
    return (f"{len(kills)} kills: gap median {statistics.median(gaps):.0f} ms, p90 {p90:.0f} ms, "
            f"max {gaps[-1]:.0f} ms; paths {paths}; median gap by path "
            + ", ".join(f"{p} {g:.0f} ms" for p, g in by_path.items()))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--settle", type=float, default=6.0, help="seconds to leave the cluster alone after a rejoin")
    parser.add_argument("--after-home", type=float, help="instead of --settle: kill this many seconds after "
                        "the balancer moved the leadership back to the restarted node")
    parser.add_argument("--observe", type=float, default=2.5, help="seconds after a kill to measure the gap in")
    parser.add_argument("--raft-port", type=int, default=19200)
    parser.add_argument("--http-port", type=int, default=19280)
    parser.add_argument("--keep", type=Path, help="run the cluster in this directory and keep it (logs)")
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="raftlog-failover-"))
    cluster = LocalCluster(directory, 3, raft_port=args.raft_port, http_port=args.http_port)
    cluster.start()
    kills: list[Kill] = []
    try:
        await asyncio.to_thread(cluster.wait_healthy, 60)
        async with AsyncClient(cluster.http_addresses, timeout_s=30) as client:
            await client.create_topic(TOPIC, partitions=1, replication_factor=3)
            everyone = {n.node_id for n in cluster.nodes}
            view = await wait_for(lambda: leader_view(client, cluster, everyone), 30, "a first leader")
            group_id = int(view["group_id"])
            producer = Producer(cluster.http_addresses)
            writing = asyncio.create_task(producer.run())
            await asyncio.sleep(args.settle)
            for number in range(1, args.kills + 1):
                kill = await one_kill(number, cluster, client, producer, group_id, args.observe)
                kills.append(kill)
                print(describe(kill), flush=True)
                await rejoin(cluster, client, kill.victim, args.settle, args.after_home)
            producer.stop()
            await writing
            print(summary(kills), flush=True)
            print(f"writes acknowledged {len(producer.acknowledged)}, refusals retried {len(producer.errors)}; logs in "
                  f"{directory if args.keep else '(deleted; --keep DIR keeps them)'}", flush=True)
            print("failover_result " + json.dumps({"gaps_ms": [round(k.gap_s * 1000, 1) for k in kills],
                                                   "paths": [k.path for k in kills]}), flush=True)
    finally:
        cluster.stop()
        if args.keep is None:
            import shutil

            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(uvloop.run(main()))
