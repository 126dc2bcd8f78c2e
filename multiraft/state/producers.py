"""The idempotent-producer rules and table of one partition (Kafka's semantics).

A producer id >= 0 marks a batch as idempotent: the partition remembers, per
producer id, its epoch and the last `BATCHES_KEPT` batches (base sequence, record
count, base offset). `decide` is the one pure rule set; it runs twice per batch:

- on the leader **before proposing** (`ProducerTable.check`), against the applied
  table plus the leader's own proposals that have not applied yet, so a pipelined
  producer (up to 5 batches in flight) is checked against what will precede it;
- on **apply**, against the applied table only, so every replica reaches the same
  verdict even when a retry was proposed twice before the first one committed.

The rules, as Kafka's `ProducerStateManager`: an older epoch is fenced; a newer
epoch restarts sequences at 0; otherwise a batch equal to a remembered one (same
base sequence and count) is a duplicate and gets that batch's base offset back,
and any other batch must start exactly one past the last sequence (wrapping at
2**31). A producer id the table does not know (new, or evicted) is accepted at any
sequence, as Kafka does after its producer state expired: refusing it would
wedge a producer forever after an eviction.

Memory is bounded: at most `producers_max` ids, least recently used evicted first.
Use is counted in apply order only, so eviction is deterministic across replicas.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from multiraft.errors import InvalidProducerEpoch, InvalidRequest, OutOfOrderSequence
from raftlog.types import Offset

NO_PRODUCER_ID = -1
# Kafka keeps 5 because an idempotent producer allows at most 5 requests in flight.
BATCHES_KEPT = 5
# Sequences are int32 in the batch header and wrap to 0 after this (Kafka's rule).
SEQUENCE_MAX = 2**31 - 1
EPOCH_MAX = 2**15 - 1
# Per partition. Kafka expires producer state by time (producer.id.expiration.ms,
# one day); a count keeps replicas deterministic and memory bounded: an entry is
# ~0.5 KiB, so 10,000 ids cost ~5 MiB per partition at worst.
PRODUCERS_MAX_DEFAULT = 10_000


def next_sequence(sequence: int, delta: int = 1) -> int:
    """`sequence + delta` in Kafka's wrapping int32 sequence space."""
    assert 0 <= sequence <= SEQUENCE_MAX
    assert delta >= 0
    return (sequence + delta) % (SEQUENCE_MAX + 1)


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """One remembered batch. `base_offset` is None while it is only proposed."""

    base_sequence: int
    record_count: int
    base_offset: Offset | None

    @property
    def last_sequence(self) -> int:
        return next_sequence(self.base_sequence, self.record_count - 1)


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """What the partition knows of one producer id. Invariant: 1..5 batches, oldest first."""

    epoch: int
    batches: tuple[ProducedBatch, ...]

    def __post_init__(self) -> None:
        assert 1 <= len(self.batches) <= BATCHES_KEPT
        assert 0 <= self.epoch <= EPOCH_MAX


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """The producer fields of a batch header that the rules read."""

    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class Accept:
    """Propose (or, on apply, append) the batch at the next offset."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of a batch already applied: answer with its original offsets."""

    base_offset: Offset
    record_count: int


@dataclass(frozen=True, slots=True)
class DuplicatePending:
    """A retry of a batch this leader proposed that has not applied yet: do not
    propose again; wait for the original's apply and answer with its offsets."""

    base_sequence: int
    record_count: int


Decision = Accept | Duplicate | DuplicatePending


def validate_fields(batch: ProducerBatch) -> None:
    """Reject header fields no Kafka-like producer sends (before any state is read)."""
    if batch.record_count < 1:
        raise InvalidRequest("a batch holds at least one record")
    if not batch.idempotent:
        return
    if batch.producer_id < 0:
        raise InvalidRequest(f"producer id {batch.producer_id} is neither -1 nor >= 0")
    if not 0 <= batch.epoch <= EPOCH_MAX:
        raise InvalidRequest(f"producer epoch {batch.epoch} is out of range")
    if not 0 <= batch.base_sequence <= SEQUENCE_MAX:
        raise InvalidRequest(f"base sequence {batch.base_sequence} is out of range")


