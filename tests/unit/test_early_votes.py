"""A vote request that reaches a node before its group opens there is handed to the group
when it opens (a moment old, it is as safe as a fresh one), within bounds."""

from __future__ import annotations

from typing import Any

from multiraft.node.early_votes import EarlyVotes
from multiraft.node.messaging import Inbox
from raftlog.messages import Message, MessageType
from raftlog.types import GroupId, NodeId, Term


def _message(kind: MessageType, source: int = 1, term: int = 5) -> Message:
    return Message(type=kind, source=NodeId(source), target=NodeId(2), term=Term(term))


def test_only_vote_requests_are_kept_the_latest_per_candidate_and_taken_once() -> None:
    now = [0.0]
    votes = EarlyVotes(clock=lambda: now[0])
    assert not votes.keep(GroupId(7), _message(MessageType.APPEND))
    assert not votes.keep(GroupId(7), _message(MessageType.HEARTBEAT))
    assert votes.keep(GroupId(7), _message(MessageType.PRE_VOTE, term=5))
    assert votes.keep(GroupId(7), _message(MessageType.VOTE, term=5))  # the same candidate: replaces
    assert votes.keep(GroupId(7), _message(MessageType.PRE_VOTE, source=3))
    assert votes.keep(GroupId(8), _message(MessageType.PRE_VOTE))
    taken = votes.take(GroupId(7))
    assert [(m.type, m.source) for m in taken] == [(MessageType.VOTE, 1), (MessageType.PRE_VOTE, 3)]
    assert votes.take(GroupId(7)) == [] and len(votes) == 1


def test_old_requests_expire_and_the_oldest_go_beyond_the_bound() -> None:
    now = [0.0]
    votes = EarlyVotes(clock=lambda: now[0], limit=3, ttl_s=2.0)
    votes.keep(GroupId(1), _message(MessageType.PRE_VOTE))
    now[0] = 2.5
    assert votes.take(GroupId(1)) == []  # older than the TTL: the candidate has asked again by now
    for group in range(10, 20):  # a peer naming made-up groups
        votes.keep(GroupId(group), _message(MessageType.PRE_VOTE))
    assert len(votes) == 3 and [len(votes.take(GroupId(g))) for g in (17, 18, 19)] == [1, 1, 1]
    votes.keep(GroupId(30), _message(MessageType.PRE_VOTE))
    now[0] = 10.0
    votes.keep(GroupId(31), _message(MessageType.PRE_VOTE))  # expired ones are dropped as new ones come
    assert len(votes) == 1


class _Runtime:
    def __init__(self) -> None:
        self.delivered: list[Message] = []

    def deliver(self, message: Message) -> None:
        self.delivered.append(message)


class _Registry:
    def __init__(self) -> None:
        self.groups: dict[GroupId, Any] = {}


class _Liveness:
    def heard(self, source: int) -> None:
        pass


def test_the_inbox_hands_a_group_the_vote_requests_that_came_before_it_opened() -> None:
    registry = _Registry()
    inbox = Inbox(NodeId(2), registry, _Liveness(), lambda *frame: None, logger=None)  # type: ignore[arg-type]
    request = _message(MessageType.PRE_VOTE)
    inbox._deliver(1, GroupId(9), request)
    inbox._deliver(1, GroupId(9), _message(MessageType.HEARTBEAT))  # not kept: the leader sends it again
    runtime = _Runtime()
    registry.groups[GroupId(9)] = runtime
    inbox.opened(GroupId(9))
    assert runtime.delivered == [request]
    inbox.opened(GroupId(9))
    assert runtime.delivered == [request]  # once
