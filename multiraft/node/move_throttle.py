"""The move throttle: a per-node limit on the bytes/s its leaders send to learners.

A learner is a copy being made: a partition moving to a new node (a decommission, a
dead node's replacement, reassignment.py) catches up as a learner before it votes.
Unthrottled, a move sends as fast as the leader's loop, disk and network allow, and
the producers on the same nodes pay for it: bench/decommission.py measured their p99
at 7.5 times its value before while 384 MiB moved at 50 MiB/s. So every append a
leader of this node sends to a learner of its group goes through one token bucket
per node (Kafka throttles the replicas under reassignment the same way,
`leader.replication.throttled.rate`; Redpanda has `raft_learner_recovery_rate`).
Voters are never throttled: their appends are the quorum's, the producers' own; nor
are the metadata group's learners (joined nodes, whose catalog must not wait behind
a move's bulk). The core keeps a small window toward a learner
(`learner_inflight_messages_max`, 4 appends), so a full window of every moving copy
fits the queue below.

- The rate is the cluster setting `replica_move_bytes_per_s` (catalog, set at run
  time with `PATCH /v1/admin/config`), else the node's own (`NodeConfig`); 0 means
  no limit. A change applies to the next message.
- Every append to a learner queues, with or without entries: one sent ahead of the
  others to the same learner would name a log position the learner has not reached,
  be refused, and send the leader back to probing. Heartbeats to a learner queue too,
  in order with the appends: each answer to one lets the leader send another append
  (it frees a slot of a full window, or re-sends a probe), so heartbeats that overtook
  the queue made the leader generate ten appends a second per learner whatever the
  rate, and the overflow was dropped: 1,200 MiB sent in 300 s at 4 MiB/s for a move
  that never finished. And at most one heartbeat per learner waits: a newer one while
  one waits is left out (queued, a burst of them reached the learner at once, and
  their answers made a burst of appends). A learner neither votes nor campaigns: a
  late heartbeat costs it nothing.
- A bucket in debt: a message goes when the bucket is not negative, and takes its
  size from it (a message bigger than a second's worth still goes, then the bucket
  waits it off), so the long-run rate holds whatever the message sizes.
- Bounded: at most QUEUED_MESSAGES_MAX messages and QUEUED_BYTES_MAX bytes wait; an
  append past that is dropped (counted) and its group told (`on_drop`): its leader
  probes the learner again, one append at a time, instead of streaming on past the
  gap (each later append would be refused, resent, and fill the queue again: a
  decommission of 384 MiB at 4 MiB/s took 378 s that way, 1 MiB/s).

`TokenBucket` is the pure part; `MoveThrottle` owns the queue, drained by its one
task (`run`, started and supervised by the node).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raftlog.messages import Message, MessageType, entries_size_bytes
from raftlog.types import GroupId

REPLICA_MOVE_BYTES_PER_S_DEFAULT = 8 * 1024 * 1024
REPLICA_MOVE_BYTES_PER_S_MAX = 1 << 40
SETTING = "replica_move_bytes_per_s"  # the cluster setting's key
QUEUED_MESSAGES_MAX = 4096
QUEUED_BYTES_MAX = 64 * 1024 * 1024
MESSAGE_OVERHEAD_BYTES = 64  # an append without entries still costs a frame
BURST_S = 0.05  # a full bucket holds this much time's worth of bytes


def effective_rate(cluster_config: dict[str, Any], own: int) -> int:
    """The rate a node uses: the cluster setting when there is one, else its own."""
    value = cluster_config.get(SETTING)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else own


class TokenBucket:
    """Bytes allowed at `rate` per second; in debt after a big message."""

    def __init__(self, now: float) -> None:
        self._tokens = 0.0
        self._at = now

    def wait_s(self, rate: int, now: float) -> float:
        """Seconds until a message may go (0: now); refills first."""
        assert rate > 0
        self._tokens = min(rate * BURST_S, self._tokens + (now - self._at) * rate)
        self._at = now
        return 0.0 if self._tokens >= 0 else -self._tokens / rate

    def take(self, size: int) -> None:
        self._tokens -= size


class BytePace:
    """A node's byte rate for a background read (the tree sidecar warmer, scheduled scrubs):
    a slice waits while the bucket is in debt, then takes what it read. Readers sharing one
    `BytePace` share its rate (several may start a slice at once: the debt they leave is
    waited off by the next ones, so the long-run rate holds)."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`clock`, `sleep`: the loop's, unless a test gives a fake pair."""
        assert bytes_per_s >= 0, bytes_per_s
        self.rate = bytes_per_s  # 0: no limit
        self._clock = clock
        self._sleep = sleep
        self._bucket = TokenBucket(clock())
        self.bytes = 0  # taken through this pace, ever

    async def ready(self) -> None:
        """Until the next slice may start (at once without a limit)."""
        if self.rate <= 0:
            return
        while (wait_s := self._bucket.wait_s(self.rate, self._clock())) > 0:
            await self._sleep(wait_s)

    def spent(self, size: int) -> None:
        assert size >= 0, size
        self.bytes += size
        if self.rate > 0:
            self._bucket.take(size)