def decide(entry: ProducerEntry | None, batch: ProducerBatch) -> Decision:
    """The idempotence verdict for `batch` given what is known of its producer.

    Raises `InvalidProducerEpoch`, `OutOfOrderSequence` or `InvalidRequest`.
    """
    validate_fields(batch)
    if not batch.idempotent or entry is None:
        return Accept()
    if batch.epoch < entry.epoch:
        raise InvalidProducerEpoch(batch.producer_id, batch.epoch, entry.epoch)
    if batch.epoch > entry.epoch:
        if batch.base_sequence != 0:
            raise OutOfOrderSequence(batch.producer_id, batch.base_sequence, None)
        return Accept()
    for known in entry.batches:
        if (known.base_sequence, known.record_count) == (batch.base_sequence, batch.record_count):
            if known.base_offset is None:
                return DuplicatePending(known.base_sequence, known.record_count)
            return Duplicate(known.base_offset, known.record_count)
    expected = next_sequence(entry.batches[-1].last_sequence)
    if batch.base_sequence != expected:
        raise OutOfOrderSequence(batch.producer_id, batch.base_sequence, expected)
    return Accept()


def advance(
    entry: ProducerEntry | None, batch: ProducerBatch, base_offset: Offset | None
) -> ProducerEntry:
    """The entry after an accepted `batch` (base_offset None: proposed, not applied)."""
    assert batch.idempotent
    kept: tuple[ProducedBatch, ...] = ()
    if entry is not None and entry.epoch == batch.epoch:
        kept = entry.batches[-(BATCHES_KEPT - 1) :]
    if entry is not None:
        assert batch.epoch >= entry.epoch, "decide() fences older epochs"
    produced = ProducedBatch(batch.base_sequence, batch.record_count, base_offset)
    return ProducerEntry(epoch=batch.epoch, batches=(*kept, produced))


class ProducerTable:
    """Applied producer entries (LRU-bounded) and the leader's pending proposals.

    `_entries` is ordered by last use, oldest first: it is replicated state (its
    order decides evictions, so snapshots keep it). `_pending` is volatile and
    leader-local: per producer, the accepted batches proposed but not yet applied,
    in proposal order. It never influences `apply`.
    """

    def __init__(self, producers_max: int = PRODUCERS_MAX_DEFAULT) -> None:
        assert producers_max >= 1
        self.producers_max = producers_max
        self._entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self._pending: dict[int, list[ProducerBatch]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def items(self) -> list[tuple[int, ProducerEntry]]:
        """Entries, least recently used first (the snapshot order)."""
        return list(self._entries.items())

    def check(self, batch: ProducerBatch) -> Decision:
        """The leader's verdict before proposing: applied state plus own proposals."""
        return decide(self._with_pending(batch.producer_id), batch)

    def _with_pending(self, producer_id: int) -> ProducerEntry | None:
        entry = self._entries.get(producer_id)
        for pending in self._pending.get(producer_id, ()):
            entry = advance(entry, pending, None)
        return entry

    def record_proposal(self, batch: ProducerBatch) -> None:
        """The leader proposed `batch` after `check` accepted it."""
        if not batch.idempotent:
            return
        self._pending.setdefault(batch.producer_id, []).append(batch)

    def drop_proposals(self) -> None:
        """Leadership lost (or proposals dropped): forget every pending proposal.

        Safe: a batch that still commits is judged on apply against applied state.
        """
        self._pending.clear()

    def apply(self, batch: ProducerBatch, base_offset: Offset | None) -> Decision:
        """Judge and record a committed batch. Raises like `decide` (state untouched)."""
        self._settle_pending(batch)
        entry = self._entries.get(batch.producer_id)
        decision = decide(entry, batch)
        assert not isinstance(decision, DuplicatePending), "applied batches have offsets"
        if batch.idempotent and isinstance(decision, Accept):
            assert base_offset is not None
            self._entries.pop(batch.producer_id, None)
            self._entries[batch.producer_id] = advance(entry, batch, base_offset)
            while len(self._entries) > self.producers_max:
                self._entries.popitem(last=False)
        return decision

    def _settle_pending(self, batch: ProducerBatch) -> None:
        pending = self._pending.get(batch.producer_id)
        if pending and pending[0] == batch:
            pending.pop(0)
        if not pending:
            self._pending.pop(batch.producer_id, None)

    def restore(self, entries: list[tuple[int, ProducerEntry]]) -> None:
        assert not self._entries and len(entries) <= self.producers_max
        for producer_id, entry in entries:
            assert producer_id >= 0 and producer_id not in self._entries
            self._entries[producer_id] = entry


# Builds a partition's table from its bound (`producers_max`): `ProducerTable` itself,
# or a subclass whoever builds the partition state hands it.
NewProducerTable = Callable[[int], ProducerTable]
