"""The version order: one partition's log as a chaos history shows it.

Built in one pass over the history (`chaos/checker.py` explains why everything
derives from it): which value sits at which offset, according to every ok poll
and every send that must have committed, numbered densely once complete. Also
the history split by kind, who sent each value, which values must be in the
log, and what the final phase read.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from chaos.history import (
    AnyOp,
    GroupCommit,
    GroupFetch,
    Membership,
    OffsetCommit,
    OffsetFetch,
    Outcome,
    PartitionKey,
    Poll,
    Send,
    Value,
)


@dataclass(slots=True)
class VersionOrder:
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
        """Record that op saw (or was told) value at offset. Inlined in `add_polls`."""
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
class FinalRead:
    """What the final phase read of one partition."""

    values: set[Value] = field(default_factory=set)
    offsets: set[int] = field(default_factory=set)
    high_watermark: int = 0
    ops: list[int] = field(default_factory=list)



@dataclass(slots=True)
class HistoryByKind:
    """The history by kind, each list in index (invocation) order."""

    sends: list[Send] = field(default_factory=list)
    ok_polls: list[Poll] = field(default_factory=list)  # only ok polls carry records
    commits: list[OffsetCommit] = field(default_factory=list)
    fetches: list[OffsetFetch] = field(default_factory=list)
    # Consumer group members (chaos/group_checks.py): every outcome, in index order.
    members: list[Membership] = field(default_factory=list)
    group_fetches: list[GroupFetch] = field(default_factory=list)
    group_commits: list[GroupCommit] = field(default_factory=list)
    outcomes: Counter[tuple[str, Outcome]] = field(default_factory=Counter)


def by_kind(history: Iterable[AnyOp]) -> HistoryByKind:
    split = HistoryByKind()
    kinds: dict[type, tuple[str, list]] = {
        Send: ("send", split.sends),
        Poll: ("poll", split.ok_polls),
        OffsetCommit: ("commit", split.commits),
        OffsetFetch: ("fetch", split.fetches),
        Membership: ("member", split.members),
        GroupFetch: ("group-fetch", split.group_fetches),
        GroupCommit: ("group-commit", split.group_commits),
    }
    for op in sorted(history, key=attrgetter("index")):
        kind, ops = kinds[type(op)]
        split.outcomes[kind, op.outcome] += 1
        if kind != "poll" or op.outcome is Outcome.OK:
            ops.append(op)
    return split


@dataclass(slots=True)
class Writers:
    """Who sent each value: its first send, plus any idempotent retries of that batch."""

    first: dict[PartitionKey, dict[Value, Send]] = field(default_factory=lambda: defaultdict(dict))
    retries: dict[int, list[Send]] = field(default_factory=lambda: defaultdict(list))

    def of(self, key: PartitionKey, value: Value) -> list[Send]:
        first = self.first.get(key, {}).get(value)
        return [] if first is None else [first, *self.retries.get(first.index, ())]


def find_writers(sends: list[Send]) -> Writers:
    """A value sent twice must be a retry of one idempotent batch (same stamp and
    values), so one lookup per op finds a retry, and one per value otherwise."""
    writers = Writers()
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


def add_polls(orders: dict[PartitionKey, VersionOrder], polls: list[Poll]) -> None:
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


def acknowledged_values(
    sends: list[Send], orders: dict[PartitionKey, VersionOrder]
) -> dict[PartitionKey, dict[Value, int]]:
    """Values that must be in the log, with their writer: Jepsen's `must_have_committed`.

    An ok send, or an ambiguous one of which some poll read a value: a batch is
    appended whole, so one value seen means all of it was written.
    """
    acknowledged: dict[PartitionKey, dict[Value, int]] = defaultdict(dict)
    for op in sends:
        if must_have_committed(op, orders):
            of_key = acknowledged[op.key]
            for value in op.values:
                of_key.setdefault(value, op.index)
    return acknowledged


def must_have_committed(op: Send, orders: Mapping[PartitionKey, VersionOrder]) -> bool:
    if op.outcome is Outcome.OK:
        return True
    if op.outcome is Outcome.FAIL or op.key not in orders:
        return False
    read_by = orders[op.key].read_by
    return any(value in read_by for value in op.values)


def add_sends(orders: dict[PartitionKey, VersionOrder], sends: list[Send]) -> None:
    """What ok answers said about offsets counts as much as what polls saw (only an
    ok send has offsets, and an ok send must have committed)."""
    for op in sends:
        if op.outcome is not Outcome.OK:
            continue
        order = orders[op.key]
        for value, offset in zip(op.values, op.offsets, strict=True):
            if offset is not None:
                order.claim(offset, value, op.index)


def final_reads(polls: list[Poll]) -> dict[PartitionKey, FinalRead]:
    finals: dict[PartitionKey, FinalRead] = defaultdict(FinalRead)
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

