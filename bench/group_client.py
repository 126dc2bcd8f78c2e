"""Consumer groups through the Python client's member (issue 23): rebalance times, and
group fetch against a plain read. bench/groups.py measures the same over the raw
routes (JSON answers); this one measures what a user of `AsyncGroupConsumer` gets
(binary answers, callbacks, its own heartbeat task).

A real 3-node cluster (the local launcher, 127.0.0.1-3, ports 19500/19580 unless
told otherwise), a topic of 12 partitions, RF 3; members are the Python client's
`AsyncGroupConsumer`, polling on their own tasks in this process, each talking to
another node (calls to the others are forwarded to the coordinator).

- **join**: three members hold four partitions each; a fourth starts. Time from its
  start until every partition is owned again (each member holds what the group's
  target gives it and the group is stable).
- **leave**: a member closes (revokes, commits, leaves). Time until the other three
  hold every partition.
- **kill**: a member stops dead (its heartbeat task and polls end, no leave), as a
  process killed with SIGKILL. Time until the others hold every partition; the
  target is the session timeout (`--session-ms`) + 1 s.
- **fetch**: `--records` records (100 B values) in the topic; one member reads them
  all through group fetch (POST .../records, the binary answer), then a plain
  consumer (`AsyncConsumer`, binary batches) reads the same data, `--rounds` times
  alternated. Medians of records per second and their ratio (the target is >= 0.8).

    flock /tmp/raftlog-it.lock .venv/bin/python bench/group_client.py [--rounds 3] [--session-ms 3000]
        [--records 240000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from multiraft.client import AsyncClient, AsyncConsumer, AsyncGroupConsumer, RaftlogError
from storage.batch import Record, encode_batch

TOPIC = "grouped"
PARTITIONS = 12
POLL_WAIT_MS = 200


class Member:
    """A group member polling on its own task until stopped."""

    def __init__(self, client: AsyncClient, group: str, session_ms: int) -> None:
        self.consumer = AsyncGroupConsumer(client, group, topics=[TOPIC], session_timeout_ms=session_ms,
                                           wait_ms=POLL_WAIT_MS, max_records=10_000)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.consumer.poll()
            except RaftlogError as error:  # a moment without a leader: poll again, as an application would
                print(f"poll: {error}", file=sys.stderr)
                await asyncio.sleep(0.05)

    async def stop(self, leave: bool) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if leave:
            await self.consumer.close()
        else:  # killed: nothing more is sent
            await self.consumer._stop_heartbeats()  # as a process killed: its beats end too


def _settled(members: list[Member]) -> bool:
    held = [tp for m in members for tp in m.consumer.held]
    return len(held) == len(set(held)) == PARTITIONS and all(
        m.consumer.view.get("state") == "stable" for m in members)


async def _until_settled(members: list[Member], timeout_s: float = 120) -> float:
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while not _settled(members):
            await asyncio.sleep(0.005)
    return time.monotonic() - started


async def rebalances(servers: list[str], rounds: int, session_ms: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"join": [], "leave": [], "kill": []}
    clients = [AsyncClient(servers[i:] + servers[:i], backoff_s=0.01) for i in range(3)]
    try:
        for number in range(rounds):
            group = f"bench-{number}"
            members = [Member(clients[i % 3], group, session_ms) for i in range(3)]
            for member in members:
                await member.start()
            await _until_settled(members)
            newcomer = Member(clients[0], group, session_ms)
            started = time.monotonic()
            await newcomer.start()
            members.append(newcomer)
            await _until_settled(members)
            times["join"].append(time.monotonic() - started)
            leaving = members.pop(1)
            started = time.monotonic()
            await leaving.stop(leave=True)
            await _until_settled(members)
            times["leave"].append(time.monotonic() - started)
            killed = members.pop(0)
            started = time.monotonic()
            await killed.stop(leave=False)
            await _until_settled(members)
            times["kill"].append(time.monotonic() - started)
            for member in members:
                await member.stop(leave=True)
            print(f"round {number}: join {times['join'][-1]:.3f} s, leave {times['leave'][-1]:.3f} s, "
                  f"kill {times['kill'][-1]:.3f} s", flush=True)
    finally:
        for client in clients:
            await client.close()
    return times


async def produce(client: AsyncClient, records: int) -> None:
    per_partition = records // PARTITIONS
    value = b"v" * 100
    for partition in range(PARTITIONS):
        for first in range(0, per_partition, 5000):
            count = min(5000, per_partition - first)
            batch = encode_batch([Record(None, value, (), 0)] * count, first_timestamp_ms=int(time.time() * 1000))
            await client.produce_batch(TOPIC, partition, batch)


async def fetch_rates(servers: list[str], records: int, repeats: int) -> tuple[list[float], list[float]]:
    """Group fetch and plain read of the same records, alternated `repeats` times (the
    box is shared: alternating spreads its noise over both)."""
    group_rates, plain_rates = [], []
    async with AsyncClient(servers, backoff_s=0.01) as client:
        for number in range(repeats):
            member = AsyncGroupConsumer(client, f"bench-fetch-{number}", topics=[TOPIC],
                                        auto_offset_reset="earliest", wait_ms=0, max_records=10_000)
            await member.start()
            started, read = time.monotonic(), 0
            while read < records:
                read += len(await member.poll())
            group_rates.append(read / (time.monotonic() - started))
            await member.close()
            plain = AsyncConsumer(client, TOPIC, start="earliest", max_records=10_000, wait_ms=0)
            await plain.start()
            started, read = time.monotonic(), 0
            while read < records:
                read += len(await plain.poll())
            plain_rates.append(read / (time.monotonic() - started))
    return group_rates, plain_rates


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=3000)
    parser.add_argument("--records", type=int, default=240_000)
    parser.add_argument("--raft-port", type=int, default=19500)
    parser.add_argument("--http-port", type=int, default=19580)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="raftlog-group-client-"))
    cluster = LocalCluster(directory, 3, raft_port=args.raft_port, http_port=args.http_port)
    cluster.start()
    try:
        await asyncio.to_thread(cluster.wait_healthy, 60)
        servers = cluster.http_addresses
        async with AsyncClient(servers) as client:
            await client.create_topic(TOPIC, PARTITIONS, 3)
            await produce(client, args.records)
        times = await rebalances(servers, args.rounds, args.session_ms)
        group_rates, plain_rates = await fetch_rates(servers, args.records - args.records % PARTITIONS, args.rounds)
    finally:
        cluster.stop()
    for name, target in (("join", 1.0), ("leave", 1.0), ("kill", args.session_ms / 1000 + 1)):
        print(f"{name}: median {statistics.median(times[name]):.3f} s, max {max(times[name]):.3f} s "
              f"(target <= {target:.1f} s)")
    group_rate, plain_rate = statistics.median(group_rates), statistics.median(plain_rates)
    ratios = ", ".join(f"{g / p:.2f}" for g, p in zip(group_rates, plain_rates, strict=True))
    print(f"group fetch {group_rate:,.0f} records/s, plain read {plain_rate:,.0f} records/s (medians), "
          f"ratio {group_rate / plain_rate:.2f} (each pair: {ratios}; target >= 0.8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(uvloop.run(main()))
