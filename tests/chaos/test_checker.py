"""The chaos history checker and history file on hand-written and generated histories."""

from __future__ import annotations

import io
import itertools
import math
import random
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checker import ANOMALY_CLASSES, CheckLimits, CheckResult, check
from chaos.history import (
    AnyOp,
    HistoryError,
    OffsetCommit,
    OffsetFetch,
    Outcome,
    PartitionKey,
    Poll,
    ProducerStamp,
    Send,
    Value,
)
from chaos.history_file import parse_history, write_history
from chaos.history_writer import HistoryWriter

OK, FAIL, INFO = Outcome.OK, Outcome.FAIL, Outcome.INFO
K = PartitionKey("t", 0)
FINAL_PROCESS = 99


class Builder:
    """Hand-written histories: ops run one after another (each takes one second)
    unless `at=(invoke_s, complete_s)` makes them overlap."""

    def __init__(self) -> None:
        self.ops: list[AnyOp] = []
        self.clock = 0.0

    def _common(self, process: int, outcome: Outcome, at: tuple[float, float] | None) -> dict:
        if at is None:
            at = (self.clock, self.clock + 1)
            self.clock += 2
        return {
            "index": len(self.ops),
            "process": process,
            "invoke_s": at[0],
            "complete_s": at[1],
            "outcome": outcome,
        }

    def send(
        self,
        values,
        offsets=None,
        *,
        outcome=OK,
        process=0,
        key=K,
        producer=None,
        duplicate=False,
        at=None,
    ):
        offsets = tuple(offsets) if outcome is OK else ()
        op = Send(**self._common(process, outcome, at), key=key, values=tuple(values), offsets=offsets,
                  producer=producer, duplicate=duplicate)  # fmt: skip
        self.ops.append(op)
        return op.index

    def poll(
        self,
        position,
        records,
        hw,
        *,
        final=False,
        process=1,
        key=K,
        node=None,
        outcome=OK,
        at=None,
    ):
        ok = outcome is OK
        op = Poll(**self._common(process, outcome, at), key=key, position=position, final=final,
                  records=tuple(records) if ok else (), high_watermark=hw if ok else None, node=node)  # fmt: skip
        self.ops.append(op)
        return op.index

    def final_read(self, records, hw, *, key=K):
        return self.poll(0, records, hw, final=True, process=FINAL_PROCESS, key=key)

    def commit(self, offset, *, outcome=OK, process=2, group="g", key=K, at=None):
        op = OffsetCommit(**self._common(process, outcome, at), group=group, key=key, offset=offset)
        self.ops.append(op)
        return op.index

    def fetch(self, offset, *, outcome=OK, process=3, group="g", key=K, at=None):
        op = OffsetFetch(**self._common(process, outcome, at), group=group, key=key, offset=offset)
        self.ops.append(op)
        return op.index

    def check(self, **kwargs) -> CheckResult:
        return check(self.ops, **kwargs)


def clean() -> Builder:
    """Three acknowledged values, read in two polls and by the final read."""
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(0, [(0, 1), (1, 2)], 2)
    h.send([3], [2])
    h.poll(2, [(2, 3)], 3)
    h.final_read([(0, 1), (1, 2), (2, 3)], 3)
    return h


def only(result: CheckResult, name: str) -> None:
    """The result names exactly this one class."""
    assert name in ANOMALY_CLASSES
    assert set(result.counts()) == {name}, result.anomalies


def test_clean_history_has_no_anomalies():
    # Goal: a correct history passes whole: no anomaly, nothing unchecked, a "none" summary.
    h = clean()
    h.commit(3)
    h.fetch(3)
    result = h.check()
    assert result.valid, result.anomalies
    assert result.unchecked == ()
    assert result.summary() == "anomalies: none"
    assert result.stats["values-acknowledged"] == 3
    assert result.stats["send-ok"] == 2


def test_summary_counts_by_class_in_a_fixed_order():
    # Goal: the summary fragment lists each present class with its count, in ANOMALY_CLASSES order.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(0, [(0, 1), (1, 1), (2, 2)], 3)  # 1 twice, offset 1 two values, 2 at two offsets
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    assert result.counts() == {"inconsistent-offsets": 1, "duplicate": 2}
    assert result.summary() == "anomalies: inconsistent-offsets=1 duplicate=2"
    reordered = CheckResult(anomalies=result.anomalies[::-1], unchecked=("why",), stats={})
    assert reordered.summary() == "anomalies: inconsistent-offsets=1 duplicate=2 unchecked=1"
    assert not reordered.valid


