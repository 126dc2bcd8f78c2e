"""A leader that does not wait for its own write: `advance(ready, persisted=False)`,
then `persisted(index, term)` once the write is durable (RaftCore.may_persist_later)."""

from __future__ import annotations

from raftlog.core.log import RaftLog
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, EntryKind, Message, Role
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage
from tests.unit.driver import handle_ready
from tests.unit.test_core_api import Cluster


def write_without_sync(core: RaftCore) -> list[Message]:
    """Handle a leader's Ready the way the node does: send, write, apply, advance, and
    leave the fsync running (not done here at all)."""
    ready = core.ready()
    assert core.may_persist_later(ready)
    storage = core.log.storage
    assert isinstance(storage, MemoryStorage)
    storage.append(ready.entries)
    if ready.hard_state is not None:
        storage.set_hard_state(ready.hard_state)
    core.advance(ready, persisted=False)
    return list(ready.messages)


def deliver(cluster: Cluster, messages: list[Message]) -> list[Message]:
    """Step `messages` into their targets (followers, synchronous); their answers come back."""
    answers = []
    for message in messages:
        target = cluster.cores[message.target]
        target.step(message)
        while target.has_ready():
            answers += handle_ready(target, lambda entry: None)
    return answers


def test_two_followers_commit_what_the_leader_has_not_made_durable() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    term, index = leader.propose([b"x"])
    sends = write_without_sync(leader)
    for answer in deliver(cluster, sends):
        leader.step(answer)
    # Committed on the followers' word alone: the leader's own copy is not counted.
    assert leader.commit_index == index
    assert leader.progress(NodeId(1)).match < index
    assert leader.log.stable_last_index() < index
    committed = _committed_of_next_ready(leader)  # applied (and answered) before the fsync
    assert [e.payload for e in committed if e.kind is EntryKind.DATA] == [b"x"]
    leader.persisted(index, term)
    assert leader.progress(NodeId(1)).match == index
    assert leader.log.stable_last_index() == index
    assert not leader.log.unstable


def _committed_of_next_ready(core: RaftCore) -> tuple[Entry, ...]:
    ready = core.ready()
    assert not ready.entries
    core.advance(ready)
    return ready.committed_entries


def test_one_follower_and_an_unpersisted_leader_are_not_a_majority() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    term, index = leader.propose([b"x"])
    sends = write_without_sync(leader)
    for answer in deliver(cluster, [m for m in sends if m.target == 2]):
        leader.step(answer)
    assert leader.commit_index < index, "the leader counted a write a crash could lose"
    leader.persisted(index, term)
    assert leader.commit_index == index  # now it is the leader's durable copy and node 2's


def test_a_report_about_replaced_entries_changes_nothing() -> None:
    storage = MemoryStorage()
    log = RaftLog(storage, Index(0))
    log.append([Entry(Index(1), Term(1), EntryKind.NOOP), Entry(Index(2), Term(1), EntryKind.DATA, b"a")])
    handed = log.unwritten()
    assert [e.index for e in handed] == [1, 2] and log.unwritten() == []
    storage.append(handed)
    # A new leader's entry replaces index 2 before the old write's fsync reports.
    log.append([Entry(Index(2), Term(2), EntryKind.NOOP)])
    assert log.in_progress == 1 and log.has_unwritten()
    assert not log.stable_to(Index(2), Term(1)), "the report names an entry no longer in the log"
    assert log.stable_last_index() == 0
    assert log.stable_to(Index(1), Term(1))  # what is still the same entry is durable
    assert log.stable_last_index() == 1
    assert [e.index for e in log.unwritten()] == [2]


def test_only_a_leaders_plain_appends_may_persist_later() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    follower = cluster.cores[2]
    leader.propose([b"x"])
    sends = write_without_sync(leader)
    follower.step(next(m for m in sends if m.target == 2))
    ready = follower.ready()
    assert ready.entries and not follower.may_persist_later(ready), "a follower's answer promises its disk"
    follower.advance(ready)
    # A campaign's Ready (a new term, a vote for itself, or a pre-vote) waits too.
    node = cluster.cores[3]
    for _ in range(3 * node.config.election_timeout_ticks):
        node.tick()
        if node.role is not Role.FOLLOWER:
            break
    ready = node.ready()
    assert not node.may_persist_later(ready)
    node.advance(ready)
