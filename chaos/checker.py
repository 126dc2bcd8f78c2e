"""The history checker: does a chaos history show raftlog breaking its promise?

A port of Jepsen's queue checker (`jepsen.tests.kafka`, CHAOS.md 2.3) plus the
stricter checks our log allows (CHAOS.md 2.4, 5.3). Everything is derived from
one *version order* per partition (`_VersionOrder`): which value sits at which
offset, according to every ok poll and every send that must have committed (an
ok send, or an ambiguous one some poll saw a value of). Offsets with no known
value are dropped and the rest numbered 0, 1, 2... (the *dense index*), so
"skipped over" and "went backwards" are measured in values that exist, and a
hole (a refused duplicate batch keeps its offsets, `docs/node.md`) is not
mistaken for a skip. One pass builds it; every check after is a linear pass.

Classes (a single one fails a run):

- `inconsistent-offsets`: one offset holds two different values.
- `duplicate`: one value sits at two offsets (the idempotence check).
- `unexpected`: a poll read a value nobody sent to that partition.
- `G1a`: a poll read a value whose every send failed (a refused write is visible).
- `lost-write`: an acknowledged value below the highest index anyone read was
  never read (Jepsen's bound; conservative when offsets disagree).
- `unseen`: an acknowledged value the final full read did not return. Only this
  tells lost from late, which is why runs end with that read.
- `final-read-incomplete`: the runner's final read of a partition never covered
  the highest offset the history saw (chaos/finalread.py says why: a node stuck
  at a high watermark, no confirmed leader). Not a loss found, a check that could
  not finish; for that partition, `unseen` judges only values at offsets below
  the high watermark the read reached.
- `poll-skip` / `nonmonotonic-poll`: a poll asked for `position` and got a first
  record past the next existing value (skipping some) or before it. Our polls
  use manual positions, so the consumer's position *is* Jepsen's "last value the
  previous op read": the runner continues at the last offset + 1 or seeks.
- `int-poll-skip` / `int-nonmonotonic-poll`: consecutive records within a poll.
- `nonmonotonic-send`: a send landed at or before a value of an earlier send
  it had to follow: for plain sends, the last *ok* send of the same process
  (acknowledged before this one was invoked; an ambiguous one may land anywhere);
  for idempotent sends, the previous sequence of the same producer and epoch
  (the server refuses out-of-order sequences, even across retries).
- `int-nonmonotonic-send` / `int-send-skip`: values within one send out of order,
  or with other values between them. Jepsen reports `int-send-skip` for
  information only, because a Kafka send may span interleaved producer batches;
  our send is one batch to one partition, appended whole at consecutive offsets,
  so a gap inside it is a bug.
- `offset-hole`: an offset below the final read's high watermark that the final
  read did not return (beyond the refused ranges the caller says are legal).
- `read-beyond-hw`: a (committed-isolation) poll returned an offset at or above
  the high watermark it reported.
- `nonmonotonic-hw`: a process saw a partition's high watermark go down on one
  server incarnation. Followers lag and a restarted node re-applies its log, so
  only one incarnation's view must grow; with no node recorded, per process.
- `committed-offset-nonlinearizable`: a group's commit/fetch ops on one partition
  admit no linearization as a register (a Wing-Gong search with Lowe's memo).

Not checked, on purpose: Jepsen's ext-send-skip (other producers interleave
legitimately), `precommitted-read` and the Elle cycle classes (`G0`, `G1c` and
their process/realtime variants): CHAOS.md 2.3 and 5.3 define them over
transactions, and our API has none, so no op has both reads and writes to make
a dependency edge between completions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from chaos.history import (
    AnyOp,
    OffsetCommit,
    OffsetFetch,
    Outcome,
    PartitionKey,
    Poll,
    Send,
    Value,
)

ANOMALY_CLASSES = (
    "inconsistent-offsets",
    "duplicate",
    "unexpected",
    "G1a",
    "lost-write",
    "unseen",
    "final-read-incomplete",
    "poll-skip",
    "nonmonotonic-poll",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "nonmonotonic-send",
    "int-nonmonotonic-send",
    "int-send-skip",
    "offset-hole",
    "read-beyond-hw",
    "nonmonotonic-hw",
    "committed-offset-nonlinearizable",
)

# Values or ops named in one explanation; the rest are counted.
LISTED_MAX = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    name: str
    key: PartitionKey
    explanation: str
    ops: tuple[int, ...]  # indices of the ops involved

    def __post_init__(self) -> None:
        assert self.name in ANOMALY_CLASSES, self.name


def _anomaly(name: str, key: PartitionKey, explanation: str, ops: Iterable[int]) -> Anomaly:
    return Anomaly(name=name, key=key, explanation=explanation, ops=tuple(ops))


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckLimits:
    """Bounds on the linearizability search, which is exponential in the worst case.

    A per-key register history is mostly sequential (one consumer commits, then
    fetches), where the search takes about two steps per op; the bounds only cut
    off pathological concurrency, which is reported as unchecked, not as passed.
    """

    register_ops_max: int = 10_000
    register_steps_max: int = 1_000_000
    register_memo_bytes_max: int = 256 << 20

    def __post_init__(self) -> None:
        assert self.register_ops_max > 0
        assert self.register_steps_max > 0
        assert self.register_memo_bytes_max > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    anomalies: tuple[Anomaly, ...]
    # What could not be decided, and why (a search over budget, no final read).
    unchecked: tuple[str, ...]
    stats: Mapping[str, int]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        """Anomalies per class, in `ANOMALY_CLASSES` order, only classes present."""
        counts = Counter(anomaly.name for anomaly in self.anomalies)
        return {name: counts[name] for name in ANOMALY_CLASSES if counts[name]}

    def of_class(self, name: str) -> list[Anomaly]:
        assert name in ANOMALY_CLASSES, name
        return [anomaly for anomaly in self.anomalies if anomaly.name == name]

    def summary(self) -> str:
        """The fragment for the runner's `chaos:` line, e.g. `anomalies: lost-write=2 duplicate=1`."""
        counts = self.counts()
        text = " ".join(f"{name}={count}" for name, count in counts.items()) or "none"
        if self.unchecked:
            text += f" unchecked={len(self.unchecked)}"
        return f"anomalies: {text}"


