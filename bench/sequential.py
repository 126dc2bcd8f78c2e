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

`--floor` also runs the same shape with nothing of raftlog in it (bench/floor.py),
one write there after each write here (in alternating order, so both meet the
same moments of this machine), and prints its latency and raftlog's ratio to it:
the floor's own p99 says how much tail the machine adds at that moment.

`--legs` loads bench/trace_legs/ into the nodes (marks around a few functions,
about a microsecond each) and prints, per process, the median wall and CPU time
of each leg of a write (bench/legs.py): where the time goes, not just how much.

    .venv/bin/python bench/sequential.py [--count 3000] [--warmup 200] [--floor] [--legs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import floor, legs
from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient
from storage.batch import Record, encode_batch

TRACE_LEGS = Path(__file__).resolve().parent / "trace_legs"
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


async def run(count: int, warmup: int, with_floor: bool, with_legs: bool) -> None:
    record = encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=int(time.time() * 1000))
    with tempfile.TemporaryDirectory(prefix="raftlog-sequential-") as directory:
        marks = Path(directory) / "legs"
        if with_legs:  # the nodes inherit this process's environment
            marks.mkdir()
            os.environ["RAFTLOG_TRACE_LEGS"] = str(marks)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRACE_LEGS), os.environ.get("PYTHONPATH")]))
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
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(AsyncClient([leader_node.http_addr], timeout_s=60))
                clients = [(client, "sequential")]
                if with_floor:
                    clients.append(((await stack.enter_async_context(floor.pipeline())).client, "floor"))
                for _ in range(warmup):
                    for each, topic in clients:
                        await each.produce_batch(topic, 0, record)
                before = {node: process_times(pid) for node, pid in pids.items()}
                mine = own_times()
                runs: list[list[float]] = [[] for _ in clients]
                for i in range(count):
                    # Interleaved, in alternating order: both pipelines meet the same moments of this box.
                    for k in (range(len(clients)) if i % 2 == 0 else reversed(range(len(clients)))):
                        each, topic = clients[k]
                        began = time.perf_counter()
                        await each.produce_batch(topic, 0, record)
                        runs[k].append((time.perf_counter() - began) * 1000)
                after = {node: process_times(pid) for node, pid in pids.items()}
                mine = tuple(b - a for a, b in zip(mine, own_times(), strict=True))
        finally:
            cluster.stop()
        leg_lines = legs.table(marks, pids, leader_node.node_id) if with_legs else []
    samples = sorted(runs[0])
    print(f"sequential single-record produce, {count} writes: {floor.summary(samples)}")
    rows = [] if with_floor else [("client", mine)]  # with the floor, this process drives both
    for node in sorted(pids):
        role = "leader" if node == leader_node.node_id else "follower"
        rows.append((f"node {node} ({role})", tuple(b - a for a, b in zip(before[node], after[node], strict=True))))
    print("per write:            CPU user   CPU sys   switches voluntary / involuntary")
    for name, (user, system, voluntary, involuntary) in rows:
        print(f"  {name:18s} {user / count * 1000:7.2f} ms {system / count * 1000:7.2f} ms"
              f"   {voluntary / count:8.2f} / {involuntary / count:.2f}")
    if with_floor:
        lowest = sorted(runs[1])
        print("  (node CPU includes their idle cost while the floor's writes ran)")
        print(f"floor (same shape, nothing of raftlog: bench/floor.py), interleaved: {floor.summary(lowest)}")
        print(f"raftlog / floor: p50 {statistics.median(samples) / statistics.median(lowest):.1f}x, "
              f"p99 {floor.percentile(samples, 0.99) / floor.percentile(lowest, 0.99):.1f}x")
    for line in leg_lines:
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--floor", action="store_true", help="also run bench/floor.py's pipeline and print ratios")
    parser.add_argument("--legs", action="store_true", help="mark the nodes and print where each write's time goes")
    args = parser.parse_args()
    if args.count < 100:
        parser.error("--count: at least 100, or the p99 is one sample")
    uvloop.run(run(args.count, args.warmup, args.floor, args.legs))  # the client on uvloop, like the nodes
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
