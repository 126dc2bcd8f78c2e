"""Sequential single-record produce latency, and what each process spends on one write.

bench/node.py prints the p50/p99 of this workload among its other figures; this
one is for working on the latency: a fresh 3-node cluster (RF 3, fsync on), one
partition, `--count` sequential single-record produces to its leader, then per
process (this client, the leader, each follower) the CPU per write split into
user and system time, and the event loop thread's context switches per write
(voluntary: sleeps, such as waiting for the network or an fsync; involuntary:
preemptions).

Why these: on this 2-core machine four busy processes share the CPU, and the
latency follows the CPU on the critical path (client -> leader -> the faster
follower -> leader -> client) plus the time a woken process waits for a core.
To compare two versions, run this script from each checkout in turn, several
times: this machine's speed varies by a third within minutes.

    .venv/bin/python bench/sequential.py [--count 3000] [--warmup 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.clients.http import AsyncClient
from multiraft.launcher import LocalCluster
from storage.batch import Record, encode_batch

RAFT_PORT, HTTP_PORT = 17300, 18300  # apart from bench/node.py's, so both may run in turn


def process_times(pid: int) -> tuple[float, float, int, int]:
    """(user s, system s) of the whole process; (voluntary, involuntary) context switches of
    its main thread, the one running the event loop."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    status = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if "ctxt_switches" in line)
    return (int(fields[11]) / ticks, int(fields[12]) / ticks,
            int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))


def own_times() -> tuple[float, float, int, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw


async def run(count: int, warmup: int) -> None:
    record = encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=int(time.time() * 1000))
    with tempfile.TemporaryDirectory(prefix="raftlog-sequential-") as directory:
        cluster = LocalCluster(Path(directory), 3, raft_port=RAFT_PORT, http_port=HTTP_PORT)
        cluster.start()
        try:
            cluster.wait_healthy(60)
            async with AsyncClient(cluster.http_addresses, timeout_s=60) as client:
                await client.create_topic("sequential", partitions=1, replication_factor=3)
                for _ in range(200):
                    leader = (await client.describe_topic("sequential"))["partitions"][0].get("leader")
                    if leader:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise RuntimeError("no partition leader")
            leader_node = cluster.nodes[int(leader) - 1]
            pids = {node.node_id: int(node.pid_file.read_text()) for node in cluster.nodes}
            async with AsyncClient([leader_node.http_addr], timeout_s=60) as client:
                for _ in range(warmup):
                    await client.produce_batch("sequential", 0, record)
                before = {node: process_times(pid) for node, pid in pids.items()}
                mine = own_times()
                samples = []
                for _ in range(count):
                    began = time.perf_counter()
                    await client.produce_batch("sequential", 0, record)
                    samples.append((time.perf_counter() - began) * 1000)
                after = {node: process_times(pid) for node, pid in pids.items()}
                mine = tuple(b - a for a, b in zip(mine, own_times(), strict=True))
        finally:
            cluster.stop()
    samples.sort()

    def at(fraction: float) -> float:
        return samples[min(len(samples) - 1, int(len(samples) * fraction))]

    print(f"sequential single-record produce, {count} writes: p50 {statistics.median(samples):.2f} ms, "
          f"p90 {at(0.9):.2f} ms, p99 {at(0.99):.2f} ms, max {samples[-1]:.2f} ms")
    rows = [("client", mine)]
    for node in sorted(pids):
        role = "leader" if node == leader_node.node_id else "follower"
        rows.append((f"node {node} ({role})", tuple(b - a for a, b in zip(before[node], after[node], strict=True))))
    print("per write:            CPU user   CPU sys   switches voluntary / involuntary")
    for name, (user, system, voluntary, involuntary) in rows:
        print(f"  {name:18s} {user / count * 1000:7.2f} ms {system / count * 1000:7.2f} ms"
              f"   {voluntary / count:8.2f} / {involuntary / count:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    if args.count < 100:
        parser.error("--count: at least 100, or the p99 is one sample")
    uvloop.run(run(args.count, args.warmup))  # the client on uvloop, like the nodes
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