@dataclass(slots=True)
class _VersionOrder:
    """One partition's log as the history shows it, with who claimed what first."""

    at_offset: dict[int, tuple[Value, int]] = field(default_factory=dict)  # offset -> (value, op)
    offset_of: dict[Value, int] = field(default_factory=dict)  # value -> first offset seen
    conflicts: dict[int, dict[Value, int]] = field(default_factory=dict)  # offset -> value -> op
    duplicates: dict[Value, dict[int, int]] = field(default_factory=dict)  # value -> offset -> op
    read_by: dict[Value, int] = field(default_factory=dict)  # value -> first ok poll that read it
    # Set by `finish`:
    offsets: list[int] = field(default_factory=list)
    index_of_offset: dict[int, int] = field(default_factory=dict)
    first_index: dict[Value, int] = field(default_factory=dict)

    def claim(self, offset: int, value: Value, op: int) -> None:
        """Record that op saw (or was told) value at offset. Inlined in `_add_polls`."""
        claimed = self.at_offset.get(offset)
        if claimed is None:
            self.at_offset[offset] = (value, op)
        elif claimed[0] != value:
            self.conflict(offset, value, op)
        seen = self.offset_of.get(value)
        if seen is None:
            self.offset_of[value] = offset
        elif seen != offset:
            self.duplicate(value, offset, op)

    def conflict(self, offset: int, value: Value, op: int) -> None:
        first_value, first_op = self.at_offset[offset]
        self.conflicts.setdefault(offset, {first_value: first_op}).setdefault(value, op)

    def duplicate(self, value: Value, offset: int, op: int) -> None:
        first_offset = self.offset_of[value]
        offsets = self.duplicates.setdefault(value, {first_offset: self.at_offset[first_offset][1]})
        offsets.setdefault(offset, op)

    def finish(self) -> None:
        self.offsets = sorted(self.at_offset)
        self.index_of_offset = {offset: index for index, offset in enumerate(self.offsets)}
        index_of = self.index_of_offset
        self.first_index = {value: index_of[offset] for value, offset in self.offset_of.items()}
        for value, offsets in self.duplicates.items():
            self.first_index[value] = min(index_of[offset] for offset in offsets)

    def last_index(self, value: Value) -> int | None:
        offsets = self.duplicates.get(value)
        if offsets is None:
            return self.first_index.get(value)
        return max(self.index_of_offset[offset] for offset in offsets)

    def value_at(self, index: int) -> Value:
        return self.at_offset[self.offsets[index]][0]


