"""Scheduled scrubs' decisions with a fake clock (multiraft/node/scrub_schedule.py, the runner
in multiraft/node/scheduled_scrubs.py, the byte rate in multiraft/node/move_throttle.py).

Goals: after a restart 10,000 partitions are spread over the interval, never all due at
once; each partition is scrubbed at most once per interval, one at a time; a leadership
change drops or hands over a partition's schedule, going on from its last scrub when this
node knows it; an idle runner touches no group; the byte rate holds over many slices;
verdicts are counted, the ones that were not identical kept (bounded) and logged with the
partition bound."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from multiraft.node.move_throttle import BytePace
from multiraft.node.scheduled_scrubs import SYNC_S, ScheduledScrubs
from multiraft.node.scrub_schedule import OVERDUE_SPREAD, RETRY_S, VERDICTS_KEPT, ScrubSchedule
from multiraft.node.scrubber import (
    DIFFERENT,
    IDENTICAL,
    UNREACHABLE,
    PartitionVerdict,
    ReplicaVerdict,
)
from raftlog.errors import NotLeader
from raftlog.types import GroupId

INTERVAL_S = 1_000.0
NOW = 1_700_000_000.0  # wall-clock seconds


def _groups(count: int, first: int = 1) -> list[GroupId]:
    return [GroupId(g) for g in range(first, first + count)]


def test_a_restart_spreads_first_due_times_over_the_interval() -> None:
    # Goal: 10,000 partitions led after a restart (no last scrub known) are due at random
    # points within one interval: none now, about a tenth in each tenth of it.
    schedule = ScrubSchedule(INTERVAL_S, random.Random(1))
    led = _groups(10_000)
    schedule.sync(led, set(led), NOW)
    dues = [schedule.due_at(g) for g in led]
    assert all(d is not None and NOW <= d < NOW + INTERVAL_S for d in dues)
    tenths = [0] * 10
    for due in dues:
        assert due is not None
        tenths[int((due - NOW) / INTERVAL_S * 10)] += 1
    assert all(800 < count < 1200 for count in tenths), tenths
    earliest = min(d for d in dues if d is not None)
    assert earliest > NOW and schedule.due_now(NOW) is None, "none due at the restart itself"
    assert schedule.next_due() == (earliest, led[dues.index(earliest)])
    assert schedule.due_now(earliest) == led[dues.index(earliest)], "the first one is due at its time"


def test_one_at_a_time_and_at_most_once_per_interval() -> None:
    # Goal: over five intervals of fake time, with a scrub taking 3 s, each partition is scrubbed
    # once an interval (four or five times) and never twice within one, in due order.
    schedule = ScrubSchedule(INTERVAL_S, random.Random(2))
    led = _groups(100)
    schedule.sync(led, set(led), NOW)
    scrubbed: dict[GroupId, list[float]] = {g: [] for g in led}
    now = NOW
    while now < NOW + 5 * INTERVAL_S:
        group_id = schedule.due_now(now)
        if group_id is None:
            earliest = schedule.next_due()
            assert earliest is not None
            now = max(now, earliest[0])
            continue
        assert schedule.due_now(now) == group_id, "it stays due until done: one at a time"
        scrubbed[group_id].append(now)
        now += 3.0
        schedule.done(group_id, now)
    for times in scrubbed.values():
        assert 4 <= len(times) <= 5, times
        assert all(b - a >= INTERVAL_S for a, b in itertools.pairwise(times)), times


def test_a_leadership_change_drops_or_hands_over_the_schedule() -> None:
    # Goal: a partition no longer led is never due here; one led again goes on one interval
    # after its last scrub known here (led, or served as a follower), or, overdue, within
    # the first OVERDUE_SPREAD of an interval; unknown ones start at random within it.
    schedule = ScrubSchedule(INTERVAL_S, random.Random(3))
    a, b, c = _groups(3)
    hosted = {a, b, c}
    schedule.sync([a, b], hosted, NOW)
    schedule.done(a, NOW + 10)  # a scrubbed here
    schedule.note_scrubbed(c, NOW + 20)  # c's follower side served here
    schedule.sync([b], hosted, NOW + 30)  # a leads elsewhere now
    assert schedule.due_at(a) is None and len(schedule) == 1
    for now in (NOW + 30, NOW + 5 * INTERVAL_S):
        assert schedule.due_now(now) in (b, None) and schedule.due_now(now) != a
    schedule.sync([a, b, c], hosted, NOW + 100)  # both led here again
    assert schedule.due_at(a) == NOW + 10 + INTERVAL_S
    assert schedule.due_at(c) == NOW + 20 + INTERVAL_S
    schedule.sync([b], hosted, NOW + 200)
    late = NOW + 3 * INTERVAL_S
    schedule.sync([a, b], hosted, late)
    due = schedule.due_at(a)
    assert due is not None and late <= due <= late + OVERDUE_SPREAD * INTERVAL_S, "overdue: spread, not now"
    schedule.sync([a, b], {a, b}, late)  # c's replica left this node: its record goes
    schedule.sync([a, b, c], {a, b, c}, late)
    due = schedule.due_at(c)
    assert due is not None and late <= due < late + INTERVAL_S


def test_an_on_demand_deep_verify_postpones_the_scheduled_one() -> None:
    schedule = ScrubSchedule(INTERVAL_S, random.Random(4))
    (a,) = _groups(1)
    schedule.sync([a], {a}, NOW)
    schedule.note_scrubbed(a, NOW + 1)
    assert schedule.due_at(a) == NOW + 1 + INTERVAL_S
    schedule.note_scrubbed(a, NOW)  # an older record changes nothing
    assert schedule.due_at(a) == NOW + 1 + INTERVAL_S and schedule.due_now(NOW + INTERVAL_S) is None


def test_leadership_churn_keeps_the_heap_bounded() -> None:
    # Goal: stale heap entries (groups dropped or rescheduled) do not pile up.
    schedule = ScrubSchedule(INTERVAL_S, random.Random(5))
    led = _groups(1_000)
    rng = random.Random(6)
    for step in range(200):
        chosen = [g for g in led if rng.random() < 0.5]
        schedule.sync(chosen, set(led), NOW + step)
        for g in chosen[:50]:
            schedule.note_scrubbed(g, NOW + step)
        assert len(schedule._heap) <= 2 * len(schedule) + 64 + 50


class _CountingMapping(Mapping[GroupId, Any]):
    """A registry table that counts the passes over it."""

    def __init__(self, items: dict[GroupId, Any]) -> None:
        self.items_ = items
        self.passes = 0

    def __getitem__(self, key: GroupId) -> Any:
        return self.items_[key]

    def __iter__(self) -> Iterator[GroupId]:
        self.passes += 1
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


class _Registry:
    def __init__(self, groups: list[GroupId]) -> None:
        self.partitions = {g: SimpleNamespace(state=SimpleNamespace(topic="t", partition=int(g))) for g in groups}
        self.led = _CountingMapping(dict.fromkeys(groups, 1))
        self.led_version = 1

    def leading(self, group_id: GroupId) -> object | None:
        return object() if group_id in self.led.items_ else None


class _Logger:
    def __init__(self, lines: list[tuple[str, dict[str, Any]]], bound: dict[str, Any] | None = None) -> None:
        self.lines, self.bound = lines, bound or {}

    def bind(self, **context: Any) -> _Logger:
        return _Logger(self.lines, {**self.bound, **context})

    def debug(self, event: str, **fields: Any) -> None:
        self.lines.append((event, {**self.bound, **fields}))

    info = warning = debug


def _verdict(group_id: GroupId, status: str) -> PartitionVerdict:
    replica = ReplicaVerdict(node=2, status=status, lo=0, hi=100, ranges=((0, 4096),) if status == DIFFERENT else (),
                             repair_started=status == DIFFERENT)
    return PartitionVerdict(topic="t", partition=int(group_id), status=status, leader=1, lo=0, high_watermark=100,
                            replicas=(replica,))


class _Scrubber:
    """verify_partition as the real one answers, its concurrency watched."""

    def __init__(self, statuses: dict[int, str]) -> None:
        self.statuses = statuses
        self.trees = SimpleNamespace(pace=BytePace(1 << 20))
        self.calls: list[tuple[str, int, bool, bool]] = []
        self.running = self.most_at_once = 0

    async def verify_partition(self, topic: str, partition: int, *, deep: bool, paced: bool) -> PartitionVerdict:
        self.calls.append((topic, partition, deep, paced))
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        await asyncio.sleep(0.001)
        self.running -= 1
        status = self.statuses.get(partition, IDENTICAL)
        if status == "not_leader":
            raise NotLeader(3, "moved")
        if status == "bug":
            raise AssertionError("index 1 precedes every segment")
        return _verdict(GroupId(partition), status)


def test_an_idle_runner_touches_no_group() -> None:
    # Goal: with 10,000 partitions led and none due, a wake is a look at one number and the
    # top of a heap: no pass over the led groups until leadership changes.
    groups = _groups(10_000)
    registry = _Registry(groups)
    clock = [NOW]
    runner = ScheduledScrubs(1, _Scrubber({}), registry, ScrubSchedule(INTERVAL_S, random.Random(7)),  # type: ignore[arg-type]
                             _Logger([]), clock=lambda: clock[0])
    runner.schedule._rng = SimpleNamespace(uniform=lambda lo, hi: hi / 2)  # type: ignore[union-attr]  # none due
    assert runner.step() is None and registry.led.passes == 1 and len(runner.schedule or ()) == 10_000
    for _ in range(50):  # 250 s: the first due is at 500 s
        clock[0] += SYNC_S
        assert runner.step() is None
    assert registry.led.passes == 1, "no pass over the groups while leaderships stay"
    assert runner.wait_s() == SYNC_S
    registry.led_version += 1
    del registry.led.items_[groups[0]]
    runner.step()
    assert registry.led.passes == 2 and len(runner.schedule or ()) == 9_999, "a change: one pass over them"


def test_the_runner_scrubs_one_at_a_time_counts_and_logs() -> None:
    # Goal: every due partition is verified deep and paced, one at a time; verdicts are
    # counted by status, the ones not identical kept (newest first, bounded) and logged
    # with the partition bound; a leader that lost its lead mid-scrub is `skipped`, not a
    # verdict (no follower was found unreachable), due again soon, not counted as scrubbed.
    groups = _groups(VERDICTS_KEPT + 10)
    statuses = {int(g): DIFFERENT for g in groups[:VERDICTS_KEPT + 5]}
    statuses[int(groups[-1])] = "not_leader"
    scrubber, lines = _Scrubber(statuses), []
    clock = [NOW]
    runner = ScheduledScrubs(1, scrubber, _Registry(groups), ScrubSchedule(INTERVAL_S, random.Random(8)),  # type: ignore[arg-type]
                             _Logger(lines), clock=lambda: clock[0])

    async def scrub_all() -> None:
        runner.step()  # the first sync: due times within the interval from NOW
        clock[0] = NOW + INTERVAL_S  # everything due
        while (group_id := runner.step()) is not None:
            await runner.scrub(group_id)

    asyncio.run(asyncio.wait_for(scrub_all(), 30))
    assert len(scrubber.calls) == len(groups) and scrubber.most_at_once == 1
    assert all(deep and paced for _, _, deep, paced in scrubber.calls)
    results = runner.results
    assert results.verdicts[DIFFERENT] == VERDICTS_KEPT + 5 and results.verdicts[UNREACHABLE] == 0
    assert results.verdicts[IDENTICAL] == 4 and results.repairs_started == VERDICTS_KEPT + 5
    assert results.skipped == 1 and len(results.latest) == VERDICTS_KEPT
    status = runner.status()
    assert status["interval_s"] == INTERVAL_S and status["partitions_scheduled"] == len(groups)
    assert status["skipped"] == 1 and UNREACHABLE in status["verdicts"] and "skipped" not in status["verdicts"]
    last_found = [p for _, p, _, _ in scrubber.calls if statuses.get(p, IDENTICAL) not in (IDENTICAL, "not_leader")][-1]
    assert status["latest_not_identical"][0]["partition"] == last_found, "newest first"
    skipped_due = runner.schedule.due_at(groups[-1])  # type: ignore[union-attr]
    assert skipped_due is not None and NOW + INTERVAL_S < skipped_due <= NOW + INTERVAL_S + RETRY_S
    assert status["next_due_ms"] == int(skipped_due * 1000) and status["running"] is None
    assert groups[-1] not in runner.schedule._last, "a skipped scrub is no scrub"  # type: ignore[union-attr]
    found = [fields for event, fields in lines if event == "scheduled_scrub_found"]
    assert len(found) == VERDICTS_KEPT + 5
    assert {"group_id", "topic", "partition", "status", "ranges", "repair_started"} <= set(found[0])
    assert [fields["partition"] for event, fields in lines if event == "scheduled_scrub_skipped"] == [int(groups[-1])]
    assert runner.step() is None, "each at most once per interval"


def test_off_means_no_task_work() -> None:
    runner = ScheduledScrubs(1, _Scrubber({}), _Registry(_groups(3)), None, _Logger([]))  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(runner.run(), 1))  # returns at once
    assert runner.status()["interval_s"] is None and runner.status()["partitions_scheduled"] == 0


def test_the_byte_rate_holds_over_many_slices() -> None:
    # Goal: slices of 8 MiB through a 16 MiB/s pace take the time the rate says (a fake clock
    # and sleep given to the pace), and a pace of 0 never waits.
    clock = [0.0]

    async def fake_sleep(seconds: float) -> None:
        clock[0] += seconds

    pace = BytePace(16 << 20, clock=lambda: clock[0], sleep=fake_sleep)

    async def read(slices: int) -> None:
        for _ in range(slices):
            await pace.ready()
            pace.spent(8 << 20)

    asyncio.run(read(41))  # 328 MiB: the first slice goes at once, the other 40 wait off their debt
    assert 19.9 <= clock[0] <= 20.1 and pace.bytes == 41 * (8 << 20)
    unlimited = BytePace(0, clock=lambda: clock[0], sleep=fake_sleep)
    before = clock[0]
    asyncio.run(unlimited.ready())
    unlimited.spent(1 << 30)
    assert clock[0] == before


def test_a_failed_scrub_is_recorded_and_the_task_goes_on() -> None:
    # Goal: a scheduled scrub failing with anything but a ClientError (a bug, a read the
    # storage refused) is recorded `unreachable` with its detail, and the runner goes on to the
    # next partition: one partition never ends the task (the supervisor would restart it).
    groups = _groups(3)
    scrubber = _Scrubber({int(groups[0]): "bug"})
    clock = [NOW]
    runner = ScheduledScrubs(1, scrubber, _Registry(groups), ScrubSchedule(INTERVAL_S, random.Random(9)),  # type: ignore[arg-type]
                             _Logger([]), clock=lambda: clock[0])

    async def scrub_all() -> None:
        runner.step()
        clock[0] = NOW + INTERVAL_S
        while (group_id := runner.step()) is not None and len(scrubber.calls) < 10:
            await runner.scrub(group_id)

    asyncio.run(asyncio.wait_for(scrub_all(), 30))
    assert {p for _, p, _, _ in scrubber.calls} == {int(g) for g in groups}
    assert runner.results.verdicts[UNREACHABLE] == 1 and runner.results.verdicts[IDENTICAL] == 2
    (failed,) = runner.status()["latest_not_identical"]
    assert failed["replicas"][0]["detail"] == "AssertionError: index 1 precedes every segment"
    schedule = runner.schedule
    assert schedule is not None and groups[0] not in schedule._last, "a failed scrub is no scrub"
    assert groups[1] in schedule._last and groups[2] in schedule._last
    due = schedule.due_at(groups[0])
    assert due is not None and due >= NOW + 2 * INTERVAL_S, "not retried in a loop: one interval on"


def test_only_a_finished_scrub_counts() -> None:
    # Goal: a scrub cut short (the group not led when its turn came, or skipped mid-walk) leaves
    # the last scrub known as it was (a new sync of the group after a handover would start
    # from it) and is due again within RETRY_S; a finished one is due one interval on.
    schedule = ScrubSchedule(INTERVAL_S, random.Random(10))
    a, b = _groups(2)
    schedule.sync([a, b], {a, b}, NOW)
    schedule.done(a, NOW + 1)
    schedule.again(a, NOW + 2, soon=True)
    due = schedule.due_at(a)
    assert schedule._last[a] == NOW + 1 and due is not None and NOW + 2 < due <= NOW + 2 + RETRY_S
    schedule.again(b, NOW + 3, soon=False)
    assert b not in schedule._last and schedule.due_at(b) == NOW + 3 + INTERVAL_S
    schedule.sync([b], {a, b}, NOW + 4)
    schedule.again(a, NOW + 5, soon=True)  # led no more: nothing to reschedule
    assert schedule.due_at(a) is None and schedule._last[a] == NOW + 1
    registry = _Registry([a])
    runner = ScheduledScrubs(1, _Scrubber({}), registry, ScrubSchedule(INTERVAL_S, random.Random(11)),  # type: ignore[arg-type]
                             _Logger([]), clock=lambda: NOW)
    runner.step()
    del registry.led.items_[a]  # its turn comes, but this node no longer leads it (not synced yet)
    assert asyncio.run(runner.scrub(a)) is None
    assert runner.schedule is not None and a not in runner.schedule._last
    assert NOW < (runner.schedule.due_at(a) or 0) <= NOW + RETRY_S
