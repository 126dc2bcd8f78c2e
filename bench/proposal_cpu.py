"""CPU per proposal, in one process: the entry cache and the coalesced peer writes.

Not a throughput bench: it measures CPU time (`time.process_time`) of the same work
done two ways in the same run, legs alternating, so the ratio holds on a loaded box
(docs/scale.md, "Proposal CPU", has the figures and the real bench to run on a quiet
one).

1. Entry cache (storage/entry_cache.py). Three nodes in one process, `--groups`
   groups led by node 1, each replica a real `SegmentStore` (files in a temporary
   directory, flush policy `none`: the disk is not what is measured). A round is one
   request spread over the groups: one proposal per group of `--records` records of
   100 B (bench/partitions.py's json-8 leg: 1,000 records over 8 partitions). The
   cores are driven synchronously (Ready -> append -> sync -> send -> advance), the
   followers' answers delivered `--lag` rounds late (8: the bench's window of 8
   requests in flight, each holding a proposal of every group), and after every round
   each store is told what it may release (`cache_release_index`, as the runtime
   does). Legs: "no cache" (budget 0: every read of an appended entry goes to its
   file); "main" (what 63fb217's storage/recent.py did: each log kept its newest
   entries up to 64 KiB, entries up to 64 KiB, never released); "cache" (the node's
   default budget, released as the runtime does).

2. Peer writes (multiraft/transport/peer_link.py). One link connected over loopback
   to a peer that reads and discards; a turn enqueues `--frames` frames of
   `--frame-bytes` (one append per group to that peer). Legs: each frame written by
   itself (the old fast path: `_write` per frame) against `enqueue` (one write per
   turn). The receiving side runs in this process too, so its reads count.

    .venv/bin/python bench/proposal_cpu.py [--rounds 300] [--groups 8] [--records 125] [--legs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.runtime.group_host import cache_release_index
from multiraft.transport.frames import FrameType
from multiraft.transport.handshake import accept_handshake
from multiraft.transport.transport import Transport
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Message, MessageType, Role
from raftlog.types import GroupId, NodeId
from storage.batch import Record, encode_batch
from storage.config import FlushMode, FlushPolicy, StoreConfig
from storage.entry_cache import ENTRY_CACHE_BYTES_DEFAULT, EntryCacheBudget
from storage.files import OsFiles
from storage.segments import SegmentStore
from storage.state_db import StateDatabase

NODES = (1, 2, 3)
SECRET = b"bench-proposal-cpu-secret-0123456789"


class Cluster:
    """`groups` three-replica groups over real segment stores; node 1 leads them all."""

    def __init__(self, root: str, groups: int, leg: str) -> None:
        self.db = StateDatabase(f"{root}/state")
        self.releases = leg == "cache"
        self.budgets = {node: EntryCacheBudget(0 if leg == "no cache" else ENTRY_CACHE_BYTES_DEFAULT)
                        for node in NODES}
        files = OsFiles()
        config = StoreConfig(flush=FlushPolicy(FlushMode.NONE))
        entries, hard_state = bootstrap_entries([NodeId(n) for n in NODES])
        self.cores: dict[tuple[int, int], RaftCore] = {}
        for group in range(1, groups + 1):
            for node in NODES:
                # main's per-log memory: 64 KiB, an entry up to the whole of it, its own budget.
                budget = EntryCacheBudget(64 * 1024, 64 * 1024) if leg == "main" else self.budgets[node]
                store = SegmentStore(GroupId(group * 10 + node), f"{root}/{group}/{node}", self.db, files,
                                     config, cache_budget=budget)
                store.append(entries)
                store.set_hard_state(hard_state)
                store.sync()
                core_config = Config(node_id=NodeId(node), inflight_messages_max=256, message_bytes_max=1 << 20)
                self.cores[(group, node)] = RaftCore(core_config, store, random.Random(node))
        self.late: list[list[tuple[int, Message]]] = [[]]  # followers' answers, per round
        self.applied = 0

    def pump(self, late_answers: bool) -> None:
        moved = True
        while moved:
            moved = False
            for (group, node), core in self.cores.items():
                while core.has_ready():
                    moved = True
                    self._handle(group, node, core, late_answers)

    def _handle(self, group: int, node: int, core: RaftCore, late_answers: bool) -> None:
        ready = core.ready()
        store = core.log.storage
        assert isinstance(store, SegmentStore)
        if ready.entries:
            store.append(ready.entries)
        if ready.hard_state is not None:
            store.set_hard_state(ready.hard_state)
        if ready.must_sync:
            store.sync()
        self.applied += len(ready.committed_entries)
        core.advance(ready)
        for message in ready.messages + ready.persisted_messages:
            if late_answers and message.type is MessageType.APPEND_RESPONSE:
                self.late[-1].append((group, message))
            else:
                self.cores[(group, message.target)].step(message)

    def deliver_late(self, lag: int) -> None:
        """The answers sent `lag` rounds ago or earlier arrive; a new round begins."""
        while len(self.late) > lag:
            for group, message in self.late.pop(0):
                self.cores[(group, message.target)].step(message)
        self.late.append([])

    def release(self) -> None:
        if not self.releases:
            return
        for core in self.cores.values():
            store = core.log.storage
            assert isinstance(store, SegmentStore)
            store.release_cached(cache_release_index(core))

    def elect(self, groups: int) -> None:
        self.pump(False)
        for group in range(1, groups + 1):
            core = self.cores[(group, 1)]
            while core.role is not Role.LEADER:
                core.tick()
                self.pump(False)

    def close(self) -> None:
        for core in self.cores.values():
            store = core.log.storage
            assert isinstance(store, SegmentStore)
            store.close()
        self.db.close()


def run_cache_leg(groups: int, rounds: int, records: int, lag: int, leg: str) -> tuple[float, int, int]:
    """CPU seconds of `rounds` rounds, entries served from memory, node 1's cached bytes after."""
    payload = encode_batch([Record(key=None, value=b"v" * 100)] * records, first_timestamp_ms=1)
    with tempfile.TemporaryDirectory(prefix="proposal-cpu-") as root:
        cluster = Cluster(root, groups, leg)
        cluster.elect(groups)
        leaders = [cluster.cores[(group, 1)] for group in range(1, groups + 1)]
        began = time.process_time()
        for _ in range(rounds):
            for leader in leaders:
                leader.propose([payload])
            cluster.pump(True)
            cluster.deliver_late(lag)
            cluster.pump(True)
            cluster.release()
        for _ in range(lag + 1):
            cluster.deliver_late(0)
            cluster.pump(False)
        cluster.release()
        spent = time.process_time() - began
        stores = [core.log.storage for core in cluster.cores.values()]
        budgets: list[EntryCacheBudget] = []
        for store in stores:
            if not any(store._cache._budget is known for known in budgets):  # type: ignore[attr-defined]
                budgets.append(store._cache._budget)  # type: ignore[attr-defined]
        served = sum(budget.entries_read for budget in budgets)
        left = sum(store.cached_bytes for (_, node), store in zip(cluster.cores, stores, strict=True) if node == 1)  # type: ignore[attr-defined]
        cluster.close()
    return spent, served, left