def test_inconsistent_offsets():
    # Goal: two reads disagreeing about one offset are found, naming the offset, values and ops.
    h = Builder()
    h.send([1], [0])
    h.send([2], [None])
    first = h.poll(0, [(0, 1)], 1, process=1)
    second = h.poll(0, [(0, 2)], 1, process=2)
    h.final_read([(0, 1)], 1)
    result = h.check()
    assert "inconsistent-offsets" in result.counts()
    (anomaly,) = result.of_class("inconsistent-offsets")
    assert anomaly.key == K
    assert set(anomaly.ops) >= {second} and "offset 0" in anomaly.explanation
    assert first < second
    # Negative: the same two reads agreeing.
    h = Builder()
    h.send([1], [0])
    h.poll(0, [(0, 1)], 1, process=1)
    h.poll(0, [(0, 1)], 1, process=2)
    h.final_read([(0, 1)], 1)
    assert h.check().valid


def test_an_ok_answer_offset_disagreeing_with_reads_is_inconsistent():
    # Goal: offsets from ok send answers join the version order, so a lying answer shows.
    h = Builder()
    h.send([1], [0])
    h.send([2], [0])  # the server told two sends the same offset
    h.final_read([(0, 1), (1, 2)], 2)
    assert h.check().counts()["inconsistent-offsets"] == 1


def test_duplicate():
    # Goal: one value at two offsets is a duplicate (the idempotence check).
    h = Builder()
    h.send([1], [0])
    h.final_read([(0, 1), (1, 1)], 2)
    result = h.check()
    only(result, "duplicate")
    assert "value 1 at 2 offsets" in result.anomalies[0].explanation
    assert clean().check().valid


def test_unexpected():
    # Goal: a value nobody sent to this partition is unexpected, even if sent to another.
    h = Builder()
    h.send([1], [0])
    h.send([2], [0], key=PartitionKey("t", 1))
    h.final_read([(0, 1), (1, 2)], 2)
    h.final_read([(0, 2)], 1, key=PartitionKey("t", 1))
    result = h.check()
    only(result, "unexpected")
    assert result.anomalies[0].key == K
    assert clean().check().valid


def test_g1a_a_failed_send_becomes_visible():
    # Goal: a send answered fail (definitely not written) must never be read.
    h = Builder()
    h.send([1], [0])
    writer = h.send([2], outcome=FAIL)
    reader = h.poll(1, [(1, 2)], 2)
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    only(result, "G1a")
    assert result.anomalies[0].ops == (writer, reader)
    # Negative: the same send unread is fine.
    h = Builder()
    h.send([1], [0])
    h.send([2], outcome=FAIL)
    h.final_read([(0, 1)], 1)
    assert h.check().valid


def test_info_send_later_read_is_fine_and_must_then_be_whole():
    # Goal: an ambiguous send seen by a read counts as written (no anomaly, counted as
    # resolved); a batch is atomic, so its other values must then be read too.
    h = Builder()
    h.send([1, 2], outcome=INFO)
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    assert result.valid, result.anomalies
    assert result.stats["send-info-written"] == 1
    assert result.stats["values-acknowledged"] == 2
    h = Builder()
    h.send([1, 2], outcome=INFO)
    h.final_read([(0, 1)], 1)
    only(h.check(), "unseen")


def test_info_send_never_read_is_not_lost():
    # Goal: an ambiguous send nobody read is neither lost nor unseen: it may never have happened.
    h = Builder()
    h.send([1], [0])
    h.send([2], outcome=INFO)
    h.send([3], outcome=INFO, process=5, at=(10.0, math.inf))  # never completed
    h.poll(0, [(0, 1)], 1)
    h.final_read([(0, 1)], 1)
    result = h.check()
    assert result.valid, result.anomalies
    assert result.stats["send-info-unresolved"] == 2


def test_lost_write():
    # Goal: an acknowledged value below the highest index read, never read by anyone, is lost.
    h = Builder()
    lost_writer = h.send([1], [0])
    h.send([2], [1])
    reader = h.poll(1, [(1, 2)], 2)
    h.final_read([(1, 2)], 2)  # the final read agrees: offset 0 is gone
    result = h.check()
    assert result.counts()["lost-write"] == 1
    (anomaly,) = result.of_class("lost-write")
    assert anomaly.ops == (lost_writer, reader)
    assert "unseen" in result.counts() and "offset-hole" in result.counts()
    # Negative: nothing read past it, so it is not a lost-write (only unseen, by the final read).
    h = Builder()
    h.send([1], [0])
    h.send([2], [1])
    h.poll(0, [(0, 1)], 1)
    h.final_read([(0, 1)], 1)
    only(h.check(), "unseen")