@dataclass(slots=True)
class _FinalRead:
    """What the final phase read of one partition."""

    values: set[Value] = field(default_factory=set)
    offsets: set[int] = field(default_factory=set)
    high_watermark: int = 0
    ops: list[int] = field(default_factory=list)


def check(
    history: Iterable[AnyOp],
    *,
    refused_ranges: Mapping[PartitionKey, Iterable[tuple[int, int]]] | None = None,
    incomplete_reads: Mapping[PartitionKey, str] | None = None,
    limits: CheckLimits | None = None,
) -> CheckResult:
    """Check a whole history. `refused_ranges` (base offset, count) per partition:
    batches the server refused on apply, whose offsets no read returns (from the
    end-of-run debug dump); without them such a range shows as an `offset-hole`.
    `incomplete_reads`: partitions whose final read ran out of time before covering
    the history, with the reader's explanation (`final-read-incomplete`)."""
    limits = limits or CheckLimits()
    split = _split(history)
    sends, polls = split.sends, split.ok_polls
    writers = _writers(sends)
    orders: dict[PartitionKey, _VersionOrder] = defaultdict(_VersionOrder)
    _add_polls(orders, polls)
    acknowledged = _acknowledged(sends, orders)
    _add_sends(orders, sends)
    for order in orders.values():
        order.finish()
    finals = _final_reads(polls)
    incomplete = incomplete_reads or {}
    not_judged = _not_judged(finals, orders, acknowledged, incomplete)
    anomalies = [
        *_log_anomalies(orders),
        *_read_validity(orders, writers),
        *_lost_writes(orders, acknowledged),
        *_unseen(finals, acknowledged, not_judged),
        *_incomplete_reads(finals, not_judged, incomplete),
        *_offset_holes(finals, refused_ranges or {}),
        *_poll_order(orders, polls),
        *_send_order(orders, sends),
        *_high_watermarks(polls),
    ]
    register_anomalies, unchecked = _committed_offsets(split.commits, split.fetches, limits)
    anomalies += register_anomalies
    unchecked += [f"{key}: no final read" for key in acknowledged if key not in finals]
    stats = _stats(split, acknowledged, orders)
    return CheckResult(anomalies=tuple(anomalies), unchecked=tuple(unchecked), stats=stats)


@dataclass(slots=True)
class _Split:
    """The history by kind, each list in index (invocation) order."""

    sends: list[Send] = field(default_factory=list)
    ok_polls: list[Poll] = field(default_factory=list)  # only ok polls carry records
    commits: list[OffsetCommit] = field(default_factory=list)
    fetches: list[OffsetFetch] = field(default_factory=list)
    outcomes: Counter[tuple[str, Outcome]] = field(default_factory=Counter)


def _split(history: Iterable[AnyOp]) -> _Split:
    split = _Split()
    kinds: dict[type, tuple[str, list]] = {
        Send: ("send", split.sends),
        Poll: ("poll", split.ok_polls),
        OffsetCommit: ("commit", split.commits),
        OffsetFetch: ("fetch", split.fetches),
    }
    for op in sorted(history, key=attrgetter("index")):
        kind, ops = kinds[type(op)]
        split.outcomes[kind, op.outcome] += 1
        if kind != "poll" or op.outcome is Outcome.OK:
            ops.append(op)
    return split


@dataclass(slots=True)
class _Writers:
    """Who sent each value: its first send, plus any idempotent retries of that batch."""

    first: dict[PartitionKey, dict[Value, Send]] = field(default_factory=lambda: defaultdict(dict))
    retries: dict[int, list[Send]] = field(default_factory=lambda: defaultdict(list))

    def of(self, key: PartitionKey, value: Value) -> list[Send]:
        first = self.first.get(key, {}).get(value)
        return [] if first is None else [first, *self.retries.get(first.index, ())]


def _writers(sends: list[Send]) -> _Writers:
    """A value sent twice must be a retry of one idempotent batch (same stamp and
    values), so one lookup per op finds a retry, and one per value otherwise."""
    writers = _Writers()
    for op in sends:
        of_key = writers.first[op.key]
        first = of_key.setdefault(op.values[0], op)
        if first is not op:
            _assert_retry(first, op)
            writers.retries[first.index].append(op)
            continue
        for value in op.values[1:]:
            earlier = of_key.setdefault(value, op)
            assert earlier is op, f"ops {earlier.index} and {op.index} send one value twice"
    return writers


