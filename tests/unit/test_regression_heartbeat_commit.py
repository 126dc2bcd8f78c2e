"""Regression (found by the chaos runner, corrupt fault): a replica whose log lost its
tail got a heartbeat whose commit (the leader's idea of its match) lay beyond its log,
and the core's "cannot commit beyond the log" assertion failed the group on every
reopen. The prefix it holds still matches the leader's, so it commits what it has."""

from __future__ import annotations

from raftlog.messages import Message, MessageType
from raftlog.types import Index, NodeId, Term
from tests.unit.driver import bootstrapped_core


def test_a_heartbeat_commit_beyond_a_shortened_log_commits_what_is_there() -> None:
    core = bootstrapped_core(2, 3)
    last = core.log.last_index()
    core.step(Message(type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(2), term=Term(5),
                      commit=Index(last + 40)))
    assert core.commit_index == last
    assert core.leader == 1 and core.term == 5