def test_unseen_needs_a_final_read():
    # Goal: an acknowledged value missing from the final read is unseen; without any final
    # read of its partition the checker says it could not tell, instead of passing silently.
    h = Builder()
    h.send([1], [0])
    h.send([2], [1])
    h.final_read([(0, 1)], 1)
    result = h.check()
    only(result, "unseen")
    assert "2" in result.anomalies[0].explanation
    h = Builder()
    h.send([1], [0])
    h.poll(0, [(0, 1)], 1)
    result = h.check()
    assert result.valid
    assert result.unchecked == ("t/0: no final read",)
    assert result.summary() == "anomalies: none unchecked=1"


def test_poll_skip():
    # Goal: a poll that starts past the next existing value skipped it.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(0, [(1, 2)], 2)
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    only(result, "poll-skip")
    assert "skipping 1" in result.anomalies[0].explanation
    # Negative: a seek to 1 is a fresh position, and a hole (nothing known at an offset) is no skip.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(1, [(1, 2)], 2)
    h.send([3], [3])
    h.poll(2, [(3, 3)], 4)
    h.final_read([(0, 1), (1, 2), (3, 3)], 4)
    assert set(h.check().counts()) == {"offset-hole"}


def test_nonmonotonic_poll():
    # Goal: a poll that returns records before the position it asked for went backwards.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(1, [(0, 1), (1, 2)], 2)
    h.final_read([(0, 1), (1, 2)], 2)
    only(h.check(), "nonmonotonic-poll")
    assert clean().check().valid


def test_int_poll_skip():
    # Goal: consecutive records within one poll with a known value between them.
    h = Builder()
    h.send([1, 2, 3], [0, 1, 2])
    h.poll(0, [(0, 1), (2, 3)], 3)
    h.final_read([(0, 1), (1, 2), (2, 3)], 3)
    only(h.check(), "int-poll-skip")
    assert clean().check().valid


def test_int_nonmonotonic_poll():
    # Goal: records within one poll going backwards.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(0, [(0, 1), (1, 2), (0, 1)], 2)
    h.final_read([(0, 1), (1, 2)], 2)
    only(h.check(), "int-nonmonotonic-poll")
    assert clean().check().valid


def test_nonmonotonic_send_of_one_process():
    # Goal: a process's send landing before its own earlier acknowledged send.
    h = Builder()
    h.send([1], [1])
    h.send([2], [0])
    h.final_read([(0, 2), (1, 1)], 2)
    only(h.check(), "nonmonotonic-send")
    # Negative: after an ambiguous send, the process's next send may land first.
    h = Builder()
    h.send([1], outcome=INFO)
    h.send([2], [0])
    h.final_read([(0, 2), (1, 1)], 2)
    assert h.check().valid
    # Negative: two processes interleave freely.
    h = Builder()
    h.send([1], [1], process=0)
    h.send([2], [0], process=1)
    h.final_read([(0, 2), (1, 1)], 2)
    assert h.check().valid


def test_nonmonotonic_send_of_one_idempotent_producer():
    # Goal: batches of one producer epoch must land in sequence order, whatever process sent them.
    def stamp(sequence: int, epoch: int = 0) -> ProducerStamp:
        return ProducerStamp(producer_id=7, epoch=epoch, sequence=sequence)

    h = Builder()
    h.send([1], outcome=INFO, producer=stamp(0), process=0, at=(0, 5))
    h.send([2], [0], producer=stamp(1), process=1, at=(1, 2))
    h.final_read([(0, 2), (1, 1)], 2)
    only(h.check(), "nonmonotonic-send")
    # Negative: a new epoch restarts the order.
    h = Builder()
    h.send([1], [1], producer=stamp(0), process=0)
    h.send([2], [0], producer=stamp(0, epoch=1), process=1)
    h.final_read([(0, 2), (1, 1)], 2)
    assert h.check().valid


def test_idempotent_retry_answered_duplicate_is_fine():
    # Goal: an ambiguous idempotent batch re-sent with the same stamp and answered
    # duplicate=true with the original offsets is clean, and counted.
    stamp = ProducerStamp(producer_id=7, epoch=0, sequence=0)
    h = Builder()
    h.send([1, 2], outcome=INFO, producer=stamp)
    h.send([1, 2], [0, 1], producer=stamp, duplicate=True)
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    assert result.valid, result.anomalies
    assert result.stats["send-duplicate-answers"] == 1
    # Positive: the server wrote the retry a second time.
    h = Builder()
    h.send([1, 2], outcome=INFO, producer=stamp)
    h.send([1, 2], [2, 3], producer=stamp)
    h.final_read([(0, 1), (1, 2), (2, 1), (3, 2)], 4)
    assert h.check().counts()["duplicate"] == 2


