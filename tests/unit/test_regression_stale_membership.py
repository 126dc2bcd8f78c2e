"""Regression (simulator seed 1404912: leader-completeness): a node whose applied
membership was two changes behind the one in force won an election with the votes of
removed nodes and led without a committed entry.

Voters {1..5}; leader 2 removes 4, then 1 (each after the one before was applied),
then commits an entry with {2, 5}, the majority of {2, 3, 5}. Node 3 holds both
removals in its log, but a crash left its stored commit below them (the commit index
is stored lazily), so it still applies {1..5}: votes from 1 and 4, whose logs stopped
at their removals, gave it three of five. etcd's guard (no campaign with a committed,
unapplied change) does not see two changes above an old commit index. The fix: two
CONFIG entries above the applied index, committed or not, defer a campaign; such a
node learns the commit from another candidate's request (or a leader, or a refusal).
"""

from __future__ import annotations

import random

from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    Role,
    encode_conf_change,
)
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage
from tests.sim.simulator import run_seed
from tests.unit.driver import handle_ready

VOTES = (MessageType.VOTE, MessageType.PRE_VOTE)


def node_3_after_the_crash(*removed: int) -> RaftCore:
    """Node 3 of {1..5}: a term-2 NOOP, then a REMOVE entry for each of `removed` with an
    entry between them, all of term 2 and above its stored commit (the bootstrap's)."""
    entries, hard = bootstrap_entries([NodeId(i) for i in range(1, 6)])
    index = len(entries)
    tail = [Entry(Index(index + 1), Term(2), EntryKind.NOOP, b"")]
    for node in removed:
        change = encode_conf_change(ConfChange(ConfChangeOp.REMOVE, NodeId(node)))
        tail.append(Entry(Index(index + len(tail) + 1), Term(2), EntryKind.CONFIG, change))
        tail.append(Entry(Index(index + len(tail) + 1), Term(2), EntryKind.DATA, b"x"))
    storage = MemoryStorage()
    storage.append(entries + tail)
    storage.set_hard_state(HardState(term=Term(2), commit=hard.commit))
    storage.sync()
    core = RaftCore(Config(node_id=NodeId(3), pre_vote=True), storage, random.Random(3))
    while core.has_ready():  # the restart applies the log up to the stored commit: the bootstrap
        handle_ready(core, lambda entry: None)
    return core


def run_ticks(core: RaftCore, ticks: int) -> list[Message]:
    sent: list[Message] = []
    for _ in range(ticks):
        core.tick()
        while core.has_ready():
            sent += handle_ready(core, lambda entry: None)
    return sent


def test_two_changes_above_the_applied_index_defer_the_campaign() -> None:
    core = node_3_after_the_crash(4, 1)
    assert core.membership.voters == {1, 2, 3, 4, 5}
    sent = run_ticks(core, 100)  # the seed: it asked 1, 4 and 5, and won
    assert not [m for m in sent if m.type is MessageType.VOTE]
    probes = [m for m in sent if m.type is MessageType.PRE_VOTE]  # it asks for the commit only
    assert probes and {m.target for m in probes} == {1, 2, 4, 5}
    term = probes[-1].term
    for voter in (1, 4):  # the removed nodes grant, knowing no newer commit
        core.step(Message(type=MessageType.PRE_VOTE_RESPONSE, source=NodeId(voter), target=NodeId(3), term=term))
    assert core.role is Role.FOLLOWER and core.term == Term(2)


def test_one_change_above_the_applied_index_does_not() -> None:
    core = node_3_after_the_crash(4)
    asked = {m.target for m in run_ticks(core, 100) if m.type in VOTES}
    assert asked == {1, 2, 4, 5}  # the two memberships differ by one voter: their majorities overlap


def test_the_deferred_node_learns_the_commit_from_a_candidate_and_then_campaigns() -> None:
    core = node_3_after_the_crash(4, 1)
    last = core.log.last_index()
    # Node 5 holds the same log and knows it committed: its request says so.
    request = Message(type=MessageType.PRE_VOTE, source=NodeId(5), target=NodeId(3), term=Term(3),
                      index=last, log_term=Term(2), commit=last)
    core.step(request)
    while core.has_ready():
        handle_ready(core, lambda entry: None)
    assert core.log.committed == last and core.membership.voters == {2, 3, 5}
    asked = {m.target for m in run_ticks(core, 100) if m.type in VOTES}
    assert asked == {2, 5}


def test_a_candidate_whose_last_entry_we_do_not_hold_teaches_nothing() -> None:
    core = node_3_after_the_crash(4, 1)
    last = core.log.last_index()
    request = Message(type=MessageType.PRE_VOTE, source=NodeId(5), target=NodeId(3), term=Term(3),
                      index=last, log_term=Term(3), commit=last)  # another term at our last index
    core.step(request)
    assert core.log.committed < last


def test_the_seed() -> None:
    run_seed(1404912)  # raised InvariantViolation("leader-completeness") before the fix
