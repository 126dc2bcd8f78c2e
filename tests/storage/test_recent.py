"""The segment store keeps its newest entries in memory: what it serves from there
is exactly what the file holds, and the budget holds."""

from __future__ import annotations

import pytest

from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Term
from storage.recent import RECENT_BYTES_MAX, RECENT_ENTRIES_MAX
from tests.storage.helpers import SegmentHarness, entries

ALL = 1 << 30


@pytest.fixture
def harness(tmp_path):
    made = SegmentHarness(str(tmp_path), durable_files=False)
    yield made
    made.close()


def count_reads(harness: SegmentHarness, monkeypatch) -> list[int]:
    reads: list[int] = []
    real = harness.files.read

    def read(handle, position, size):
        reads.append(size)
        return real(handle, position, size)

    monkeypatch.setattr(harness.files, "read", read)
    return reads


def test_the_newest_entries_are_served_from_memory_as_the_file_holds_them(harness, monkeypatch):
    # Goal: applying a write just appended (leader) or just learned committed (follower)
    # reads no file; and what memory serves equals what the file serves after a reopen.
    store = harness.store
    store.append(entries(1, RECENT_ENTRIES_MAX + 11))
    store.sync()
    reads = count_reads(harness, monkeypatch)
    newest = store.entries(Index(11), Index(RECENT_ENTRIES_MAX + 11), ALL)
    assert reads == [], "the newest entries come from memory"
    older = store.entries(Index(1), Index(11), ALL)
    assert reads, "entries past the budget come from the file"
    limited = store.entries(Index(11), Index(20), 1)
    assert len(limited) == 1, "the byte limit still holds: at least one entry, at most max_bytes"
    monkeypatch.undo()
    reopened = harness.crash()
    assert reopened.entries(Index(1), Index(RECENT_ENTRIES_MAX + 11), ALL) == older + newest


def test_a_conflicting_append_replaces_the_remembered_entries(harness, monkeypatch):
    # Goal: after a Raft conflict cuts the log, memory never serves the cut entries.
    store = harness.store
    store.append(entries(1, 10))
    store.sync()
    store.set_hard_state(store.initial_state().hard_state)
    replacement = entries(6, 8, term=2)
    store.append(replacement)
    assert store.last_index() == 7
    reads = count_reads(harness, monkeypatch)
    assert store.entries(Index(5), Index(8), ALL) == entries(5, 6) + replacement
    assert reads == []


def test_an_entry_over_the_byte_budget_is_read_from_the_file(harness, monkeypatch):
    # Goal: memory per log stays within RECENT_BYTES_MAX: a large batch is not kept.
    store = harness.store
    store.append(entries(1, 3))
    big = Entry(Index(3), Term(1), EntryKind.META, b"x" * (RECENT_BYTES_MAX + 1))
    store.append([big])
    store.sync()
    reads = count_reads(harness, monkeypatch)
    assert store.entries(Index(3), Index(4), ALL) == [big]
    assert reads, "the large entry came from the file"
    store.append(entries(4, 6))
    assert store.entries(Index(4), Index(6), ALL) == entries(4, 6)
    assert len(reads) == 1, "entries after it are remembered again"
