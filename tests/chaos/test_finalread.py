"""The final read (chaos/finalread.py) against fake replicas and a fake clock: it must
not stop short of what the history saw, and when it cannot get there in time, the
verdict is `final-read-incomplete`, never `unseen`."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable

import pytest

from chaos.checker import check
from chaos.finalread import (
    FINAL_PROCESS,
    FinalRead,
    FinalReader,
    FinalReadLimits,
    ReadAnswer,
    ReadFailed,
    Target,
    confirmed_leader,
    targets_of,
)
from chaos.history import Outcome, PartitionKey, Poll, Record
from chaos.history_file import parse_history
from chaos.history_writer import HistoryWriter

K = PartitionKey("chaos-a", 0)
LIMITS = FinalReadLimits(budget_s=10.0, retry_s=0.5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeReplicas:
    """Each node's committed log as a function of the fake time, and a script of who a
    majority names as leader (one answer per ask; the last one repeats)."""

    def __init__(self, clock: FakeClock, logs: dict[int, Callable[[float], list[Record]]],
                 leaders: list[int | None], failing: frozenset[int] = frozenset()) -> None:
        self.clock, self.logs, self.leaders, self.failing = clock, logs, list(leaders), failing
        self.asked: list[tuple[int, int]] = []  # (node, position) of every read

    async def leader(self, key: PartitionKey) -> int | None:
        return self.leaders.pop(0) if len(self.leaders) > 1 else self.leaders[0]

    async def read(self, key: PartitionKey, node: int, position: int) -> ReadAnswer:
        self.asked.append((node, position))
        if node in self.failing:
            raise ReadFailed("UNAVAILABLE")
        log = self.logs[node](self.clock.now)
        records = tuple(r for r in log if r[0] >= position)[:3]  # small answers: several reads
        next_offset = records[-1][0] + 1 if records else position
        return ReadAnswer(records=records, next_offset=next_offset, high_watermark=len(log))

    def label(self, node: int) -> str:
        return f"n{node}#1"


def log_of(count: int) -> list[Record]:
    return [(offset, 1000 + offset) for offset in range(count)]


def workload(stream: io.BytesIO, acked: int) -> HistoryWriter:
    """A history in which values 1000..1000+acked-1 were acknowledged at offsets 0..acked-1."""
    history = HistoryWriter(stream, clock=lambda: 0.0)
    for offset in range(acked):
        index = history.invoke_send(1, K, [1000 + offset])
        history.ok_send(index, [offset])
    return history


def final_read(replicas: FakeReplicas, clock: FakeClock, history: HistoryWriter,
               stream: io.BytesIO) -> FinalRead:
    """The runner's way: targets from the history written so far, then the read."""
    history.flush()
    targets = targets_of(parse_history(stream.getvalue().splitlines()))
    reader = FinalReader(replicas, history, limits=LIMITS, clock=clock, sleep=clock.sleep)
    [result] = asyncio.run(reader.read_all([K], targets))
    return result


def test_a_stale_leader_does_not_end_the_read():
    # Goal: the 600 s seed-20261126 failure in miniature. Values are acked up to offset 10;
    # the first node named leader (3) is a deposed one whose log stops at HW 6. The old
    # runner read to that node's HW and the checker called offsets 6..10 unseen. The
    # reader must ask again, continue from offset 6 on the real leader (1), and only
    # stop once an answer's HW (11) covers offset 10.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=11)
    replicas = FakeReplicas(clock, {3: lambda now: log_of(6), 1: lambda now: log_of(11)},
                            leaders=[3, 1, 1])
    result = final_read(replicas, clock, history, stream)
    assert result.complete and result.node == 1 and result.high_watermark == 11
    assert (3, 0) in replicas.asked and (1, 6) in replicas.asked  # read on from where it stopped
    history.flush()
    ops = parse_history(stream.getvalue().splitlines())
    finals = [op for op in ops if isinstance(op, Poll) and op.final]
    assert {op.node for op in finals} == {"n3#1", "n1#1"}
    assert all(op.process == FINAL_PROCESS for op in finals)
    result = check(ops)
    assert result.valid, result.anomalies
    assert "unseen" not in result.counts()


