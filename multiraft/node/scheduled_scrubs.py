"""Scheduled scrubs: each node deep-verifies the partitions it leads, one at a time, on its own.

Riak AAE rebuilds its trees and exchanges them periodically; Ceph deep-scrubs each
placement group weekly; here each partition's leader runs the scrubber's deep verify
(multiraft/node/scrubber.py) once per `scrub_interval_s` (node config, a week by default;
0: never), with the same repair as `raftlog cluster verify`: a follower found `different`
gets the self-repair (`scrub.repair`), a leader whose own read fails starts its own.
When each partition is due is decided in multiraft/node/scrub_schedule.py (pure).

**What it costs.** One task a node (`run`, started and supervised by the node, cancelled
by its stop), never one a partition. Idle, it wakes every `SYNC_S` or at the next due
time, whichever comes first, and looks at one number (the registry's `led_version`) and
the top of a heap: no pass over the groups. When this node's leaderships changed, it
syncs the schedule with them (one pass over the led groups, at most once per wake). Busy,
it scrubs **one partition at a time**, and every build of a scheduled scrub, the leader's
and each follower's (`paced` in `scrub.tree`), reads through the node's one token bucket
of `scrub_bytes_per_s` (16 MiB/s by default; the `BytePace` of the tree sidecar warmer and
the move throttle's `TokenBucket`), so however many partitions are due, a node reads at
most that rate for scheduled scrubs, its own and those it serves.

**Results.** Per node, in memory (`ScrubResults`: verdicts counted by status, the ranges,
the repairs, the latest VERDICTS_KEPT verdicts that were not identical, and apart from the
verdicts the scrubs `skipped`: cut short by a leadership change, nothing compared), on /metrics
(`raftlog_scrub_scheduled_*`), in `GET /v1/admin/scrub`, and a structlog line for each
verdict that is not identical, with the partition bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.node.scrub_schedule import ScheduledVerdict, ScrubResults, ScrubSchedule
from multiraft.node.scrubber import IDENTICAL, UNREACHABLE, PartitionVerdict, ReplicaVerdict
from raftlog.errors import ClientError
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.scrubber import Scrubber

SYNC_S = 5.0  # how often an idle runner looks whether this node's leaderships changed


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """The scheduled scrub under way (one at a time)."""

    group_id: GroupId
    topic: str
    partition: int
    started_ms: int


class ScheduledScrubs:
    """Runs the scrub schedule of the partitions this node leads."""

    def __init__(self, node_id: int, scrubber: Scrubber, registry: GroupRegistry, schedule: ScrubSchedule | None,
                 logger: Any, clock: Callable[[], float] = time.time) -> None:
        """`schedule`: None when scheduled scrubs are off (`scrub_interval_s` 0)."""
        self._node_id = node_id
        self._scrubber = scrubber
        self._registry = registry
        self.schedule = schedule
        self._logger = logger
        self._clock = clock
        self._led_version = -1  # the registry's `led_version` the schedule was last synced with
        self.results = ScrubResults()
        self.running: Running | None = None

    async def run(self) -> None:
        """Forever: scrub the partition due first, when it is due; nothing when off."""
        if self.schedule is None:
            return
        while True:
            group_id = self.step()
            if group_id is None:
                await asyncio.sleep(self.wait_s())
                continue
            await self.scrub(group_id)
            await asyncio.sleep(0)

    def step(self) -> GroupId | None:
        """Sync with this node's leaderships if they changed; the group due now, if any."""
        schedule = self.schedule
        assert schedule is not None
        now = self._clock()
        if self._registry.led_version != self._led_version:
            self._led_version = self._registry.led_version
            partitions = self._registry.partitions
            schedule.sync([g for g in self._registry.led if g in partitions], partitions, now)
        return schedule.due_now(now)

    def wait_s(self) -> float:
        """Until the next due time, or SYNC_S at most (leaderships may change meanwhile)."""
        assert self.schedule is not None
        earliest = self.schedule.next_due()
        return SYNC_S if earliest is None else max(0.0, min(SYNC_S, earliest[0] - self._clock()))

    async def scrub(self, group_id: GroupId) -> ScheduledVerdict | None:
        """One scheduled scrub of `group_id` (led here); next due one interval after it finishes.
        None: skipped (not led, or cut short by a leadership change), due again soon."""
        schedule = self.schedule
        assert schedule is not None
        machine = self._registry.partitions.get(group_id)
        if machine is None or self._registry.leading(group_id) is None:
            schedule.again(group_id, self._clock(), soon=True)  # led no more: the next sync drops it
            return None
        topic, partition = machine.state.topic, machine.state.partition
        began = self._clock()
        self.running = Running(group_id=group_id, topic=topic, partition=partition, started_ms=int(began * 1000))
        try:
            verdict = await self._scrubber.verify_partition(topic, partition, deep=True, paced=True)
        except ClientError as error:  # NotLeader: it stopped leading, reopened its replica, or retention
            # passed a build, meanwhile: nothing compared, nothing found; tried again soon
            schedule.again(group_id, self._clock(), soon=True)
            self.results.skipped += 1
            self._logger.info("scheduled_scrub_skipped", group_id=int(group_id), topic=topic, partition=partition,
                              detail=str(error))
            return None
        except Exception as error:  # one partition's failure (a bug) must never end the task
            schedule.again(group_id, self._clock(), soon=False)  # not a scrub; not retried in a loop either
            verdict = self._failed(topic, partition, f"{type(error).__name__}: {error}")
        else:
            schedule.done(group_id, self._clock())
        finally:
            self.running = None
        found = ScheduledVerdict(at_ms=int(self._clock() * 1000), seconds=max(0.0, self._clock() - began),
                                 verdict=verdict)
        self.results.add(found)
        self._log(group_id, found)
        return found

    def _failed(self, topic: str, partition: int, detail: str) -> PartitionVerdict:
        me = self._node_id
        return PartitionVerdict(topic=topic, partition=partition, status=UNREACHABLE, leader=me, lo=0,
                                high_watermark=0, replicas=(ReplicaVerdict(
                                    node=me, status=UNREACHABLE, lo=0, hi=0, detail=detail),))

    def _log(self, group_id: GroupId, found: ScheduledVerdict) -> None:
        verdict = found.verdict
        logger = self._logger.bind(group_id=int(group_id), topic=verdict.topic, partition=verdict.partition)
        if verdict.status == IDENTICAL:
            logger.debug("scheduled_scrub_identical", lo=verdict.lo, high_watermark=verdict.high_watermark,
                         seconds=round(found.seconds, 3))
            return
        logger.warning("scheduled_scrub_found", status=verdict.status, lo=verdict.lo,
                       high_watermark=verdict.high_watermark, ranges=[list(r) for r in verdict.ranges],
                       repair_started=verdict.repair_started, seconds=round(found.seconds, 3),
                       replicas={r.node: r.status for r in verdict.replicas},
                       detail=[r.detail for r in verdict.replicas if r.detail])

    def status(self) -> dict[str, Any]:
        """This node's scheduled scrubs, for `GET /v1/admin/scrub`."""
        schedule, results, running = self.schedule, self.results, self.running
        earliest = None if schedule is None else schedule.next_due()
        return {
            "interval_s": None if schedule is None else int(schedule.interval_s),
            "bytes_per_s": self._scrubber.trees.pace.rate,
            "partitions_scheduled": 0 if schedule is None else len(schedule),
            "next_due_ms": None if earliest is None else int(earliest[0] * 1000),
            "running": None if running is None else {"topic": running.topic, "partition": running.partition,
                                                     "started_ms": running.started_ms},
            "verdicts": dict(results.verdicts),
            "skipped": results.skipped,
            "differing_ranges": results.differing_ranges,
            "repairs_started": results.repairs_started,
            "bytes_hashed": self._scrubber.trees.pace.bytes,
            "latest_not_identical": [found.to_json() for found in reversed(results.latest)],
        }
