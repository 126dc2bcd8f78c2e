"""Pure Raft core cost: committed entries/s of a 3-replica in-memory cluster in one process.

What it measures: three `RaftCore`s driven synchronously (ready → write to
`MemoryStorage` → deliver → advance), the leader proposing batches, until
`--entries` entries are applied on all three replicas. No sockets, no disk: this
is the ceiling the core puts on produce throughput, which must stay far above
what the network and fsync allow (target: 50,000 entries/s).

Baseline measured in the same run: the same entries created and appended to
three `MemoryStorage`s with no consensus at all, so the ratio is the core's
overhead over bare bookkeeping. Also prints simulated events/s of the seeded
simulator (the cost of `make sim`).

    .venv/bin/python bench/raft_core.py [--entries 200000] [--batch 100] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, EntryKind, Role
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage
from tests.sim.simulator import run_seed


def make_cluster(n: int) -> dict[int, RaftCore]:
    entries, hard_state = bootstrap_entries([NodeId(i) for i in range(1, n + 1)])
    cores = {}
    for node in range(1, n + 1):
        storage = MemoryStorage()
        storage.append(entries)
        storage.set_hard_state(hard_state)
        storage.sync()
        config = Config(node_id=NodeId(node), inflight_messages_max=64, message_bytes_max=4 << 20)
        cores[node] = RaftCore(config, storage, random.Random(node))
    return cores


def pump(cores: dict[int, RaftCore], applied: dict[int, int]) -> bool:
    moved = False
    for node, core in cores.items():
        while core.has_ready():
            moved = True
            ready = core.ready()
            storage = core.log.storage
            storage.append(ready.entries)  # type: ignore[attr-defined]
            if ready.hard_state is not None:
                storage.set_hard_state(ready.hard_state)  # type: ignore[attr-defined]
            if ready.must_sync:
                storage.sync()  # type: ignore[attr-defined]
            applied[node] += len(ready.committed_entries)
            core.advance(ready)
            for message in ready.messages + ready.persisted_messages:
                cores[message.target].step(message)
    return moved


def run_core(entries_total: int, batch: int, payload_bytes: int) -> float:
    cores = make_cluster(3)
    applied = dict.fromkeys(cores, 0)
    pump(cores, applied)
    leader = cores[1]
    while leader.role is not Role.LEADER:
        leader.tick()
        pump(cores, applied)
    while pump(cores, applied):
        pass
    base = dict(applied)
    payloads = [b"x" * payload_bytes] * batch
    began = time.perf_counter()
    proposed = 0
    while min(applied[n] - base[n] for n in cores) < entries_total:
        if proposed < entries_total:
            leader.propose(payloads)
            proposed += batch
        pump(cores, applied)
    return entries_total / (time.perf_counter() - began)


def run_baseline(entries_total: int, batch: int, payload_bytes: int) -> float:
    storages = [MemoryStorage() for _ in range(3)]
    payload = b"x" * payload_bytes
    began = time.perf_counter()
    index = 1
    while index <= entries_total:
        entries = [Entry(Index(index + i), Term(1), EntryKind.DATA, payload) for i in range(batch)]
        for storage in storages:
            storage.append(entries)
        index += batch
    return entries_total / (time.perf_counter() - began)


def run_sim(seeds: int) -> float:
    began = time.perf_counter()
    events = sum(run_seed(seed).events for seed in range(seeds))
    return events / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="entries per proposal call (group commit)")
    parser.add_argument("--sim-seeds", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of the 1 KiB run")
    args = parser.parse_args()
    target = 50_000
    print(f"raft core bench: 3 replicas in one process, {args.entries:,} entries, batches of {args.batch}")
    for payload_bytes in (1024, 100):
        # Best of three for both, so a noisy neighbour on this shared box skews neither.
        rate = max(run_core(args.entries, args.batch, payload_bytes) for _ in range(3))
        baseline = max(run_baseline(args.entries, args.batch, payload_bytes) for _ in range(3))
        print(
            f"  {payload_bytes:>5} B entries: {rate:>10,.0f} committed entries/s "
            f"(target {target:,}: {rate / target:.2f}x); bare append baseline {baseline:,.0f}/s, "
            f"core/baseline {rate / baseline:.2f}"
        )
    for batch in (1, 10):
        rate = run_core(max(args.entries // 10, 1000), batch, 100)
        print(f"  100 B entries, batches of {batch:>3}: {rate:>10,.0f} committed entries/s")
    print(f"  simulator: {run_sim(args.sim_seeds):,.0f} simulated events/s ({args.sim_seeds} seeds)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_core, args.entries, args.batch, 1024)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