def _assert_retry(first: Send, retry: Send) -> None:
    """Unique values are what the whole check rests on: a reuse is a workload bug."""
    assert retry.producer is not None, f"ops {first.index} and {retry.index} send one value twice"
    assert retry.producer == first.producer, (
        f"op {retry.index} retries op {first.index} under another stamp"
    )
    assert retry.values == first.values, (
        f"op {retry.index} retries op {first.index} with other values"
    )


def _add_polls(orders: dict[PartitionKey, _VersionOrder], polls: list[Poll]) -> None:
    """Every record of every ok poll into the version order: the hot loop, inlined."""
    for op in polls:
        order = orders[op.key]
        at_offset, offset_of, read_by, index = (
            order.at_offset,
            order.offset_of,
            order.read_by,
            op.index,
        )
        for offset, value in op.records:
            claimed = at_offset.get(offset)
            if claimed is None:
                at_offset[offset] = (value, index)
            elif claimed[0] != value:
                order.conflict(offset, value, index)
            seen = offset_of.get(value)
            if seen is None:
                offset_of[value] = offset
            elif seen != offset:
                order.duplicate(value, offset, index)
            if value not in read_by:
                read_by[value] = index


def _acknowledged(
    sends: list[Send], orders: dict[PartitionKey, _VersionOrder]
) -> dict[PartitionKey, dict[Value, int]]:
    """Values that must be in the log, with their writer: Jepsen's `must_have_committed`.

    An ok send, or an ambiguous one of which some poll read a value: a batch is
    appended whole, so one value seen means all of it was written.
    """
    acknowledged: dict[PartitionKey, dict[Value, int]] = defaultdict(dict)
    for op in sends:
        if _must_have_committed(op, orders):
            of_key = acknowledged[op.key]
            for value in op.values:
                of_key.setdefault(value, op.index)
    return acknowledged


def _must_have_committed(op: Send, orders: Mapping[PartitionKey, _VersionOrder]) -> bool:
    if op.outcome is Outcome.OK:
        return True
    if op.outcome is Outcome.FAIL or op.key not in orders:
        return False
    read_by = orders[op.key].read_by
    return any(value in read_by for value in op.values)


def _add_sends(orders: dict[PartitionKey, _VersionOrder], sends: list[Send]) -> None:
    """What ok answers said about offsets counts as much as what polls saw (only an
    ok send has offsets, and an ok send must have committed)."""
    for op in sends:
        if op.outcome is not Outcome.OK:
            continue
        order = orders[op.key]
        for value, offset in zip(op.values, op.offsets, strict=True):
            if offset is not None:
                order.claim(offset, value, op.index)


def _final_reads(polls: list[Poll]) -> dict[PartitionKey, _FinalRead]:
    finals: dict[PartitionKey, _FinalRead] = defaultdict(_FinalRead)
    for op in polls:
        if not op.final:
            continue
        final = finals[op.key]
        final.values.update(value for _, value in op.records)
        final.offsets.update(offset for offset, _ in op.records)
        assert op.high_watermark is not None
        final.high_watermark = max(final.high_watermark, op.high_watermark)
        final.ops.append(op.index)
    return finals


def _log_anomalies(orders: Mapping[PartitionKey, _VersionOrder]) -> list[Anomaly]:
    anomalies = []
    for key, order in orders.items():
        for offset, claims in order.conflicts.items():
            listed = ", ".join(f"{value!r} (op {op})" for value, op in claims.items())
            anomalies.append(
                _anomaly(
                    "inconsistent-offsets",
                    key,
                    f"offset {offset} holds {len(claims)} values: {listed}",
                    tuple(claims.values()),
                )
            )
        for value, offsets in order.duplicates.items():
            listed = ", ".join(f"{offset} (op {op})" for offset, op in offsets.items())
            anomalies.append(
                _anomaly(
                    "duplicate",
                    key,
                    f"value {value!r} at {len(offsets)} offsets: {listed}",
                    tuple(offsets.values()),
                )
            )
    return anomalies


