"""The move throttle (issue 25): appends to learners leave within a byte rate, in order.

Goal: with no limit an append goes at once; with a limit the bytes sent over a
window stay within rate x window plus one message (the bucket in debt), every
message goes, in the order offered; a rate changed at run time applies to what
still waits; past its bounds the queue drops (Raft resends) and counts it; the
cluster setting wins over the node's own; only appends and heartbeats to learners are
throttled, at most one heartbeat per learner waiting; a drop tells the group (its
leader probes the learner again).
"""

from __future__ import annotations

import asyncio

import pytest
import structlog

from multiraft.node import move_throttle
from multiraft.node.move_throttle import (
    MoveThrottle,
    TokenBucket,
    effective_rate,
    message_bytes,
    throttled,
)
from raftlog.messages import Entry, EntryKind, Message, MessageType
from raftlog.types import GroupId, Index, NodeId, Term


def _append(target: int, payload_bytes: int, index: int = 1) -> Message:
    entries = (Entry(Index(index), Term(1), EntryKind.DATA, b"x" * payload_bytes),) if payload_bytes else ()
    return Message(type=MessageType.APPEND, source=NodeId(1), target=NodeId(target), term=Term(1),
                   index=Index(index), entries=entries)


def test_the_bucket_waits_off_its_debt() -> None:
    bucket = TokenBucket(now=0.0)
    assert bucket.wait_s(1000, 0.0) == 0  # empty, not in debt: a message may go
    bucket.take(500)
    assert bucket.wait_s(1000, 0.0) == pytest.approx(0.5)
    assert bucket.wait_s(1000, 0.25) == pytest.approx(0.25)
    assert bucket.wait_s(1000, 0.5) == 0
    assert bucket.wait_s(1000, 100.0) == 0  # a long idle fills it only up to the burst
    bucket.take(int(1000 * move_throttle.BURST_S) + 1000)
    assert bucket.wait_s(1000, 100.0) == pytest.approx(1.0)


def test_only_appends_to_learners_are_throttled_and_the_cluster_setting_wins() -> None:
    learners = frozenset({NodeId(4)})
    assert throttled(_append(4, 10), learners)
    assert not throttled(_append(2, 10), learners)
    heartbeat = Message(type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(4), term=Term(1))
    assert throttled(heartbeat, learners), "in order with the appends: its answer frees the window"
    vote = Message(type=MessageType.VOTE, source=NodeId(1), target=NodeId(4), term=Term(1))
    assert not throttled(vote, learners)
    assert message_bytes(_append(4, 0)) == move_throttle.MESSAGE_OVERHEAD_BYTES
    assert effective_rate({}, 7) == 7
    assert effective_rate({move_throttle.SETTING: 0}, 7) == 0
    assert effective_rate({move_throttle.SETTING: 99}, 7) == 99
    assert effective_rate({move_throttle.SETTING: True}, 7) == 7


@pytest.mark.asyncio
async def test_a_limited_rate_holds_and_keeps_the_order() -> None:
    sent: list[tuple[float, Message]] = []
    loop = asyncio.get_running_loop()
    rate = [200_000]
    throttle = MoveThrottle(lambda: rate[0], lambda g, m: sent.append((loop.time(), m)),
                            structlog.get_logger(), clock=loop.time)
    runner = asyncio.create_task(throttle.run())
    try:
        began = loop.time()
        messages = [_append(4, 20_000, index=i) for i in range(1, 21)]  # about 400 KB: about 2 s at 200 KB/s
        for message in messages:
            throttle.offer(GroupId(1), message)
        async with asyncio.timeout(10):
            while len(sent) < len(messages):
                await asyncio.sleep(0.05)
        assert [m for _, m in sent] == messages, "in the order offered"
        took = sent[-1][0] - began
        total = sum(message_bytes(m) for m in messages)
        assert took >= (total - message_bytes(messages[0])) / rate[0] * 0.9, took
        assert throttle.sent_bytes == total and throttle.queued == 0 and throttle.dropped == 0
        # No limit: the next goes at once, nothing queued.
        rate[0] = 0
        throttle.offer(GroupId(1), _append(4, 10, index=30))
        assert sent[-1][1].index == 30
    finally:
        runner.cancel()


@pytest.mark.asyncio
async def test_past_its_bounds_the_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(move_throttle, "QUEUED_MESSAGES_MAX", 3)
    sent: list[Message] = []
    dropped: list[tuple[int, int]] = []
    throttle = MoveThrottle(lambda: 1, lambda g, m: sent.append(m), structlog.get_logger(),
                            on_drop=lambda g, t: dropped.append((g, t)))
    for i in range(1, 7):  # no runner: nothing drains
        throttle.offer(GroupId(1), _append(4, 100, index=i))
    assert len(sent) == 1  # the first found the bucket not in debt
    assert throttle.queued == 3 and throttle.dropped == 2
    assert dropped == [(1, 4), (1, 4)], "the group is told, to probe the learner again"
    throttle.clear()
    heartbeat = Message(type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(4), term=Term(1))
    throttle.offer(GroupId(1), heartbeat)
    throttle.offer(GroupId(1), heartbeat)  # one waits already: left out
    throttle.offer(GroupId(2), heartbeat)  # another group's
    assert throttle.queued == 2 and throttle.dropped == 2
    throttle.clear()
    assert throttle.queued == 0
