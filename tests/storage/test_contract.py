"""The storage contract of raftlog/storage.py, over both implementations.

Goal: MemoryStorage (the simulator's double) and SegmentStore (the node's
store) answer the core identically, including what a crash loses.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftlog.messages import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Snapshot,
    SnapshotMeta,
)
from raftlog.storage import CompactedError, RaftStorage, UnavailableError
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage
from tests.storage.helpers import SegmentHarness, data_entry, entries


class _Subject:
    """One implementation plus its way to crash."""

    def __init__(self, kind: str, tmp_path) -> None:
        self.kind = kind
        self.harness: SegmentHarness | None = None
        if kind == "memory":
            self.storage: RaftStorage = MemoryStorage()
        else:
            self.harness = SegmentHarness(str(tmp_path))
            self.storage = self.harness.store

    def crash(self) -> RaftStorage:
        if self.harness is None:
            assert isinstance(self.storage, MemoryStorage)
            self.storage.crash()
        else:
            self.storage = self.harness.crash()
        return self.storage

    def close(self) -> None:
        if self.harness is not None:
            self.harness.close()


@pytest.fixture(params=["memory", "segments"])
def subject(request, tmp_path) -> Iterator[_Subject]:
    made = _Subject(request.param, tmp_path)
    yield made
    made.close()


def test_empty_log(subject):
    # Goal: a fresh log starts after index 0, whose term (0) is readable.
    storage = subject.storage
    assert isinstance(storage, RaftStorage)
    assert (storage.first_index(), storage.last_index()) == (1, 0)
    assert storage.term(Index(0)) == 0
    assert storage.entries(Index(1), Index(1), 100) == []
    assert storage.initial_state().hard_state == HardState()


def test_append_and_read_half_open(subject):
    # Goal: entries(lo, hi) returns [lo, hi) exactly as appended.
    storage = subject.storage
    written = entries(1, 11)
    storage.append(written)
    assert storage.last_index() == 10
    assert storage.entries(Index(3), Index(7), 1 << 30) == written[2:6]
    assert [storage.term(Index(i)) for i in range(0, 11)] == [0] + [1] * 10


def test_max_bytes_returns_at_least_one(subject):
    # Goal: a byte limit stops before the entry that exceeds it, but never returns nothing.
    storage = subject.storage
    written = entries(1, 6)
    storage.append(written)
    one = written[0].size_bytes()
    assert storage.entries(Index(1), Index(6), 1) == written[:1]
    two = one + written[1].size_bytes()
    assert storage.entries(Index(1), Index(6), two) == written[:2]
    assert storage.entries(Index(1), Index(6), two - 1) == written[:1]
    assert ENTRY_OVERHEAD_BYTES > 0


def test_out_of_range_errors(subject):
    # Goal: below first index -> CompactedError; beyond last -> UnavailableError.
    storage = subject.storage
    storage.append(entries(1, 6))
    storage.compact(Index(2))
    with pytest.raises(CompactedError):
        storage.entries(Index(2), Index(4), 100)
    with pytest.raises(CompactedError):
        storage.term(Index(1))
    with pytest.raises(UnavailableError):
        storage.entries(Index(3), Index(8), 100)
    with pytest.raises(UnavailableError):
        storage.term(Index(6))
    assert storage.term(Index(2)) == 1, "the term before the first index stays readable"
    assert storage.first_index() == 3


def test_append_truncates_conflicting_suffix(subject):
    # Goal: appending at an existing index replaces the suffix from there on.
    storage = subject.storage
    storage.append(entries(1, 8, term=1))
    replacement = entries(5, 7, term=2)
    storage.append(replacement)
    assert storage.last_index() == 6
    assert storage.entries(Index(5), Index(7), 1 << 30) == replacement
    assert storage.term(Index(4)) == 1 and storage.term(Index(5)) == 2
    storage.append(entries(7, 9, term=2))
    assert storage.last_index() == 8


def test_non_contiguous_append_is_refused(subject):
    # Goal: a gap is a programming error (assertion), never silently stored.
    storage = subject.storage
    storage.append(entries(1, 3))
    with pytest.raises(AssertionError):
        storage.append(entries(5, 6))


def test_crash_loses_exactly_the_unsynced(subject):
    # Goal: what sync() returned for survives a crash; later appends and hard state do not.
    storage = subject.storage
    storage.append(entries(1, 5))
    storage.set_hard_state(HardState(term=Term(1), vote=NodeId(2), commit=Index(3)))
    storage.sync()
    storage.append(entries(5, 9))
    storage.set_hard_state(HardState(term=Term(2), vote=NodeId(3), commit=Index(4)))
    storage = subject.crash()
    assert storage.last_index() == 4
    assert storage.entries(Index(1), Index(5), 1 << 30) == entries(1, 5)
    assert storage.initial_state().hard_state == HardState(Term(1), NodeId(2), Index(3))
    storage.append(entries(5, 7, term=2))
    storage.sync()
    storage = subject.crash()
    assert storage.last_index() == 6 and storage.term(Index(6)) == 2


def test_truncation_survives_crash_only_after_sync(subject):
    # Goal: a conflict truncation plus new entries is durable after sync, as a unit.
    storage = subject.storage
    storage.append(entries(1, 8, term=1))
    storage.sync()
    storage.append(entries(4, 6, term=3))
    storage.sync()
    storage = subject.crash()
    assert storage.last_index() == 5
    assert storage.term(Index(5)) == 3 and storage.term(Index(3)) == 1


def test_compaction_keeps_term_and_survives_crash(subject):
    # Goal: after compact + sync + crash, first_index and term(first-1) hold.
    storage = subject.storage
    storage.append(entries(1, 10))
    storage.sync()
    storage.compact(Index(6))
    storage.sync()
    storage = subject.crash()
    assert storage.first_index() == 7 and storage.last_index() == 9
    assert storage.term(Index(6)) == 1
    assert storage.entries(Index(7), Index(10), 1 << 30) == entries(7, 10)


def test_apply_snapshot_replaces_log(subject):
    # Goal: installing a snapshot discards the log and starts after it.
    storage = subject.storage
    storage.append(entries(1, 4))
    members = Membership(voters=frozenset({NodeId(1), NodeId(2)}))
    snapshot = Snapshot(meta=SnapshotMeta(index=Index(20), term=Term(4), membership=members))
    storage.apply_snapshot(snapshot)
    storage.sync()
    assert (storage.first_index(), storage.last_index()) == (21, 20)
    assert storage.term(Index(20)) == 4
    assert storage.snapshot().meta == snapshot.meta
    assert storage.initial_state().membership == members
    storage.append([data_entry(21, 4)])
    storage.sync()
    storage = subject.crash()
    assert storage.last_index() == 21 and storage.term(Index(20)) == 4


def test_mixed_kinds_round_trip(subject):
    # Goal: every entry kind, including empty payloads, reads back byte for byte.
    storage = subject.storage
    written = [
        Entry(Index(1), Term(1), EntryKind.NOOP, b""),
        Entry(Index(2), Term(1), EntryKind.CONFIG, b"\x00" * 9),
        data_entry(3, 1, count=5),
        Entry(Index(4), Term(2), EntryKind.META, b"x" * 1000),
    ]
    storage.append(written)
    storage.sync()
    assert subject.crash().entries(Index(1), Index(5), 1 << 30) == written