def test_the_leaders_high_watermark_is_waited_for():
    # Goal: a confirmed leader whose HW does not cover the target yet (a new leader that
    # has not committed in its term) is read again after a pause, not believed.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=8)
    replicas = FakeReplicas(clock, {2: lambda now: log_of(5 if now < 2.0 else 8)}, leaders=[2])
    result = final_read(replicas, clock, history, stream)
    assert result.complete and result.high_watermark == 8
    assert clock.now >= 2.0


def test_out_of_time_is_final_read_incomplete_not_unseen():
    # Goal: when the bound runs out short of the target, the verdict is its own class,
    # naming the node and the numbers; values beyond the HW reached are not judged
    # (the old reading called all four of them unseen), values below it still are.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=10)
    index = history.invoke_send(1, K, [555])  # acked at offset 2, which node 3 holds otherwise
    history.ok_send(index, [2])
    replicas = FakeReplicas(clock, {3: lambda now: log_of(6)}, leaders=[3])
    result = final_read(replicas, clock, history, stream)
    assert not result.complete
    assert result.explanation() == "node 3 stuck at HW 6, acked up to 9"
    assert clock.now >= LIMITS.budget_s
    history.flush()
    ops = parse_history(stream.getvalue().splitlines())
    old = check(ops)  # the checker not told: the short read reads as loss
    assert len(old.of_class("unseen")) == 5
    new = check(ops, incomplete_reads={K: result.explanation()})
    assert new.counts()["final-read-incomplete"] == 1
    [verdict] = new.of_class("final-read-incomplete")
    assert verdict.explanation.startswith("final read incomplete: node 3 stuck at HW 6, acked up to 9")
    assert "4 acknowledged values at or beyond HW 6 not judged" in verdict.explanation
    [unseen] = new.of_class("unseen")
    assert "555" in unseen.explanation  # below the HW reached: judged, and missing


def test_no_confirmed_leader_is_incomplete():
    # Goal: without any leader a majority confirms, nothing is read and the verdict says so.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=3)
    replicas = FakeReplicas(clock, {}, leaders=[None])
    result = final_read(replicas, clock, history, stream)
    assert not result.complete and result.reads == 0
    assert result.explanation().startswith("no confirmed leader answered")


def test_a_failed_read_is_recorded_and_the_leader_asked_again():
    # Goal: a node that does not answer is a failed final poll in the history, and the
    # reader moves to the leader named next instead of giving up.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=4)
    replicas = FakeReplicas(clock, {1: lambda now: log_of(4), 2: lambda now: log_of(5)},
                            leaders=[1, 2], failing=frozenset({1}))
    result = final_read(replicas, clock, history, stream)
    assert result.complete and result.node == 2
    history.flush()
    polls = [op for op in parse_history(stream.getvalue().splitlines()) if isinstance(op, Poll)]
    assert [op.outcome for op in polls] == [Outcome.FAIL, Outcome.OK, Outcome.OK]


def test_a_reached_target_without_a_confirmed_leader_is_not_complete():
    # Goal: an answer covering the target from a node no majority names as leader
    # afterwards does not end the read; the explanation says what was missing.
    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=3)
    replicas = FakeReplicas(clock, {1: lambda now: log_of(5)}, leaders=[1, None])
    result = final_read(replicas, clock, history, stream)
    assert not result.complete
    assert "no majority of replicas confirmed it as leader" in result.explanation()


