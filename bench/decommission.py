"""Decommission under a producer (issue 25): how long it takes, and what it costs the
producers beside it.

A real 4-node cluster: three voters from the local launcher (127.0.0.1-3, ports
19600/19680 unless told otherwise) and a fourth joined as a learner. Topic `bulk`
(`--partitions`, RF 3) is filled with `--preload-mb` MiB per partition (binary
batches of 1 KiB records), so each move copies real data; topic `probe` (one
partition, RF 3) takes one record at a time, back to back, from one client
(acks=quorum): its latencies are the producers' experience.

Phases, each printed with the probe's count, p50, p99 and max latency:
- `before`: `--before` seconds, nothing else happening;
- `during`: from `POST /v1/admin/nodes/2/decommission` until its status is `done`
  (bounded by `--timeout`);
and then the decommission's wall time, the copies moved (partitions that had a
replica on node 2) and the bytes they held, and the ratio of p99 during / before
(issue 25's goal: at most 2, with the throttle on). With the throttle on it prints
the bytes node 2 held, the time the throttle implies for them (the formula is in
bench/decommission_timeline.py: the busiest sending node's bytes over the rate), the
measured time, their ratio (issue 25's goal: within 20 %), and where the time went
(drain, copies, leave) from the nodes' logs. Moves are bounded by count (at
most 8 partitions at once, multiraft/node/decommission.py) and by bytes: the move
throttle (multiraft/node/move_throttle.py), the nodes' default unless `--rate` sets
the cluster setting (0: no limit). The box is shared by the four nodes and the
client: read the ratio before the absolute figures.

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/decommission.py [--partitions 8]
        [--preload-mb 16] [--before 15] [--timeout 600] [--rate BYTES_PER_S] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decommission_timeline import breakdown, read_events, spread_implied_s
from multiraft.cli.launcher import LocalCluster
from storage.batch import Record, encode_batch

BATCH = "application/vnd.raftlog.batch"
LEAVING = 2


async def _call(session: aiohttp.ClientSession, server: str, method: str, path: str, **kwargs) -> tuple[int, dict]:
    async with asyncio.timeout(30), session.request(method, f"http://{server}{path}", **kwargs) as answer:
        return answer.status, await answer.json()


async def _until(probe, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def _led(session: aiohttp.ClientSession, server: str, topic: str, partitions: int) -> bool:
    status, body = await _call(session, server, "GET", f"/v1/topics/{topic}")
    return status == 200 and len(body["partitions"]) == partitions and all(p["leader"] for p in body["partitions"])


async def _preload(session: aiohttp.ClientSession, servers: list[str], partitions: int, mib: int) -> int:
    record = Record(None, b"x" * 1024)
    batch = encode_batch([record] * 1024, first_timestamp_ms=1)  # 1 MiB of values per request
    written = 0
    for partition in range(partitions):
        for _ in range(mib):
            for _attempt in range(50):
                status, _ = await _call(session, servers[partition % 3], "POST",
                                        f"/v1/topics/bulk/partitions/{partition}/records", data=batch,
                                        headers={"Content-Type": BATCH})
                if status == 200:
                    written += len(batch)
                    break
                await asyncio.sleep(0.1)
    return written


class Probe:
    def __init__(self, session: aiohttp.ClientSession, server: str) -> None:
        self.session, self.server = session, server
        self.latencies: list[float] = []
        self.failed = 0
        self.stopping = False

    async def run(self) -> None:
        batch = encode_batch([Record(None, b"p" * 100)], first_timestamp_ms=1)
        while not self.stopping:
            began = time.perf_counter()
            status, _ = await _call(self.session, self.server, "POST", "/v1/topics/probe/partitions/0/records",
                                    data=batch, headers={"Content-Type": BATCH})
            if status == 200:
                self.latencies.append(time.perf_counter() - began)
            else:
                self.failed += 1
                await asyncio.sleep(0.01)

    def take(self) -> tuple[list[float], int]:
        taken, failed = self.latencies, self.failed
        self.latencies, self.failed = [], 0
        return taken, failed


def _line(phase: str, latencies: list[float], failed: int) -> str:
    if not latencies:
        return f"{phase:7s} no acknowledged write ({failed} refused)"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{phase:7s} {len(ordered):6d} writes, {failed} refused; p50 {statistics.median(ordered) * 1000:6.2f} ms, "
            f"p99 {p99 * 1000:6.2f} ms, max {ordered[-1] * 1000:7.2f} ms")


def _held(node_directory: Path) -> dict[int, int]:
    """Bytes of segment files per partition group the node keeps (the metadata group's
    left out): what its copies move."""
    held = {}
    for group in (node_directory / "groups").iterdir():
        if group.name.isdigit() and int(group.name) != 0:
            held[int(group.name)] = sum(f.stat().st_size for f in group.glob("*.seg"))
    return held


async def _sent_bytes(session: aiohttp.ClientSession, servers: list[str]) -> dict[str, float]:
    sent = {}
    for server in servers:
        async with session.get(f"http://{server}/metrics") as answer:
            text = await answer.text()
        found = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("raftlog_move_throttle")}
        sent[server] = found.get("raftlog_move_throttle_sent_bytes_total", 0.0)
        print(f"  {server}: throttle sent {sent[server] / 2**20:.0f} MiB, "
              f"dropped {found.get('raftlog_move_throttle_dropped_total', 0):.0f}, "
              f"waiting {found.get('raftlog_move_throttle_queued', 0):.0f}")
    return sent


def _versus_throttle(held: dict[int, int], sent: dict[str, float], rate: int, took: float, staying: int) -> None:
    """The measured time against the throttle's (bench/decommission_timeline.py: the
    busiest sending node's bytes over the rate)."""
    total = sum(held.values())
    implied = spread_implied_s(list(held.values()), staying, rate)
    as_sent = max(sent.values()) / rate
    print(f"node {LEAVING} held {total / 2**20:.0f} MiB in {len(held)} partitions "
          f"({', '.join(f'{b / 2**20:.0f}' for b in sorted(held.values(), reverse=True))} MiB)")
    print(f"implied by the throttle: {implied:.2f} s (copies dealt over {staying} sending nodes, "
          f"max over senders of their bytes / {rate / 2**20:.0f} MiB/s); as the nodes' throttles "
          f"metered them: {as_sent:.2f} s (busiest sender {max(sent.values()) / 2**20:.0f} MiB)")
    print(f"measured {took:.2f} s: ratio {took / implied:.2f} (goal 0.8-1.2); {took / as_sent:.2f} to the "
          "metered bytes")


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def run(args: argparse.Namespace, cluster: LocalCluster) -> None:
    servers = cluster.http_addresses
    async with aiohttp.ClientSession() as session:
        async def four_alive() -> bool:
            _, view = await _call(session, servers[0], "GET", "/v1/cluster")
            return sum(n["status"] == "alive" for n in view["nodes"]) == 4

        await _until(four_alive, "four live nodes", 60)
        for name, count in (("bulk", args.partitions), ("probe", 1)):
            status, body = await _call(session, servers[0], "POST", "/v1/topics",
                                       json={"name": name, "partitions": count, "replication_factor": 3})
            assert status == 201, body
            await _until(lambda name=name, count=count: _led(session, servers[0], name, count), f"{name} led", 60)
        began = time.monotonic()
        written = await _preload(session, servers, args.partitions, args.preload_mb)
        print(f"preload: {written / 2**20:.0f} MiB into {args.partitions} partitions in "
              f"{time.monotonic() - began:.1f} s")
        if args.rate is not None:
            status, answer = await _call(session, servers[0], "PATCH", "/v1/admin/config",
                                         json={"replica_move_bytes_per_s": args.rate})
            assert status == 200, answer
        _, settings = await _call(session, servers[0], "GET", "/v1/admin/config")
        rate = settings["replica_move_bytes_per_s"]["value"]
        print(f"move throttle: {rate / 2**20:.1f} MiB/s per node" if rate else "move throttle: none")
        _, described = await _call(session, servers[0], "GET", "/v1/topics/bulk")
        moving = sum(LEAVING in p["replicas"] for p in described["partitions"])
        _, probe_topic = await _call(session, servers[0], "GET", "/v1/topics/probe")
        probe = Probe(session, servers[0] if LEAVING != 1 else servers[2])
        task = asyncio.create_task(probe.run())
        try:
            await asyncio.sleep(args.before)
            before, refused_before = probe.take()
            print(_line("before", before, refused_before))
            held = _held(cluster.directory / f"node{LEAVING}")
            began, began_wall = time.monotonic(), time.time()
            status, answer = await _call(session, servers[2], "POST", f"/v1/admin/nodes/{LEAVING}/decommission")
            assert status == 200, answer
            stages = []
            while True:
                _, answer = await _call(session, servers[2], "GET", f"/v1/admin/nodes/{LEAVING}/decommission")
                if not stages or stages[-1] != answer["stage"]:
                    stages.append(answer["stage"])
                    print(f"  {time.monotonic() - began:6.1f} s  {answer['stage']}: {answer['replicas']} replicas "
                          f"left, metadata {answer['metadata_member']}")
                if answer["stage"] == "done" or time.monotonic() - began > args.timeout:
                    break
                await asyncio.sleep(0.1)  # the end is measured to this much
            took = time.monotonic() - began
            during, refused_during = probe.take()
            print(_line("during", during, refused_during))
        finally:
            probe.stopping = True
            await task
        moved = moving + (LEAVING in probe_topic["partitions"][0]["replicas"])
        mib = moving * args.preload_mb
        print(f"decommission: {'done' if stages[-1] == 'done' else 'NOT done'} in {took:.1f} s; {moved} copies "
              f"moved ({mib} MiB of bulk, {mib / took:.1f} MiB/s)")
        print(f"ratio p99 during / before: {_p99(during) / _p99(before):.2f} (goal <= 2)")
        sent = await _sent_bytes(session, servers)
        if rate:
            _versus_throttle(held, sent, rate, took, len(servers) - 1)
        for line in breakdown(read_events(cluster.directory, began_wall - 1), began_wall, began_wall + took,
                              LEAVING):
            print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--preload-mb", type=int, default=16, help="MiB written into each partition first")
    parser.add_argument("--before", type=float, default=15.0, help="seconds of baseline probe writes")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting for the decommission")
    parser.add_argument("--rate", type=int, help="set the move throttle, bytes/s (0: no limit)")
    parser.add_argument("--raft-port", type=int, default=19600)
    parser.add_argument("--http-port", type=int, default=19680)
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs)")
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="bench-decommission-"))
    cluster = LocalCluster(directory, 3, raft_port=args.raft_port, http_port=args.http_port)
    try:
        cluster.start()
        cluster.wait_healthy(60)
        cluster.add_joiner()
        cluster.wait_healthy(60, nodes=[4])
        asyncio.run(run(args, cluster))
    finally:
        cluster.stop()
        if args.keep is None:  # a run leaves gigabytes: kept only when asked (--keep)
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