def test_reusing_a_value_outside_a_retry_is_a_workload_bug():
    # Goal: unique values are the checker's premise; a reuse asserts rather than misleads.
    h = Builder()
    h.send([1], [0])
    h.send([1], [1])
    with pytest.raises(AssertionError, match="send one value twice"):
        h.check()
    stamp = ProducerStamp(producer_id=7, epoch=0, sequence=0)
    h = Builder()
    h.send([1], outcome=INFO, producer=stamp)
    h.send([1, 2], [0, 1], producer=stamp)
    with pytest.raises(AssertionError, match="other values"):
        h.check()


def test_int_nonmonotonic_send():
    # Goal: values of one send stored in the opposite order.
    h = Builder()
    h.send([1, 2], [1, 0])
    h.final_read([(0, 2), (1, 1)], 2)
    only(h.check(), "int-nonmonotonic-send")
    assert clean().check().valid


def test_int_send_skip():
    # Goal: one send (one batch) with another value between its values: our batches are contiguous.
    h = Builder()
    h.send([1, 2], [0, 2], process=0)
    h.send([3], [1], process=1)
    h.final_read([(0, 1), (1, 3), (2, 2)], 3)
    only(h.check(), "int-send-skip")
    assert clean().check().valid


def test_offset_hole_and_refused_ranges():
    # Goal: an offset below the final high watermark the final read never returned is a
    # hole, unless the caller says a refused batch holds it.
    h = Builder()
    h.send([1], [0])
    h.send([2], [2])
    h.final_read([(0, 1), (2, 2)], 4)
    result = h.check()
    assert [a.name for a in result.anomalies] == ["offset-hole", "offset-hole"]
    assert "offsets 1..1" in result.anomalies[0].explanation
    assert "offsets 3..3" in result.anomalies[1].explanation
    assert h.check(refused_ranges={K: [(1, 1), (3, 1)]}).valid
    assert clean().check().valid


def test_read_beyond_hw():
    # Goal: a committed-isolation poll returning an offset at or above the high watermark it reported.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(0, [(0, 1), (1, 2)], 1)
    h.final_read([(0, 1), (1, 2)], 2)
    result = h.check()
    only(result, "read-beyond-hw")
    assert "offsets 1 " in result.anomalies[0].explanation
    assert clean().check().valid


def test_nonmonotonic_hw_per_process_and_server_incarnation():
    # Goal: one process watching one server incarnation must never see the high watermark
    # fall; a lagging other server, or the same node restarted, may show a lower one.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(2, [], 2, node="n1#1")
    h.poll(2, [], 1, node="n1#1")
    h.final_read([(0, 1), (1, 2)], 2)
    only(h.check(), "nonmonotonic-hw")
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(2, [], 2, node="n1#1")
    h.poll(1, [], 1, node="n2#1")
    h.poll(1, [], 1, node="n1#2")
    h.poll(1, [], 1, node="n1#1", process=4)
    h.final_read([(0, 1), (1, 2)], 2)
    assert h.check().valid
    # No server recorded: the doc's per-process rule.
    h = Builder()
    h.send([1, 2], [0, 1])
    h.poll(2, [], 2)
    h.poll(1, [], 1)
    h.final_read([(0, 1), (1, 2)], 2)
    only(h.check(), "nonmonotonic-hw")


def test_committed_offset_stale_fetch():
    # Goal: a fetch after a commit completed must see it (or a later one).
    h = Builder()
    h.commit(5)
    h.commit(7)
    stuck = h.fetch(5)
    result = h.check()
    only(result, "committed-offset-nonlinearizable")
    assert result.anomalies[0].ops == (stuck,)
    assert "group g" in result.anomalies[0].explanation
    h = Builder()
    h.commit(5)
    h.commit(7)
    h.fetch(7)
    assert h.check().valid


def test_committed_offset_fetch_before_any_commit():
    # Goal: a fetch that finished before any commit began must see none (None);
    # one concurrent with the commit may see either.
    h = Builder()
    h.fetch(5, at=(0.0, 1.0))
    h.commit(5, at=(2.0, 3.0))
    only(h.check(), "committed-offset-nonlinearizable")
    h = Builder()
    h.commit(5, at=(0.0, 3.0))
    h.fetch(5, at=(1.0, 2.0), process=3)
    h.fetch(None, at=(1.0, 2.0), process=4)
    h.fetch(5, at=(4.0, 5.0))
    assert h.check().valid