async def _discard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await accept_handshake(reader, writer, secret=SECRET, node_id=2)
    while await reader.read(1 << 20):
        pass


async def run_write_legs(turns: int, frames: int, frame_bytes: int, legs: int) -> list[tuple[str, float]]:
    server = await asyncio.start_server(_discard, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = Transport(1, "127.0.0.1", 0, {2: ("127.0.0.1", port)}, SECRET, lambda *_: None)
    await sender.start()
    results: list[tuple[str, float]] = []
    try:
        while not sender.peer_connected(2):
            await asyncio.sleep(0.01)
        link = sender._links[2]
        body = b"a" * frame_bytes
        for _ in range(legs):
            for name in ("frame per write", "turn per write"):
                began = time.process_time()
                for _ in range(turns):
                    for group in range(frames):
                        if name == "frame per write":
                            link._write(link._writer, [(FrameType.RAFT_MESSAGE, group, body)])
                        else:
                            link.enqueue(FrameType.RAFT_MESSAGE, group, body)
                    await asyncio.sleep(0)  # the turn ends
                    while link._writer.transport.get_write_buffer_size():
                        await asyncio.sleep(0)
                results.append((name, time.process_time() - began))
    finally:
        await sender.stop()
        server.close()
        await server.wait_closed()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300, help="requests, each one proposal per group")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--records", type=int, default=125, help="100 B records per proposal")
    parser.add_argument("--lag", type=int, default=8, help="rounds before a follower's answer arrives")
    parser.add_argument("--legs", type=int, default=3, help="times each leg runs, alternating")
    parser.add_argument("--turns", type=int, default=5000, help="loop turns of the write legs")
    parser.add_argument("--frames", type=int, default=8, help="frames per turn to the one peer")
    parser.add_argument("--frame-bytes", type=int, default=200, help="bytes per frame")
    args = parser.parse_args()

    proposals = args.rounds * args.groups
    print(f"entry cache: {args.groups} groups x 3 replicas, {args.rounds} rounds, "
          f"{proposals:,} proposals of {args.records} x 100 B, answers {args.lag} rounds late")
    spent: dict[str, list[float]] = {"no cache": [], "main": [], "cache": []}
    for _ in range(args.legs):
        for name in spent:
            seconds, served, left = run_cache_leg(args.groups, args.rounds, args.records, args.lag, name)
            spent[name].append(seconds)
            print(f"  {name:9} {seconds / proposals * 1000:6.3f} CPU s per 1,000 proposals "
                  f"(entries served from memory {served:,}; node 1 holds {left:,} B after)")
    best = {name: min(seconds) / proposals * 1000 for name, seconds in spent.items()}
    print(f"  best of each, CPU s per 1,000 proposals: no cache {best['no cache']:.3f}, main {best['main']:.3f}, "
          f"cache {best['cache']:.3f}; cache / main {best['cache'] / best['main']:.2f}, "
          f"cache / no cache {best['cache'] / best['no cache']:.2f}")

    print(f"peer writes: {args.turns:,} turns of {args.frames} frames of {args.frame_bytes} B to one peer")
    results = asyncio.run(run_write_legs(args.turns, args.frames, args.frame_bytes, args.legs))
    per_turn: dict[str, list[float]] = {}
    for name, seconds in results:
        per_turn.setdefault(name, []).append(seconds)
        print(f"  {name:16} {seconds / args.turns * 1e6:7.1f} CPU us per turn")
    before, after = min(per_turn["frame per write"]), min(per_turn["turn per write"])
    print(f"  best of each: {before / args.turns * 1e6:.1f} -> {after / args.turns * 1e6:.1f} CPU us per turn, "
          f"ratio {after / before:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