def _read_validity(
    orders: Mapping[PartitionKey, _VersionOrder], writers: _Writers
) -> list[Anomaly]:
    """`unexpected` (read, never sent) and `G1a` (read, every send of it failed)."""
    anomalies = []
    for key, order in orders.items():
        first_writers = writers.first.get(key, {})
        for value, reader in order.read_by.items():
            first = first_writers.get(value)
            if first is None:
                explanation = f"op {reader} read {value!r}, which no op sent to {key}"
                anomalies.append(_anomaly("unexpected", key, explanation, (reader,)))
            elif first.outcome is Outcome.FAIL:
                sent_by = writers.of(key, value)
                if all(op.outcome is Outcome.FAIL for op in sent_by):
                    ops = (*(op.index for op in sent_by), reader)
                    explanation = f"op {reader} read {value!r}, whose send failed (op {ops[0]})"
                    anomalies.append(_anomaly("G1a", key, explanation, ops))
    return anomalies


def _lost_writes(
    orders: Mapping[PartitionKey, _VersionOrder],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
) -> list[Anomaly]:
    """Jepsen's lost-write: someone read dense index `bound`, so every acknowledged
    value that sits wholly at or below it must have been read by someone."""
    anomalies = []
    for key, of_key in acknowledged.items():
        order = orders.get(key)
        if order is None or not order.read_by:
            continue
        first_index = order.first_index
        bound_value = max(order.read_by, key=first_index.__getitem__)
        bound = first_index[bound_value]
        for value, writer in of_key.items():
            if value in order.read_by:
                continue
            last = order.last_index(value)
            if last is not None and last <= bound:
                explanation = (
                    f"{value!r} (sent by op {writer}) at index {last} was never read, "
                    f"though op {order.read_by[bound_value]} read index {bound}"
                )
                ops = (writer, order.read_by[bound_value])
                anomalies.append(_anomaly("lost-write", key, explanation, ops))
    return anomalies


def _not_judged(
    finals: Mapping[PartitionKey, _FinalRead],
    orders: Mapping[PartitionKey, _VersionOrder],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    incomplete: Mapping[PartitionKey, str],
) -> dict[PartitionKey, set[Value]]:
    """Per partition whose final read is incomplete, the acknowledged values it cannot
    vouch for: those not at a known offset below the high watermark the read reached."""
    beyond: dict[PartitionKey, set[Value]] = {}
    for key in incomplete:
        final, order = finals.get(key), orders.get(key)
        reached = final.high_watermark if final is not None else 0
        offset_of = order.offset_of if order is not None else {}
        beyond[key] = {value for value in acknowledged.get(key, {})
                       if offset_of.get(value, reached) >= reached}
    return beyond


def _unseen(
    finals: Mapping[PartitionKey, _FinalRead],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    not_judged: Mapping[PartitionKey, set[Value]],
) -> list[Anomaly]:
    """`not_judged`: per partition with an incomplete final read, the values beyond it."""
    anomalies = []
    for key, of_key in acknowledged.items():
        final = finals.get(key)
        if final is None:
            continue  # reported as unchecked by the caller
        beyond = not_judged.get(key, set())
        for value, writer in of_key.items():
            if value not in final.values and value not in beyond:
                explanation = f"{value!r} (sent by op {writer}) is missing from the final read"
                anomalies.append(_anomaly("unseen", key, explanation, (writer,)))
    return anomalies


def _incomplete_reads(
    finals: Mapping[PartitionKey, _FinalRead],
    not_judged: Mapping[PartitionKey, set[Value]],
    incomplete: Mapping[PartitionKey, str],
) -> list[Anomaly]:
    anomalies = []
    for key, why in sorted(incomplete.items()):
        final = finals.get(key)
        reached = final.high_watermark if final is not None else 0
        explanation = (f"final read incomplete: {why}; {len(not_judged.get(key, ()))} acknowledged "
                       f"values at or beyond HW {reached} not judged")
        ops = tuple(final.ops[-LISTED_MAX:]) if final is not None else ()
        anomalies.append(_anomaly("final-read-incomplete", key, explanation, ops))
    return anomalies


def _offset_holes(
    finals: Mapping[PartitionKey, _FinalRead],
    refused_ranges: Mapping[PartitionKey, Iterable[tuple[int, int]]],
) -> list[Anomaly]:
    anomalies = []
    for key, final in finals.items():
        legal = {
            offset
            for base, count in refused_ranges.get(key, ())
            for offset in range(base, base + count)
        }
        missing = [
            o for o in range(final.high_watermark) if o not in final.offsets and o not in legal
        ]
        for first, last in _runs(missing):
            explanation = (
                f"offsets {first}..{last} are below the final high watermark {final.high_watermark} "
                f"but the final read (ops {_listed(final.ops)}) did not return them"
            )
            ops = tuple(final.ops[:LISTED_MAX])
            anomalies.append(_anomaly("offset-hole", key, explanation, ops))
    return anomalies