def test_committed_offset_concurrent_fetches_must_agree_on_an_order():
    # Goal: two sequential fetches during one commit cannot see new-then-old (the WGL search
    # has to backtrack to find that no order fits).
    h = Builder()
    h.commit(1)
    h.commit(2, at=(10.0, 20.0))
    h.fetch(2, at=(11.0, 12.0), process=3)
    h.fetch(1, at=(13.0, 14.0), process=4)
    only(h.check(), "committed-offset-nonlinearizable")
    h = Builder()
    h.commit(1)
    h.commit(2, at=(10.0, 20.0))
    h.fetch(1, at=(11.0, 12.0), process=3)
    h.fetch(2, at=(13.0, 14.0), process=4)
    assert h.check().valid


def test_committed_offset_ambiguous_and_failed_commits():
    # Goal: an ambiguous commit may take effect any time after its invocation, even after
    # its timeout; a failed one never does.
    h = Builder()
    h.commit(1)
    h.commit(2, outcome=INFO)
    h.fetch(1)
    h.fetch(2)
    assert h.check().valid
    h = Builder()
    h.commit(1)
    h.commit(2, outcome=FAIL)
    h.fetch(2)
    only(h.check(), "committed-offset-nonlinearizable")
    # Groups are separate registers.
    h = Builder()
    h.commit(1, group="a")
    h.commit(2, group="b")
    h.fetch(1, group="a")
    assert h.check().valid


def test_committed_offset_search_is_bounded():
    # Goal: a register history beyond the op cap or the step budget is reported unchecked, not passed.
    h = Builder()
    for offset in range(6):
        h.commit(offset, at=(0.0, 100.0), process=10 + offset)
    h.fetch(5, at=(101.0, 102.0))
    h.fetch(4, at=(103.0, 104.0))  # wrong: forces the search to try every order
    result = h.check(limits=CheckLimits(register_ops_max=5))
    assert result.valid
    assert result.unchecked == ("group g t/0: 8 offset ops, over 5",)
    result = h.check(limits=CheckLimits(register_steps_max=50))
    assert result.unchecked == ("group g t/0: search over 50 steps",)
    only(h.check(), "committed-offset-nonlinearizable")


def brute_force_linearizable(ops: list[AnyOp]) -> bool:
    """Try every order of the ops that respects real time (a before b when a completed
    strictly before b was invoked); an ambiguous commit completes at infinity."""
    entries = []
    for op in ops:
        if isinstance(op, OffsetCommit) and op.outcome is not FAIL:
            entries.append(
                (op.invoke_s, op.complete_s if op.outcome is OK else math.inf, True, op.offset)
            )
        elif isinstance(op, OffsetFetch) and op.outcome is OK:
            entries.append((op.invoke_s, op.complete_s, False, op.offset))
    for order in itertools.permutations(entries):
        if any(
            later[1] < earlier[0] for n, earlier in enumerate(order) for later in order[n + 1 :]
        ):
            continue
        state = None
        for _, _, is_write, value in order:
            if is_write:
                state = value
            elif value != state:
                break
        else:
            return True
    return False


