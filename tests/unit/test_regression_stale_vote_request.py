"""Regression (found by the simulator's membership races, seed 1154 of the focused mix,
no PreVote): a vote request from an older term was dropped without an answer (as etcd
does), so a candidate whose requests never reach the voters of a higher term, and
that never hears from them, stays behind forever.

The schedule: voters {2, 5}; node 2 fell behind before every membership change
and still holds the bootstrap configuration {1, 2, 3}, so it campaigns (at ever
higher terms) among nodes 1 and 3 only, who refuse it (their logs are longer).
Node 5 needs node 2's vote but asks at a lower term, and node 2 said nothing: no
leader, ever. Raft's rule (figure 2) answers every request from an older term with
the current term; the candidate then campaigns above it and gets the vote.
"""

from __future__ import annotations

from raftlog.core.raft import RaftCore
from raftlog.messages import Message, MessageType, Role
from tests.unit.driver import bootstrapped_core, handle_ready


def _ready(core: RaftCore, kind: MessageType) -> list[Message]:
    return [m for m in handle_ready(core, lambda entry: None) if m.type is kind]


def test_a_vote_request_from_an_older_term_is_answered_with_the_current_term() -> None:
    config = {"pre_vote": False, "check_quorum": False}
    ahead = bootstrapped_core(1, 2, **config)
    behind = bootstrapped_core(2, 2, **config)
    for core in (ahead, behind):
        handle_ready(core, lambda entry: None)  # applies the bootstrap membership
    for _ in range(5):  # campaigns whose requests never reach `behind`
        ahead.campaign()
        _ready(ahead, MessageType.VOTE)
    behind.campaign()
    requests = _ready(behind, MessageType.VOTE)
    assert [m.target for m in requests] == [1] and requests[0].term < ahead.term

    ahead.step(requests[0])
    answers = _ready(ahead, MessageType.VOTE_RESPONSE)
    assert [(m.type, m.term, m.reject) for m in answers] == [(MessageType.VOTE_RESPONSE, ahead.term, True)]

    behind.step(answers[0])
    assert behind.term == ahead.term and behind.role is Role.FOLLOWER
    behind.campaign()  # above the other's term now: it gets the vote
    ahead.step(_ready(behind, MessageType.VOTE)[0])
    granted = _ready(ahead, MessageType.VOTE_RESPONSE)
    assert not granted[0].reject
    behind.step(granted[0])
    assert behind.role is Role.LEADER