def _poll_order(orders: Mapping[PartitionKey, _VersionOrder], polls: list[Poll]) -> list[Anomaly]:
    """Where a poll started against its position, then record to record within it."""
    anomalies = []
    for op in polls:
        if not op.records:
            continue
        order = orders[op.key]
        index_of = order.index_of_offset
        expected = bisect_left(order.offsets, op.position)
        previous = index_of[op.records[0][0]]
        if previous != expected:
            anomalies.append(_external_poll_anomaly(op, order, expected, previous))
        for offset, _ in op.records[1:]:
            index = index_of[offset]
            if index != previous + 1:
                name = "int-poll-skip" if index > previous + 1 else "int-nonmonotonic-poll"
                explanation = f"op {op.index} read index {index} (offset {offset}) right after index {previous}"
                anomalies.append(_anomaly(name, op.key, explanation, (op.index,)))
            previous = index
    return anomalies


def _external_poll_anomaly(op: Poll, order: _VersionOrder, expected: int, got: int) -> Anomaly:
    first_offset = op.records[0][0]
    if got > expected:
        skipped = [order.value_at(index) for index in range(expected, got)]
        explanation = (
            f"op {op.index} polled from position {op.position} but started at offset {first_offset}, "
            f"skipping {_listed(skipped)}"
        )
        return _anomaly("poll-skip", op.key, explanation, (op.index,))
    explanation = f"op {op.index} polled from position {op.position} but started earlier, at offset {first_offset}"
    return _anomaly("nonmonotonic-poll", op.key, explanation, (op.index,))


def _send_order(orders: Mapping[PartitionKey, _VersionOrder], sends: list[Send]) -> list[Anomaly]:
    anomalies: list[Anomaly] = []
    # (process, key) -> (dense index of the last value, op) of its last ok plain send.
    last_ok: dict[tuple[int, PartitionKey], tuple[int | None, int]] = {}
    # (producer id, epoch, key) -> sequence -> (first index, last index, op).
    batches: dict[tuple[int, int, PartitionKey], dict[int, tuple[int | None, int | None, int]]] = (
        defaultdict(dict)
    )
    for op in sends:
        order = orders.get(op.key)
        if op.outcome is Outcome.FAIL or order is None:
            continue
        indexes = [order.first_index.get(value) for value in op.values]
        anomalies += _internal_send_anomalies(op, indexes)
        if op.producer is not None:
            stamp = op.producer
            batches[stamp.producer_id, stamp.epoch, op.key].setdefault(
                stamp.sequence, (indexes[0], indexes[-1], op.index)
            )
            continue
        previous = last_ok.get((op.process, op.key))
        if previous is not None and _out_of_order(previous[0], indexes[0]):
            anomalies.append(
                _nonmonotonic_send(op.key, previous[1], op.index, "its process's previous ok send")
            )
        if op.outcome is Outcome.OK:
            last_ok[op.process, op.key] = (indexes[-1], op.index)
    for (_, _, key), by_sequence in batches.items():
        previous_batch = None
        for sequence in sorted(by_sequence):
            batch = by_sequence[sequence]
            if previous_batch is not None and _out_of_order(previous_batch[1], batch[0]):
                anomalies.append(
                    _nonmonotonic_send(key, previous_batch[2], batch[2], "the previous sequence")
                )
            previous_batch = batch
    return anomalies


def _out_of_order(earlier: int | None, later: int | None) -> bool:
    return earlier is not None and later is not None and later <= earlier


def _nonmonotonic_send(key: PartitionKey, earlier: int, later: int, what: str) -> Anomaly:
    explanation = f"op {later} landed at or before {what} (op {earlier})"
    return _anomaly("nonmonotonic-send", key, explanation, (earlier, later))


def _internal_send_anomalies(op: Send, indexes: list[int | None]) -> list[Anomaly]:
    anomalies = []
    for position in range(1, len(indexes)):
        earlier, later = indexes[position - 1], indexes[position]
        if earlier is None or later is None or later == earlier + 1:
            continue
        name = "int-send-skip" if later > earlier + 1 else "int-nonmonotonic-send"
        explanation = (
            f"op {op.index} sent {op.values[position - 1]!r} then {op.values[position]!r}, "
            f"which sit at indexes {earlier} and {later}"
        )
        anomalies.append(_anomaly(name, op.key, explanation, (op.index,)))
    return anomalies