def test_every_partition_gets_a_round_after_the_budget_is_spent():
    # Goal: one stuck partition spends the shared budget; the next still gets read once.
    clock = FakeClock()
    other = PartitionKey("chaos-a", 1)
    history = workload(io.BytesIO(), acked=3)
    replicas = FakeReplicas(clock, {1: lambda now: log_of(2)}, leaders=[1])
    reader = FinalReader(replicas, history, limits=LIMITS, clock=clock, sleep=clock.sleep)
    first, second = asyncio.run(reader.read_all([K, other], {K: Target(acked=2)}))
    assert not first.complete
    assert second.complete and second.reads == 1  # no target: any confirmed answer will do


def test_targets_of_takes_acked_and_read_offsets():
    # Goal: the target is the highest offset an ok send was given or an ok poll returned;
    # ambiguous sends and failed polls say nothing.
    stream = io.BytesIO()
    history = HistoryWriter(stream, clock=lambda: 0.0)
    index = history.invoke_send(1, K, [1, 2])
    history.ok_send(index, [4, 5])
    index = history.invoke_send(1, K, [3])
    history.info(index, "OUTCOME_UNKNOWN")
    index = history.invoke_poll(2, K, 0)
    history.ok_poll(index, [(6, 7)], 7)
    index = history.invoke_poll(2, K, 7)
    history.fail(index, "NOT_LEADER")
    other = PartitionKey("chaos-b", 0)
    index = history.invoke_send(1, other, [9])
    history.ok_send(index, [0])
    history.flush()
    targets = targets_of(parse_history(stream.getvalue().splitlines()))
    assert targets == {K: Target(acked=5, read=6), other: Target(acked=0)}
    assert targets[K].describe() == "acked up to 5, read up to 6"


def view(role: str, term: int, leader: int | None, replicas=(1, 2, 3)) -> dict:
    return {"role": role, "term": term, "leader": leader, "replicas": list(replicas)}


@pytest.mark.parametrize(("views", "expected"), [
    # A majority names 1 in term 5.
    ({1: view("leader", 5, 1), 2: view("follower", 5, 1), 3: view("follower", 5, 1)}, 1),
    # The deposed leader 3 (term 4) still names itself; 1 leads term 5 with 2.
    ({1: view("leader", 5, 1), 2: view("follower", 5, 1), 3: view("leader", 4, 3)}, 1),
    # 3 claims term 6 alone (it has not won yet, or is partitioned): no majority.
    ({1: view("leader", 5, 1), 2: view("follower", 5, 1), 3: view("leader", 6, 3)}, None),
    # Only the leader answered: its word alone is not enough.
    ({1: view("leader", 5, 1)}, None),
    # Nobody claims.
    ({1: view("follower", 5, None), 2: view("candidate", 6, None)}, None),
])
def test_confirmed_leader(views, expected):
    # Goal: a leader counts only when a majority of the partition's replicas name it in
    # the term it claims.
    assert confirmed_leader(views) == expected


def test_the_run_fails_on_an_incomplete_read_and_says_which():
    # Goal: the summary line fails the run on the verdict itself, under its own name and
    # with the numbers, distinguishable from a loss (no `unseen` in it); a stuck replica
    # fails it the same way.
    from pathlib import Path

    from chaos.runner import RunConfig, _summary

    clock, stream = FakeClock(), io.BytesIO()
    history = workload(stream, acked=10)
    result = final_read(FakeReplicas(clock, {3: lambda now: log_of(6)}, leaders=[3]), clock, history, stream)
    history.flush()
    checked = check(parse_history(stream.getvalue().splitlines()),
                    incomplete_reads={K: result.explanation()})
    stuck = ["replica 3 of group 5 stuck at commit 5 < 10"]
    details = {"fault_counts": {}, "replicas": {"compared": 8, "identical": 7, "stuck": stuck}}
    line, ok = _summary(RunConfig(out=Path("unused"), seed=1), details, checked)
    assert not ok
    assert "anomalies: final-read-incomplete=1;" in line and "unseen" not in line
    assert "chaos-a/0: final read incomplete: node 3 stuck at HW 6, acked up to 9" in line
    assert "replicas stuck behind their group's commit: 1 (replica 3 of group 5 stuck at commit 5 < 10)" in line
