"""Goal: a mirror incarnation that keeps its identical prefix elects safely whoever kept it.

Three Raft cores of one new incarnation, on memory storage, as the hosts leave them: node
1 kept the old group's entries 4..9 up to a cut of term T (as `far_install.replace_log`
installs them: hard state term T, commit at the first start point 3); nodes 2 and 3 kept
nothing and start as `bootstrap_mirror` writes a new replica, from the catalog's word
(`mirror_start`). The core tells entries apart by (index, term) only, so the replicas that
kept nothing must start at term T as well (multiraft/node/mirror_bootstrap.py):

- T == 2 (no leader change in the old group): at term 1 node 2 would win term 2 and append
  its entries at 4.. with term 2, which node 1 would take for its own kept ones: two
  different committed logs.
- T == 5, node 1 still building while 2 and 3 elect and commit: at term 1 they would
  commit at term 2, and node 1, joining, would win a later term with its higher last
  term without their committed entries (and its appends then livelock against them).
"""

from __future__ import annotations

import random

import pytest

from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import RegisterNode
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    ResyncMirrorPartition,
)
from multiraft.node.mirror_bootstrap import bootstrap_mirror, first_start, mirror_start
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, EntryKind, HardState, Membership, Role, Snapshot, SnapshotMeta
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage

VOTERS = (NodeId(1), NodeId(2), NodeId(3))
LINK = CreateMirrorLink(name="dr", sources=("127.0.0.1:9000",), pattern="orders*")
MIRROR = CreateMirrorTopic(name="orders", link="dr", replication_factor=3, config={},
                           assignments=(VOTERS,), start_offsets=(0,))
STEPS_MAX = 2000  # Ready rounds of one pump; a livelock runs past it


class _MirrorMemory(MemoryStorage):
    """`bootstrap_mirror` hands a SegmentStore the start point's next offset too."""

    def apply_snapshot(self, snapshot: Snapshot, next_offset: object = None) -> None:
        super().apply_snapshot(snapshot)


def _resynced(prefix_term: int) -> Catalog:
    """The catalog after a resync that keeps entries up to 9 (of `prefix_term`)."""
    catalog = Catalog()
    commands = [RegisterNode(node_id=n, raft_addr=f"h{n}:1", http_addr=f"h{n}:2") for n in VOTERS]
    for index, command in enumerate([*commands, LINK, MIRROR], start=1):
        assert catalog.apply(Index(index), command).ok
    old = catalog.topic("orders").partitions[0]
    resync = ResyncMirrorPartition(name="orders", partition=0, group_id=old.group_id, start_offset=0,
                                   prefix_index=9, prefix_term=prefix_term, prefix_offset=60, prefix_voters=VOTERS)
    assert catalog.apply(Index(10), resync).ok
    assert catalog.topic("orders").partitions[0].prefix[2] == prefix_term
    return catalog


def _cores(kept_terms: list[int]) -> dict[NodeId, RaftCore]:
    catalog = _resynced(max(kept_terms))
    start = mirror_start(catalog.topic("orders"), 0)
    assert start is not None
    cores = {}
    for node in VOTERS:
        store = _MirrorMemory()
        if node == 1:  # kept the prefix: the first start point, the kept entries, the cut's term
            index, term = first_start(VOTERS)
            store.apply_snapshot(Snapshot(SnapshotMeta(index, term, Membership(voters=frozenset(VOTERS)))))
            store.append([Entry(Index(4 + i), Term(t), EntryKind.DATA, b"old-%d" % (4 + i))
                          for i, t in enumerate(kept_terms)])
            store.set_hard_state(HardState(term=Term(max(kept_terms)), commit=index))
        else:  # kept nothing: a new replica, as the reconciler creates it
            bootstrap_mirror(store, list(VOTERS), *start)
        store.sync()
        cores[node] = RaftCore(Config(node_id=node), store, random.Random(node))
    return cores


def _pump(cores: dict[NodeId, RaftCore], up: set[NodeId]) -> None:
    """Deliver every message between the nodes `up` until none moves (persisting each Ready)."""
    for _ in range(STEPS_MAX):
        moved = False
        for node, core in cores.items():
            if node not in up or not core.has_ready():
                continue
            ready = core.ready()
            store = core.log.storage
            store.append(list(ready.entries))
            if ready.hard_state is not None:
                store.set_hard_state(ready.hard_state)
            store.sync()
            core.advance(ready)
            moved = True
            for message in ready.messages + ready.persisted_messages:
                if message.target in up:
                    cores[message.target].step(message)
        if not moved:
            return
    raise AssertionError("the cores never settle: a livelock")


def _committed(core: RaftCore) -> list[tuple[int, int, bytes]]:
    entries = core.log.slice(Index(4), Index(core.log.committed + 1), 1 << 30)
    return [(e.index, e.term, e.payload) for e in entries]


def _assert_one_committed_log(cores: dict[NodeId, RaftCore]) -> None:
    logs = [_committed(core) for core in cores.values()]
    for log in logs:
        for other in logs:
            shorter = min(len(log), len(other))
            assert log[:shorter] == other[:shorter], (log, other)


@pytest.mark.parametrize("kept_terms", [[2] * 6, [2, 2, 3, 4, 5, 5]])
def test_replicas_that_kept_nothing_start_at_the_kept_prefix_term(kept_terms: list[int]) -> None:
    cores = _cores(kept_terms)
    assert {core.term for core in cores.values()} == {max(kept_terms)}
    # All up; node 2 (kept nothing) campaigns first, wins, and refills from the first offset.
    cores[NodeId(2)].campaign()
    _pump(cores, set(VOTERS))
    if cores[NodeId(2)].role is Role.LEADER:
        cores[NodeId(2)].propose([b"new-a", b"new-b"])
        _pump(cores, set(VOTERS))
    _assert_one_committed_log(cores)
    assert cores[NodeId(2)].role is Role.LEADER and cores[NodeId(2)].term > max(kept_terms)
    assert all(p.startswith(b"new") or p == b"" for _, _, p in _committed(cores[NodeId(1)]))
    assert cores[NodeId(1)].log.committed == cores[NodeId(2)].log.committed >= 6


def test_a_kept_replica_joining_late_never_drops_what_the_others_committed() -> None:
    cores = _cores([2, 2, 3, 4, 5, 5])
    up = {NodeId(2), NodeId(3)}  # node 1 still building its prefix
    cores[NodeId(2)].campaign()
    _pump(cores, up)
    cores[NodeId(2)].propose([b"new-a", b"new-b", b"new-c"])
    _pump(cores, up)
    committed = _committed(cores[NodeId(2)])
    assert len(committed) == 4  # the NOOP and three batches
    up.add(NodeId(1))
    for _ in range(3):
        cores[NodeId(2)].tick()
        _pump(cores, up)
    cores[NodeId(1)].campaign()  # its last term (5) is higher than theirs would be at term 2
    _pump(cores, up)
    for _ in range(40):
        for core in cores.values():
            core.tick()
        _pump(cores, up)
    _assert_one_committed_log(cores)
    for core in cores.values():  # Leader Completeness: what was committed stays committed, everywhere
        assert _committed(core)[:len(committed)] == committed
    leaders = [core for core in cores.values() if core.role is Role.LEADER]
    assert len(leaders) == 1
    leaders[0].propose([b"after"])
    _pump(cores, up)
    assert len({len(_committed(core)) for core in cores.values()}) == 1