def _high_watermarks(polls: list[Poll]) -> list[Anomaly]:
    anomalies = []
    # (process, key, server incarnation) -> (highest high watermark seen, op).
    highest: dict[tuple[int, PartitionKey, str | None], tuple[int, int]] = {}
    for op in polls:
        high_watermark = op.high_watermark
        assert high_watermark is not None
        beyond = [offset for offset, _ in op.records if offset >= high_watermark]
        if beyond:
            explanation = f"op {op.index} read offsets {_listed(beyond)} with a high watermark of {high_watermark}"
            anomalies.append(_anomaly("read-beyond-hw", op.key, explanation, (op.index,)))
        view = (op.process, op.key, op.node)
        previous = highest.get(view)
        if previous is not None and high_watermark < previous[0]:
            server = "" if op.node is None else f" from {op.node}"
            explanation = f"op {op.index} saw high watermark {high_watermark}{server} after op {previous[1]} saw {previous[0]}"
            ops = (previous[1], op.index)
            anomalies.append(_anomaly("nonmonotonic-hw", op.key, explanation, ops))
        if previous is None or high_watermark > previous[0]:
            highest[view] = (high_watermark, op.index)
    return anomalies


@dataclass(frozen=True, slots=True)
class _RegisterOp:
    op: int
    invoke_s: float
    complete_s: float  # inf for an ambiguous commit: it may take effect at any later time
    is_write: bool
    value: int | None


def _committed_offsets(
    commits: list[OffsetCommit], fetches: list[OffsetFetch], limits: CheckLimits
) -> tuple[list[Anomaly], list[str]]:
    """One register per (group, partition); linearizability is local, so checking
    each alone checks the whole (Herlihy and Wing's locality, Porcupine's
    P-compositionality)."""
    anomalies: list[Anomaly] = []
    unchecked: list[str] = []
    for (group, key), register in _registers(commits, fetches).items():
        if all(register_op.is_write for register_op in register):
            continue  # writes alone always linearize
        where = f"group {group} {key}"
        if len(register) > limits.register_ops_max:
            unchecked.append(f"{where}: {len(register)} offset ops, over {limits.register_ops_max}")
            continue
        # Each memo entry holds a bitmask of the ops: bound the memory, not only the time.
        memo_entry_bytes = len(register) // 8 + 64
        steps_max = min(
            limits.register_steps_max, limits.register_memo_bytes_max // memo_entry_bytes
        )
        linearizable, stuck = _linearizable(register, steps_max)
        if linearizable is None:
            unchecked.append(f"{where}: search over {steps_max} steps")
        elif not linearizable:
            explanation = (
                f"group {group}: no linearization of {len(register)} commits/fetches; "
                f"stuck at op {stuck}"
            )
            anomalies.append(
                _anomaly("committed-offset-nonlinearizable", key, explanation, (stuck,))
            )
    return anomalies, unchecked


def _registers(
    commits: list[OffsetCommit], fetches: list[OffsetFetch]
) -> dict[tuple[str, PartitionKey], list[_RegisterOp]]:
    """The ops that constrain each register. A failed commit did nothing and an
    ambiguous fetch says nothing. An ambiguous commit may take effect at any time
    after its invocation (it completes at infinity); if no fetch ever returned its
    offset it constrains nothing either (taking effect last is always possible),
    and dropping it keeps it from multiplying the search."""
    fetched = {(op.group, op.key, op.offset) for op in fetches if op.outcome is Outcome.OK}
    registers: dict[tuple[str, PartitionKey], list[_RegisterOp]] = defaultdict(list)
    for op in commits:
        if op.outcome is Outcome.FAIL:
            continue
        complete_s = op.complete_s
        if op.outcome is Outcome.INFO:
            if (op.group, op.key, op.offset) not in fetched:
                continue
            complete_s = math.inf
        registers[op.group, op.key].append(
            _RegisterOp(op.index, op.invoke_s, complete_s, True, op.offset)
        )
    for op in fetches:
        if op.outcome is Outcome.OK:
            registers[op.group, op.key].append(
                _RegisterOp(op.index, op.invoke_s, op.complete_s, False, op.offset)
            )
    return registers


