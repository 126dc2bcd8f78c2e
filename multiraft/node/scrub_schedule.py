"""When each partition this node leads is next scrubbed: the pure part of scheduled scrubs.

A scheduled scrub is the scrubber's deep verify of one partition (multiraft/node/
scrubber.py), run by its leader on its own, at most once per `scrub_interval_s` (node
config): Riak's periodic AAE tree rebuild, Ceph's weekly deep scrub. The runner
(multiraft/node/scheduled_scrubs.py) owns the clock and the task; this module decides.

**One due time per partition led here**, in a dict, with a heap of (due, group) beside it
so the next due is found without a look at every partition (entries whose group was
rescheduled or dropped stay in the heap until they surface, and are skipped; the heap is
rebuilt when stale entries outnumber the live ones). `sync` is given the groups this node
leads when they changed (the registry's `led`, read only when its version moved):
a group newly led gets its first due time, a group no longer led is dropped. So a
leadership change hands a partition's schedule to the new leader, which goes on from
the partition's last scrub when it knows it.

**First due time, and why no stampede.** A group newly led (after a restart: every group)
whose last scrub this node does not know is first due at a **random point within the
interval**, so 10,000 partitions led after a restart are spread evenly over it and never
all due together; the cost is that a partition may wait up to two intervals across a
restart (one and a half on average), which a weekly scrub can afford. Last scrub times
are not persisted: nothing on disk is kept per partition outside Raft that a restart
reads back cheaply, and the random start bounds the gap anyway. When this node does
know the partition's last scrub (`note_scrubbed`: it led one, served a follower's side
of one, or led or served an on-demand deep verify, all of which read the whole replica)
it is due one interval after that; if that is past, within the first `OVERDUE_SPREAD` of
an interval from now, at random, so partitions handed over together by a dead leader do
not line up either. Due times are wall-clock seconds (`time.time`), since another node's
record is compared with them; a clock jump moves them, which one-at-a-time and the byte
rate keep harmless.

**At most once per interval**, per node: a scrub's partition is next due one interval after
it finishes (`done`), whatever it found (an unreachable follower is tried again the next
interval; the verdict is in the node's status and metrics meanwhile). Only a scrub that
finished counts as one: a scrub cut short (`again`) leaves the last scrub known as it was
and is due again, soon when it was skipped (this node stopped leading, or reopened its
replica, or retention passed a build: within RETRY_S, at random), one interval on when it
failed (a bug, recorded `unreachable`: not retried in a loop).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import random
from collections.abc import Container, Iterable
from typing import Any

from multiraft.node.scrubber import (
    BEHIND,
    DIFFERENT,
    IDENTICAL,
    LEADER_DAMAGED,
    UNREACHABLE,
    PartitionVerdict,
)
from raftlog.types import GroupId

RETRY_S = 300.0  # a scrub skipped (cut short by a leadership change) is due again within this, at random
OVERDUE_SPREAD = 0.25  # an overdue partition handed over is due within this part of an interval from now
VERDICTS_KEPT = 64  # the latest verdicts that were not identical, in memory, for the status route
STATUSES = (IDENTICAL, BEHIND, DIFFERENT, LEADER_DAMAGED, UNREACHABLE)


class ScrubSchedule:
    """The due times of the partitions this node leads (wall-clock seconds)."""

    def __init__(self, interval_s: float, rng: random.Random) -> None:
        assert interval_s > 0, interval_s
        self.interval_s = interval_s
        self._rng = rng
        self._due: dict[GroupId, float] = {}  # invariant: a group here is led (as of the last sync)
        self._heap: list[tuple[float, GroupId]] = []  # (due, group); stale unless `_due[group] == due`
        self._last: dict[GroupId, float] = {}  # the last whole-replica scrub known here, by group hosted

    def __len__(self) -> int:
        return len(self._due)

    def due_at(self, group_id: GroupId) -> float | None:
        return self._due.get(group_id)

    def sync(self, led: Iterable[GroupId], hosted: Container[GroupId], now: float) -> None:
        """`led`: the partition groups this node leads now; `hosted`: those it has a replica of.
        Costs a pass over them: the runner calls it only when they changed."""
        led = set(led)  # membership tests below: a list would make this quadratic
        for group_id in [g for g in self._due if g not in led]:
            del self._due[group_id]  # its heap entry turns stale
        for group_id in led:
            if group_id not in self._due:
                self._push(group_id, self._first_due(group_id, now))
        for group_id in [g for g in self._last if g not in hosted]:
            del self._last[group_id]
        self._compact()

    def _first_due(self, group_id: GroupId, now: float) -> float:
        last = self._last.get(group_id)
        if last is None:
            return now + self._rng.uniform(0, self.interval_s)
        due = last + self.interval_s
        return due if due > now else now + self._rng.uniform(0, self.interval_s * OVERDUE_SPREAD)

    def next_due(self) -> tuple[float, GroupId] | None:
        """The earliest (due, group), stale entries dropped on the way."""
        heap = self._heap
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def due_now(self, now: float) -> GroupId | None:
        """The group to scrub now (the earliest due), else None. It stays due until `done`."""
        earliest = self.next_due()
        return earliest[1] if earliest is not None and earliest[0] <= now else None

    def done(self, group_id: GroupId, now: float) -> None:
        """A scheduled scrub of `group_id` finished (whatever it found): next due one interval on."""
        self._last[group_id] = now
        if group_id in self._due:
            self._push(group_id, now + self.interval_s)

    def again(self, group_id: GroupId, now: float, *, soon: bool) -> None:
        """A scheduled scrub of `group_id` was cut short: not a scrub (the last one known stays).
        `soon`: due again within RETRY_S (at most an interval), at random; else one interval on."""
        if group_id in self._due:
            after = self._rng.uniform(0.5, 1.0) * min(RETRY_S, self.interval_s) if soon else self.interval_s
            self._push(group_id, now + after)

    def note_scrubbed(self, group_id: GroupId, at: float) -> None:
        """This node's replica of `group_id` was read whole for a verify (led or served here):
        if this node leads it, its next scheduled scrub is one interval after `at`."""
        if at <= self._last.get(group_id, float("-inf")):
            return
        self._last[group_id] = at
        due = self._due.get(group_id)
        if due is not None and due < at + self.interval_s:
            self._push(group_id, at + self.interval_s)

    def _push(self, group_id: GroupId, due: float) -> None:
        self._due[group_id] = due
        heapq.heappush(self._heap, (due, group_id))
        self._compact()  # each reschedule leaves a stale entry behind

    def _compact(self) -> None:
        """Rebuild the heap once stale entries outnumber the live ones (bounded memory)."""
        if len(self._heap) > 2 * len(self._due) + 64:
            self._heap = [(due, group_id) for group_id, due in self._due.items()]
            heapq.heapify(self._heap)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledVerdict:
    """One scheduled scrub's verdict, and when it ended (wall-clock ms)."""

    at_ms: int
    seconds: float
    verdict: PartitionVerdict

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "seconds": round(self.seconds, 3), **self.verdict.to_json()}


@dataclasses.dataclass(slots=True)
class ScrubResults:
    """What this node's scheduled scrubs found: counters, and the latest verdicts that were
    not identical (at most VERDICTS_KEPT; a partition is never a label, so the metrics stay
    bounded at any partition count)."""

    verdicts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    differing_ranges: int = 0
    repairs_started: int = 0
    skipped: int = 0  # cut short with nothing compared (a leadership change): not a verdict
    seconds: float = 0.0  # spent in scheduled scrubs, summed
    latest: collections.deque[ScheduledVerdict] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=VERDICTS_KEPT))

    def add(self, found: ScheduledVerdict) -> None:
        verdict = found.verdict
        assert verdict.status in self.verdicts, verdict.status
        self.verdicts[verdict.status] += 1
        self.differing_ranges += len(verdict.ranges)
        self.repairs_started += sum(1 for replica in verdict.replicas if replica.repair_started)
        self.seconds += found.seconds
        if verdict.status != IDENTICAL:
            self.latest.append(found)