register_op = st.tuples(
    st.sampled_from(["commit", "fetch"]),
    st.sampled_from([None, 0, 1, 2]),
    st.integers(0, 10),
    st.integers(0, 5),
    st.sampled_from([OK, OK, INFO, FAIL]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(register_op, min_size=1, max_size=6))
def test_offset_register_search_agrees_with_brute_force(drawn):
    # Goal: the WGL search answers exactly as trying every real-time order does.
    h = Builder()
    for process, (kind, value, invoke_s, duration, outcome) in enumerate(drawn):
        at = (float(invoke_s), float(invoke_s + duration))
        if kind == "commit":
            h.commit(0 if value is None else value, outcome=outcome, process=process, at=at)
        else:
            fetched = value if outcome is OK else None
            h.fetch(fetched, outcome=INFO if outcome is FAIL else outcome, process=process, at=at)
    found = "committed-offset-nonlinearizable" in h.check().counts()
    assert found == (not brute_force_linearizable(h.ops))


# ---------------------------------------------------------------------------
# The history file.


def test_writer_and_reader_round_trip():
    # Goal: what the writer writes reads back as the same ops, and an op left open reads as info.
    ticks = iter(range(100))
    stream = io.BytesIO()
    writer = HistoryWriter(stream, clock=lambda: float(next(ticks)))
    stamp = ProducerStamp(producer_id=3, epoch=1, sequence=4)
    send = writer.invoke_send(0, K, [1, 2], producer=stamp)
    poll = writer.invoke_poll(1, K, 0, final=True)
    writer.ok_send(send, [0, None], duplicate=True)
    writer.ok_poll(poll, [(0, 1)], 1, node="n1#1")
    commit = writer.invoke_commit(0, "g", K, 1)
    fetch = writer.invoke_fetch(1, "g", K)
    writer.info(commit, "TIMEOUT")
    writer.ok_fetch(fetch, None)
    failed = writer.invoke_send(0, K, ["s"])
    writer.fail(failed, "NOT_ENOUGH_REPLICAS")
    open_op = writer.invoke_poll(2, K, 5)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11
    ops = parse_history(lines)
    assert [op.index for op in ops] == [send, poll, commit, fetch, failed, open_op]
    assert ops[0] == Send(index=0, process=0, invoke_s=0.0, complete_s=2.0, outcome=OK, key=K, values=(1, 2),
                          producer=stamp, offsets=(0, None), duplicate=True)  # fmt: skip
    assert ops[1].records == ((0, 1),) and ops[1].final and ops[1].node == "n1#1"
    assert ops[2].outcome is INFO and ops[2].error == "TIMEOUT"
    assert ops[3].offset is None and ops[3].outcome is OK
    assert ops[4].outcome is FAIL and ops[4].values == ("s",)
    assert ops[5].outcome is INFO and ops[5].complete_s == math.inf
    rewritten = io.BytesIO()
    write_history(rewritten, ops)
    assert parse_history(rewritten.getvalue().splitlines()) == ops


def test_writer_file_is_flushed_on_close(tmp_path):
    # Goal: `open` writes a real file, complete once closed.
    path = tmp_path / "history.jsonl"
    with HistoryWriter.open(path) as writer:
        writer.ok_commit(writer.invoke_commit(0, "g", K, 0))
    (op,) = parse_history(path.read_bytes().splitlines())
    assert isinstance(op, OffsetCommit) and op.outcome is OK and op.complete_s >= op.invoke_s


def test_writer_asserts_on_runner_bugs():
    # Goal: a second op on a busy process, or a completion of the wrong kind, is a runner bug.
    writer = HistoryWriter(io.BytesIO(), clock=lambda: 0.0)
    index = writer.invoke_poll(0, K, 0)
    with pytest.raises(AssertionError, match="already has an op open"):
        writer.invoke_send(0, K, [1])
    with pytest.raises(AssertionError, match="completed as a send"):
        writer.ok_send(index, [0])
    send = writer.invoke_send(1, K, [1, 2])
    with pytest.raises(AssertionError, match="2 values, 1 offsets"):
        writer.ok_send(send, [0])


@pytest.mark.parametrize(
    "lines, message",
    [
        ([b"{"], "not JSON"),
        ([b'{"type":"ok","index":0,"process":0,"time":1}'], "never invoked"),
        ([b'{"type":"invoke","index":0,"process":0,"time":1,"f":"send","topic":"t","partition":0,"values":[]}'],
         "no values"),
        ([b'{"type":"invoke","index":0,"process":0,"time":1,"f":"send","topic":"t","partition":0,"values":[true]}'],
         "not an int"),
        ([b'{"type":"invoke","index":0,"process":0,"time":1,"f":"poll","topic":"t","partition":0,"position":0}',
          b'{"type":"ok","index":0,"process":0,"time":2,"records":[]}'], "high watermark"),
        ([b'{"type":"invoke","index":0,"process":0,"time":1,"f":"fetch"}'], "malformed"),
        ([b'{"type":"invoke","index":0,"process":0,"time":2,"f":"fetch","group":"g","topic":"t","partition":0}',
          b'{"type":"ok","index":0,"process":0,"time":1,"offset":3}'], "before it is invoked"),
    ],
)  # fmt: skip
def test_reader_rejects_malformed_histories(lines, message):
    # Goal: a broken history file is a HistoryError naming what is wrong, never a silent pass.
    with pytest.raises(HistoryError, match=message):
        parse_history(lines)


# ---------------------------------------------------------------------------
# Generated histories of a correct log.


@dataclass
class _Pending:
    index: int  # allocated at invocation, as the HistoryWriter does
    kind: str
    invoke_s: float
    fields: dict


@dataclass
class _Retry:
    """An ambiguous idempotent batch its process must re-send unchanged."""

    key: PartitionKey
    sequence: int
    values: tuple[Value, ...]
    offsets: tuple[int, ...] | None  # where the first attempt was written, if it was


@dataclass
class CorrectCluster:
    """A correct log served by two nodes whose high watermarks lag but never fall, driven
    by processes that each run one op at a time; every op takes effect at its completion."""

    rng: random.Random
    keys: list[PartitionKey]
    processes: int
    ops: list[AnyOp] = field(default_factory=list)
    clock: float = 0.0
    logs: dict[PartitionKey, list[Value]] = field(default_factory=dict)
    node_hw: dict[tuple[str, PartitionKey], int] = field(default_factory=dict)
    registers: dict[PartitionKey, int | None] = field(default_factory=dict)
    pending: dict[int, _Pending] = field(default_factory=dict)  # process -> open op
    positions: dict[tuple[int, PartitionKey], int] = field(default_factory=dict)
    retry: dict[int, _Retry] = field(default_factory=dict)  # process -> batch to re-send
    sequences: dict[int, int] = field(default_factory=dict)
    next_value: int = 0
    next_index: int = 0

    def run(self, ops_count: int) -> list[AnyOp]:
        while len(self.ops) < ops_count:
            self.clock += self.rng.random()
            process = self.rng.randrange(self.processes)
            if process in self.pending:
                self._complete(process, self.clock)
            else:
                self._invoke(process)
        for process in sorted(self.pending):
            self._complete(process, math.inf if self.rng.random() < 0.3 else self.clock + 1)
        self._final_reads()
        return sorted(self.ops, key=lambda op: op.index)

    def _invoke(self, process: int) -> None:
        key = self.rng.choice(self.keys)
        roll = self.rng.random()
        if process in self.retry or roll < 0.4:
            kind, fields = "send", self._send_fields(process, key)
        elif roll < 0.8:
            node = self.rng.choice(("n1", "n2"))
            hw = self.node_hw.get((node, key), 0)
            position = self.positions.get((process, key), 0)
            if self.rng.random() < 0.1:
                position = self.rng.randint(0, hw)
            kind, fields = "poll", {"key": key, "position": position, "node": node}
        elif roll < 0.9:
            kind, fields = (
                "commit",
                {"key": key, "offset": self.rng.randint(0, len(self.logs.get(key, [])))},
            )
        else:
            kind, fields = "fetch", {"key": key}
        self.pending[process] = _Pending(self.next_index, kind, self.clock, fields)
        self.next_index += 1

    def _send_fields(self, process: int, key: PartitionKey) -> dict:
        idempotent = process % 2 == 0
        retry = self.retry.get(process)
        if retry is not None:
            key, sequence, values = retry.key, retry.sequence, retry.values
        else:
            values = tuple(range(self.next_value, self.next_value + self.rng.randint(1, 4)))
            self.next_value += len(values)
            sequence = self.sequences.get(process, 0)
            self.sequences[process] = sequence + 1
        stamp = (
            ProducerStamp(producer_id=process, epoch=0, sequence=sequence) if idempotent else None
        )
        return {"key": key, "values": values, "producer": stamp}

    def _complete(self, process: int, complete_s: float) -> None:
        pending = self.pending.pop(process)
        outcome = OK if complete_s != math.inf and self.rng.random() < 0.85 else INFO
        common = {"index": pending.index, "process": process, "invoke_s": pending.invoke_s,
                  "complete_s": complete_s, "outcome": outcome}  # fmt: skip
        complete = getattr(self, f"_complete_{pending.kind}")
        self.ops.append(complete(process, common, **pending.fields))

    def _append(self, key: PartitionKey, values: tuple[Value, ...]) -> tuple[int, ...]:
        log = self.logs.setdefault(key, [])
        log.extend(values)
        self._advance(key)
        return tuple(range(len(log) - len(values), len(log)))

    def _advance(self, key: PartitionKey) -> None:
        """Each node's high watermark moves up toward the log end, at its own pace."""
        for node in ("n1", "n2"):
            if self.rng.random() < 0.7:
                self.node_hw[node, key] = len(self.logs.get(key, []))

    def _complete_send(self, process, common, key, values, producer) -> Send:
        earlier = self.retry.pop(process, None)
        if earlier is not None and earlier.offsets is not None:  # the first attempt was written
            if common["outcome"] is not OK:
                return Send(**common, key=key, values=values, producer=producer)
            return Send(
                **common,
                key=key,
                values=values,
                producer=producer,
                offsets=earlier.offsets,
                duplicate=True,
            )
        if common["outcome"] is OK:
            return Send(
                **common,
                key=key,
                values=values,
                producer=producer,
                offsets=self._append(key, values),
            )
        if producer is None and common["complete_s"] != math.inf and self.rng.random() < 0.3:
            return Send(
                **common | {"outcome": FAIL}, key=key, values=values
            )  # refused, not written
        written = self._append(key, values) if self.rng.random() < 0.5 else None
        if producer is not None and common["complete_s"] != math.inf:
            self.retry[process] = _Retry(key, producer.sequence, values, written)
        return Send(**common, key=key, values=values, producer=producer)

    def _complete_poll(self, process, common, key, position, node) -> Poll:
        self._advance(key)
        hw = self.node_hw.get((node, key), 0)
        if common["outcome"] is not OK:
            return Poll(**common, key=key, position=position)
        if position > hw:  # OFFSET_OUT_OF_RANGE: a lagging node behind this process's position
            return Poll(**common | {"outcome": FAIL}, key=key, position=position)
        end = min(hw, position + self.rng.randint(0, 5))
        records = tuple((offset, self.logs[key][offset]) for offset in range(position, end))
        self.positions[process, key] = end
        return Poll(
            **common,
            key=key,
            position=position,
            records=records,
            high_watermark=hw,
            node=f"{node}#1",
        )

    def _complete_commit(self, process, common, key, offset) -> OffsetCommit:
        if common["outcome"] is OK or self.rng.random() < 0.5:
            self.registers[key] = offset
        return OffsetCommit(**common, group="g", key=key, offset=offset)

    def _complete_fetch(self, process, common, key) -> OffsetFetch:
        offset = self.registers.get(key) if common["outcome"] is OK else None
        return OffsetFetch(**common, group="g", key=key, offset=offset)

    def _final_reads(self) -> None:
        """Heal: every node catches up; one process reads each partition from 0 in pages."""
        for key in self.keys:
            log = self.logs.get(key, [])
            for position in range(0, max(len(log), 1), 7):
                self.clock += 1
                records = tuple(
                    (offset, log[offset]) for offset in range(position, min(position + 7, len(log)))
                )
                self.ops.append(Poll(index=self.next_index, process=self.processes, invoke_s=self.clock,
                                     complete_s=self.clock + 0.5, outcome=OK, key=key, position=position,
                                     final=True, records=records, high_watermark=len(log), node="n1#1"))  # fmt: skip
                self.next_index += 1


def generated(seed: int, ops_count: int, keys: int = 2, processes: int = 6) -> list[AnyOp]:
    cluster = CorrectCluster(
        random.Random(seed), [PartitionKey("t", p) for p in range(keys)], processes
    )
    return cluster.run(ops_count)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ops_count=st.integers(1, 300),
    keys=st.integers(1, 3),
    processes=st.integers(1, 8),
)
def test_generated_clean_history_has_no_anomalies(seed, ops_count, keys, processes):
    # Goal: any history of a correct log (lagging followers, ambiguous and failed ops,
    # idempotent retries, overlapping offset ops) passes, also after a round trip through the file.
    ops = generated(seed, ops_count, keys, processes)
    result = check(ops)
    assert result.valid, result.anomalies[:5]
    assert result.unchecked == ()
    stream = io.BytesIO()
    write_history(stream, ops)
    assert parse_history(stream.getvalue().splitlines()) == sorted(ops, key=lambda op: op.index)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_generated_history_with_a_record_dropped_from_the_final_read_fails(seed, data):
    # Goal: the checker is not vacuous on generated histories: drop one record from the
    # final read and the run must fail (the offset is a hole below the high watermark).
    ops = generated(seed, 200)
    finals = [op for op in ops if isinstance(op, Poll) and op.final and op.records]
    if not finals:
        return
    victim = data.draw(st.sampled_from(finals))
    position = data.draw(st.integers(0, len(victim.records) - 1))
    records = victim.records[:position] + victim.records[position + 1 :]
    mutated = [replace(op, records=records) if op is victim else op for op in ops]
    assert "offset-hole" in check(mutated).counts()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_generated_history_with_a_record_value_changed_fails(seed, data):
    # Goal: one poll that reports a wrong value at one offset is always caught: the
    # final read disagrees with it about that offset.
    ops = generated(seed, 200)
    polls = [op for op in ops if isinstance(op, Poll) and op.records and not op.final]
    if not polls:
        return
    victim = data.draw(st.sampled_from(polls))
    position = data.draw(st.integers(0, len(victim.records) - 1))
    offset, value = victim.records[position]
    wrong = data.draw(st.integers(-5, 10_000).filter(lambda candidate: candidate != value))
    records = (*victim.records[:position], (offset, wrong), *victim.records[position + 1 :])
    mutated = [replace(op, records=records) if op is victim else op for op in ops]
    assert "inconsistent-offsets" in check(mutated).counts()


def test_large_clean_history_is_checked():
    # Goal: the checker copes with a long run (100k ops; CHAOS runs make about 200k).
    # Asserts the answer, not the time: timing is for the benchmark, not for a shared CI box.
    ops = generated(seed=1, ops_count=100_000, keys=8, processes=16)
    result = check(ops)
    assert result.valid, result.anomalies[:5]
    assert result.stats["send-ok"] > 10_000