class _EventList:
    """The invoke and complete events of a register history, in time order, as a
    doubly linked list that ops can be lifted out of and put back (WGL's core).
    Node 0 is the head; nodes 1..2n are events; `end` follows the last."""

    __slots__ = ("end", "is_call", "next", "op_of", "previous", "return_of")

    def __init__(self, register: Sequence[_RegisterOp]) -> None:
        count = len(register)
        # Calls sort before returns at equal times: touching ops count as concurrent.
        events = sorted(
            [(op.invoke_s, 0, i) for i, op in enumerate(register)]
            + [(op.complete_s, 1, i) for i, op in enumerate(register)]
        )
        self.end = 2 * count + 1
        self.next = list(range(1, self.end + 1))
        self.previous = list(range(-1, self.end))
        self.op_of = [0] * (self.end + 1)
        self.is_call = [False] * (self.end + 1)
        self.return_of = [0] * count
        for node, (_, kind, i) in enumerate(events, start=1):
            self.op_of[node], self.is_call[node] = i, kind == 0
            if kind == 1:
                self.return_of[i] = node

    def lift(self, call: int) -> None:
        """Take a call and its return out (the op is linearized)."""
        for node in (call, self.return_of[self.op_of[call]]):
            self.next[self.previous[node]] = self.next[node]
            self.previous[self.next[node]] = self.previous[node]

    def unlift(self, call: int) -> None:
        """Put them back, return first: the exact reverse of `lift`."""
        for node in (self.return_of[self.op_of[call]], call):
            self.next[self.previous[node]] = node
            self.previous[self.next[node]] = node


def _linearizable(register: Sequence[_RegisterOp], steps_max: int) -> tuple[bool | None, int]:
    """Wing and Gong's search with Lowe's cache, as Porcupine does it.

    Walk the events in time order; linearize the first pending call the model
    accepts (lift it out) and start over from the head; reaching a return whose
    call is still there is a dead end: undo the last choice and try the next call.
    A (linearized set, state) pair already tried is skipped, which keeps the
    search near linear on mostly sequential histories. Returns (True, -1),
    (False, the op stuck at the deepest dead end) or (None, -1) past the budget.
    """
    events = _EventList(register)
    state: int | None = None  # no committed offset yet
    linearized = 0  # bit i: register[i] is linearized
    tried: set[tuple[int, int | None]] = set()
    calls: list[tuple[int, int | None]] = []  # (call node, state before it)
    deepest, stuck = -1, -1
    node = events.next[0]
    for _ in range(steps_max):
        if events.next[0] == events.end:
            return True, -1
        i = events.op_of[node]
        if events.is_call[node]:
            op = register[i]
            if op.is_write or op.value == state:
                mark = (linearized | 1 << i, op.value)
                if mark not in tried:
                    tried.add(mark)
                    calls.append((node, state))
                    linearized, state = mark
                    events.lift(node)
                    node = events.next[0]
                    continue
            node = events.next[node]
            continue
        if len(calls) > deepest:
            deepest, stuck = len(calls), register[i].op
        if not calls:
            return False, stuck
        node, state = calls.pop()
        linearized &= ~(1 << events.op_of[node])
        events.unlift(node)
        node = events.next[node]
    return (True, -1) if events.next[0] == events.end else (None, -1)


def _stats(
    split: _Split,
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    orders: Mapping[PartitionKey, _VersionOrder],
) -> dict[str, int]:
    """Counts for the report (not pass/fail): ops by kind and outcome, and how
    ambiguous sends resolved (CHAOS.md 5.3 statistics)."""
    stats = {f"{kind}-{outcome}": count for (kind, outcome), count in split.outcomes.items()}
    stats["send-info-written"] = stats["send-info-unresolved"] = stats["send-duplicate-answers"] = 0
    for op in split.sends:
        if op.outcome is Outcome.INFO:
            written = _must_have_committed(op, orders)
            stats["send-info-written" if written else "send-info-unresolved"] += 1
        elif op.duplicate:
            stats["send-duplicate-answers"] += 1
    stats["values-acknowledged"] = sum(len(of_key) for of_key in acknowledged.values())
    return dict(sorted(stats.items()))


def _runs(sorted_offsets: list[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for offset in sorted_offsets:
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _listed(items: Sequence[object]) -> str:
    shown = ", ".join(repr(item) for item in items[:LISTED_MAX])
    if len(items) > LISTED_MAX:
        shown += f" (+{len(items) - LISTED_MAX} more)"
    return shown
