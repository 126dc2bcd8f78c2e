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


def test_two_changes_above_the_stored_commit_leave_one_and_the_removed_cannot_elect() -> None:
    core = node_3_after_the_crash(4, 1)
    # The log says REMOVE 4 was committed (its leader appended REMOVE 1 after applying it):
    # node 3 applies it at its restart; only REMOVE 1 stays above the commit.
    assert core.membership.voters == {1, 2, 3, 5}
    sent = run_ticks(core, 100)  # the seed: it asked 1, 4 and 5 in {1..5}, and won with 1 and 4
    asked = [m for m in sent if m.type in VOTES]
    assert asked and {m.target for m in asked} == {1, 2, 5}
    term = asked[-1].term
    response = MessageType.PRE_VOTE_RESPONSE if asked[-1].type is MessageType.PRE_VOTE else MessageType.VOTE_RESPONSE
    core.step(Message(type=response, source=NodeId(1), target=NodeId(3), term=term))
    assert core.role is not Role.LEADER  # 2 of {1, 2, 3, 5}: 2 and 5 hold the entry and refuse


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


def test_the_seeds() -> None:
    run_seed(1404912)  # raised InvariantViolation("leader-completeness") before the fix
    run_seed(1500511)  # liveness: the fix's first version deferred the only voter for ever


def whole_cluster_after_a_power_failure(pre_vote: bool) -> dict[int, RaftCore]:
    """Voters {1..5}; leader 1 removed 4, then 5, in one term, and every node kept the
    entries but lost the commit index (stored lazily): node 4 holds only its own removal."""
    entries, hard = bootstrap_entries([NodeId(i) for i in range(1, 6)])
    first = len(entries) + 1

    def remove(index: int, node: int) -> Entry:
        return Entry(Index(index), Term(2), EntryKind.CONFIG,
                     encode_conf_change(ConfChange(ConfChangeOp.REMOVE, NodeId(node))))

    tail = [Entry(Index(first), Term(2), EntryKind.NOOP, b""), remove(first + 1, 4),
            Entry(Index(first + 2), Term(2), EntryKind.DATA, b"x"), remove(first + 3, 5),
            Entry(Index(first + 4), Term(2), EntryKind.DATA, b"y")]
    cores = {}
    for node in range(1, 6):
        storage = MemoryStorage()
        storage.append(entries + (tail[:3] if node == 4 else tail))
        storage.set_hard_state(HardState(term=Term(2), commit=hard.commit))
        storage.sync()
        cores[node] = RaftCore(Config(node_id=NodeId(node), pre_vote=pre_vote, check_quorum=True), storage,
                               random.Random(node))
    return cores


def test_after_a_whole_cluster_power_failure_a_leader_is_elected() -> None:
    # Goal: with every voter holding two changes above a lost commit, the rule above would
    # defer every campaign for ever; the log itself says the first change was committed.
    for pre_vote in (False, True):
        for alive in ({1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 5}):
            cores = whole_cluster_after_a_power_failure(pre_vote)
            outbox: list[Message] = []
            for _ in range(300):
                for node in sorted(alive):
                    cores[node].tick()
                    while cores[node].has_ready():
                        outbox += handle_ready(cores[node], lambda entry: None)
                messages, outbox = outbox, []
                for message in messages:
                    if message.target in alive:
                        core = cores[message.target]
                        core.step(message)
                        while core.has_ready():
                            outbox += handle_ready(core, lambda entry: None)
                leaders = [node for node in alive if cores[node].role is Role.LEADER]
                if leaders:
                    break
            assert leaders and leaders[0] in {1, 2, 3}, (pre_vote, alive)
            assert cores[leaders[0]].membership.voters >= {1, 2, 3}
