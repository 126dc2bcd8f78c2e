"""Two versions side by side: sequential single-record produce latency and CPU per
write of checkout A against checkout B (or one checkout on two interpreters).

This machine's speed changes by a third within minutes, so two runs of
bench/sequential.py, one per version, cannot show a 3 % difference. Here both
versions run at once: one 3-node cluster each (RF 3, fsync on, one partition),
and one client alternates single-record produces between them, A then B, then B
then A, so every moment of the machine falls on both alike. Absolute figures
are higher than a lone cluster's (seven processes share two cores); the ratios
are what this is for. Run it twice with A and B swapped before believing a
small difference.

    .venv/bin/python bench/interleaved.py --a CHECKOUT [--b CHECKOUT]
        [--python-a PYTHON] [--python-b PYTHON] [--count 3000] [--warmup 200]

A checkout is a directory holding raftlog's packages (a `git worktree add` of
another commit, say); B defaults to this one, each interpreter to this one's.
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

from bench import floor
from bench.sequential import process_times
from multiraft.cli.launcher import LocalCluster, LocalNode
from multiraft.client.http import AsyncClient
from storage.batch import Record, encode_batch

PORTS = ((17400, 18400), (17500, 18500))  # apart from the other benches'


async def partition_leader(cluster: LocalCluster) -> LocalNode:
    async with AsyncClient(cluster.http_addresses, timeout_s=60) as client:
        await client.create_topic("sequential", partitions=1, replication_factor=3)
        for _ in range(200):
            leader = (await client.describe_topic("sequential"))["partitions"][0].get("leader")
            if leader:
                return cluster.nodes[int(leader) - 1]
            await asyncio.sleep(0.05)
    raise RuntimeError("no partition leader")


async def run(versions: list[tuple[Path, str]], count: int, warmup: int) -> None:
    record = encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=int(time.time() * 1000))
    with tempfile.TemporaryDirectory(prefix="raftlog-interleaved-") as directory:
        clusters = [
            LocalCluster(Path(directory) / name, 3, raft_port=raft, http_port=http, python=python, code_root=root)
            for name, (root, python), (raft, http) in zip("AB", versions, PORTS, strict=True)
        ]
        try:
            for cluster in clusters:
                cluster.start()
            for cluster in clusters:
                cluster.wait_healthy(60)
            leaders = [await partition_leader(cluster) for cluster in clusters]
            pids = [[int(node.pid_file.read_text()) for node in cluster.nodes] for cluster in clusters]
            clients = [AsyncClient([leader.http_addr], timeout_s=60) for leader in leaders]
            try:
                for client in clients:
                    await client.__aenter__()
                for _ in range(warmup):
                    for client in clients:
                        await client.produce_batch("sequential", 0, record)
                before = [[process_times(pid) for pid in each] for each in pids]
                samples: list[list[float]] = [[], []]
                for i in range(count):
                    for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                        began = time.perf_counter()
                        await clients[k].produce_batch("sequential", 0, record)
                        samples[k].append((time.perf_counter() - began) * 1000)
                after = [[process_times(pid) for pid in each] for each in pids]
            finally:
                for client in clients:
                    await client.__aexit__(None, None, None)
        finally:
            for cluster in clusters:
                cluster.stop()
    cpu = []
    for k, name in enumerate("AB"):
        root, python = versions[k]
        per_node = [((a[0] + a[1]) - (b[0] + b[1])) / count * 1000 for a, b in zip(after[k], before[k], strict=True)]
        cpu.append(sum(per_node))
        nodes = ", ".join(f"{'leader' if j + 1 == leaders[k].node_id else 'follower'} {ms:.2f}"
                          for j, ms in enumerate(per_node))
        print(f"{name} {root} ({python}):")
        print(f"  {floor.summary(samples[k])}")
        print(f"  CPU per write (ms, user + system): {nodes}; nodes together {cpu[k]:.2f}")
    ordered = [sorted(each) for each in samples]
    print(f"B / A: p50 {statistics.median(ordered[1]) / statistics.median(ordered[0]):.3f}, "
          f"p99 {floor.percentile(ordered[1], 0.99) / floor.percentile(ordered[0], 0.99):.3f}, "
          f"CPU per write {cpu[1] / cpu[0]:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parents[1]
    parser.add_argument("--a", type=Path, required=True, help="checkout A")
    parser.add_argument("--b", type=Path, default=here, help="checkout B (default: this one)")
    parser.add_argument("--python-a", default=sys.executable)
    parser.add_argument("--python-b", default=sys.executable)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    if args.count < 100:
        parser.error("--count: at least 100, or the p99 is one sample")
    for option, root in (("--a", args.a), ("--b", args.b)):
        # `python -m multiraft.cli` runs either layout: the flat one (cli.py) or the rooms (cli/).
        cli = root / "multiraft"
        if not ((cli / "cli.py").is_file() or (cli / "cli" / "__main__.py").is_file()):
            parser.error(f"{option}: {root} holds no raftlog checkout (no multiraft/cli.py or multiraft/cli/)")
    versions = [(args.a.resolve(), args.python_a), (args.b.resolve(), args.python_b)]
    uvloop.run(run(versions, args.count, args.warmup))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