THROTTLED_TYPES = frozenset({MessageType.APPEND, MessageType.HEARTBEAT})


def throttled(message: Message, learners: frozenset[int]) -> bool:
    return message.type in THROTTLED_TYPES and message.target in learners


def message_bytes(message: Message) -> int:
    return MESSAGE_OVERHEAD_BYTES + entries_size_bytes(message.entries)


class MoveThrottle:
    def __init__(self, rate: Callable[[], int], send: Callable[[GroupId, Message], None], logger: Any,
                 clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[GroupId, int], None] = lambda group_id, target: None) -> None:
        self._rate = rate
        self._send = send
        self._on_drop = on_drop
        self._logger = logger
        self._clock = clock
        self._bucket = TokenBucket(clock())
        self._queue: collections.deque[tuple[GroupId, Message, int]] = collections.deque()
        self._heartbeats: set[tuple[GroupId, int]] = set()  # (group, learner) with one waiting
        self._queued_bytes = 0
        self._waiting = asyncio.Event()
        self.sent_bytes = 0
        self.dropped = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def offer(self, group_id: GroupId, message: Message) -> None:
        """Send `message` (an append or heartbeat to a learner) within the rate: now, or
        later in order. Promoted to voter meanwhile, a learner's later messages overtake
        what still waits here: the first may be refused and the leader probes once."""
        rate = self._rate()
        size = message_bytes(message)
        heartbeat = message.type is MessageType.HEARTBEAT
        if heartbeat and (group_id, message.target) in self._heartbeats:
            return  # one waits already: its answer is all the leader needs
        if rate <= 0 and not self._queue:
            self.sent_bytes += size
            self._send(group_id, message)
            return
        if len(self._queue) >= QUEUED_MESSAGES_MAX or self._queued_bytes + size > QUEUED_BYTES_MAX:
            self.dropped += 1
            self._on_drop(group_id, message.target)  # probe again, rather than stream past the gap
            return
        if not self._queue and self._bucket.wait_s(rate, self._clock()) == 0:
            self._bucket.take(size)
            self.sent_bytes += size
            self._send(group_id, message)
            return
        self._queue.append((group_id, message, size))
        self._queued_bytes += size
        if heartbeat:
            self._heartbeats.add((group_id, message.target))
        self._waiting.set()

    async def acquire(self, size: int) -> None:
        """Wait until `size` bytes of a far-horizon chunk to a learner may go (catchup_leader.py):
        the same bucket as the appends, so a copy made by files keeps the same rate."""
        while (rate := self._rate()) > 0:
            wait = self._bucket.wait_s(rate, self._clock())
            if wait <= 0:
                self._bucket.take(size)
                break
            await asyncio.sleep(wait)
        self.sent_bytes += size

    async def run(self) -> None:
        """Forever: send what waits, in order, as the bucket allows."""
        while True:
            await self._waiting.wait()
            self._waiting.clear()
            await self._drain()

    async def _drain(self) -> None:
        while self._queue:
            rate = self._rate()
            if rate > 0:
                wait = self._bucket.wait_s(rate, self._clock())
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
            group_id, message, size = self._queue.popleft()
            self._queued_bytes -= size
            if message.type is MessageType.HEARTBEAT:
                self._heartbeats.discard((group_id, message.target))
            if rate > 0:
                self._bucket.take(size)
            self.sent_bytes += size
            try:
                self._send(group_id, message)
            except Exception as error:  # one bad send must not strand the rest
                self._logger.error("move_throttle_send_failed", group_id=group_id, error=repr(error))

    def clear(self) -> None:
        """Forget what waits (the node stops)."""
        self._queue.clear()
        self._heartbeats.clear()
        self._queued_bytes = 0
