"""The segment store's entry cache (storage/entry_cache.py): what it serves is exactly
what the files hold, it lets entries go when released, it stays within the node's
budget, and every write that replaces entries drops the cached ones."""

from __future__ import annotations

import os
import random

import pytest

from raftlog.core.log import RaftLog
from raftlog.messages import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    EntryKind,
    Membership,
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import GroupId, Index, NodeId, Term
from storage.entry_cache import (
    CACHE_MEMORY_BYTES,
    ENTRY_SHARE_MAX,
    EntryCacheBudget,
    entry_cost_bytes,
)
from storage.files import OsFiles
from storage.segments import SegmentStore
from storage.state_db import StateDatabase
from tests.storage.helpers import SegmentHarness, entries

ALL = 1 << 30
MEMBERS = Membership(voters=frozenset({NodeId(1), NodeId(2), NodeId(3)}))


@pytest.fixture
def harness(tmp_path):
    made = SegmentHarness(str(tmp_path), durable_files=False)
    yield made
    made.close()


def count_reads(files, monkeypatch) -> list[int]:
    reads: list[int] = []
    real = files.read

    def read(handle, position, size):
        reads.append(size)
        return real(handle, position, size)

    monkeypatch.setattr(files, "read", read)
    return reads


def cost(items: list[Entry]) -> int:
    """The protocol's size (read byte limits)."""
    return sum(len(e.payload) + ENTRY_OVERHEAD_BYTES for e in items)


def memory(items: list[Entry]) -> int:
    """What one log's cache holding `items` is charged."""
    return sum(entry_cost_bytes(e) for e in items) + CACHE_MEMORY_BYTES


def test_appended_entries_are_served_from_memory_as_the_file_holds_them(harness, monkeypatch):
    # Goal: reading entries just appended (a leader's appends to its followers, its apply)
    # reads no file, and memory serves what the file serves after a reopen.
    store = harness.store
    store.append(entries(1, 40))
    store.sync()
    reads = count_reads(harness.files, monkeypatch)
    cached = store.entries(Index(1), Index(40), ALL)
    assert reads == [], "the newest entries come from memory"
    limited = store.entries(Index(11), Index(20), 1)
    assert len(limited) == 1, "the byte limit still holds: at least one entry, at most max_bytes"
    monkeypatch.undo()
    reopened = harness.crash()
    assert reopened.cached_bytes == 0, "a reopened store starts with nothing cached"
    assert reopened.entries(Index(1), Index(40), ALL) == cached


def test_released_entries_are_read_from_the_file_and_an_idle_log_holds_nothing(harness, monkeypatch):
    # Goal: entries every replica holds leave memory; a fully released log holds no bytes
    # and no container (10,000 idle replicas pay nothing for the cache).
    store = harness.store
    store.append(entries(1, 21))
    store.sync()
    store.release_cached(Index(10))
    reads = count_reads(harness.files, monkeypatch)
    assert store.entries(Index(11), Index(21), ALL) == entries(11, 21)
    assert reads == [], "entries after the released ones are still in memory"
    assert store.entries(Index(5), Index(15), ALL) == entries(5, 15), "a range across both"
    assert reads, "the released entries came from the file"
    store.release_cached(Index(20))
    assert store.cached_bytes == 0
    assert store._cache._entries is None
    assert store._cache._budget.bytes == 0 and store._cache._budget.holding() == 0


def test_a_range_across_file_and_cache_keeps_the_byte_limit(harness):
    # Goal: the storage contract's byte limit counts the file part and the cached part together.
    store = harness.store
    made = entries(1, 21)
    store.append(made)
    store.release_cached(Index(10))
    for limit in (1, cost(made[4:9]), cost(made[4:12]), cost(made[4:12]) + 1, ALL):
        expected: list[Entry] = []
        for entry in made[4:15]:
            if expected and cost([*expected, entry]) > limit:
                break
            expected.append(entry)
        assert store.entries(Index(5), Index(16), limit) == expected, limit


def test_the_budget_is_node_wide_and_evicts_the_least_recently_appended_log(tmp_path):
    # Goal: one budget bounds every store's cache together; over it, the log appended to
    # least recently gives up its oldest entries first, and no entry is lost for reads.
    budget = EntryCacheBudget(bytes_max=memory(entries(1, 21)))
    db = StateDatabase(str(tmp_path / "state"))
    files = OsFiles()
    first = SegmentStore(GroupId(1), str(tmp_path / "1"), db, files, cache_budget=budget)
    second = SegmentStore(GroupId(2), str(tmp_path / "2"), db, files, cache_budget=budget)
    first.append(entries(1, 16))
    second.append(entries(1, 11))
    assert budget.bytes <= budget.bytes_max
    assert budget.bytes == first.cached_bytes + second.cached_bytes
    assert second.cached_bytes == memory(entries(1, 11)), "the newest appends stay"
    assert first._cache.first_index() > 1, "the older log gave up its oldest entries"
    assert budget.entries_evicted > 0
    assert first.entries(Index(1), Index(16), ALL) == entries(1, 16), "evicted entries come from the file"
    first.close()
    assert budget.bytes == second.cached_bytes, "a closed store gives its bytes back"
    second.close()
    assert budget.bytes == 0 and budget.holding() == 0
    db.close()


def test_an_entry_over_its_share_of_the_budget_is_not_kept(tmp_path):
    # Goal: a huge batch does not push every other log out; skipping it drops the older
    # cached entries too (the cache is a contiguous end of the log), later ones are kept.
    budget = EntryCacheBudget(bytes_max=ENTRY_SHARE_MAX * 1000)
    db = StateDatabase(str(tmp_path / "state"))
    store = SegmentStore(GroupId(1), str(tmp_path / "1"), db, OsFiles(), cache_budget=budget)
    store.append(entries(1, 3))
    big = Entry(Index(3), Term(1), EntryKind.META, b"x" * 1000)
    store.append([big])
    assert store.cached_bytes == 0
    assert store.entries(Index(1), Index(4), ALL) == [*entries(1, 3), big]
    store.append(entries(4, 6))
    assert store._cache.first_index() == 4
    store.close()
    db.close()


def test_a_zero_budget_caches_nothing(tmp_path):
    # Goal: entry_cache_bytes = 0 turns the cache off; reads still work.
    budget = EntryCacheBudget(bytes_max=0)
    db = StateDatabase(str(tmp_path / "state"))
    store = SegmentStore(GroupId(1), str(tmp_path / "1"), db, OsFiles(), cache_budget=budget)
    store.append(entries(1, 5))
    assert store.cached_bytes == 0 and budget.holding() == 0
    assert store.entries(Index(1), Index(5), ALL) == entries(1, 5)
    store.close()
    db.close()


def test_a_store_takes_the_budget_it_is_given_even_one_that_reads_as_false(tmp_path):
    # Goal: the node's budget is used whenever one is passed (`is None`, not truthiness): an
    # empty budget that reads as false must not give each store a private one of its own.
    class Falsy(EntryCacheBudget):
        __slots__ = ()

        def __len__(self) -> int:
            return 0

    budget = Falsy(bytes_max=1 << 20)
    db = StateDatabase(str(tmp_path / "state"))
    store = SegmentStore(GroupId(1), str(tmp_path / "1"), db, OsFiles(), cache_budget=budget)
    store.append(entries(1, 3))
    assert store._cache._budget is budget and budget.bytes == store.cached_bytes > 0
    store.close()
    db.close()


def test_every_write_that_replaces_entries_drops_the_cached_ones(harness, monkeypatch):
    # Goal: a conflict, a truncation, a compaction, a snapshot and frames stored byte for
    # byte never leave a cached entry that the file no longer holds.
    store = harness.store
    store.append(entries(1, 10))
    replacement = entries(6, 8, term=2)
    store.append(replacement)  # a Raft conflict at 6
    assert store.entries(Index(1), Index(8), ALL) == entries(1, 6) + replacement
    store.truncate_from(Index(7))
    assert store._cache.first_index() == 1 and len(store._cache) == 6
    store.compact(Index(3))
    assert store._cache.first_index() == 4, "compacted entries leave memory"
    snapshot = Snapshot(meta=SnapshotMeta(index=Index(20), term=Term(3), membership=MEMBERS))
    store.apply_snapshot(snapshot)
    assert store.cached_bytes == 0 and store._cache._entries is None
    store.append(entries(21, 24, term=3))
    assert store.entries(Index(21), Index(24), ALL) == entries(21, 24, term=3)


class Model:
    """What the log holds, kept naively: the reference every read is compared with."""

    def __init__(self) -> None:
        self.start = 0  # snapshot index
        self.log: list[Entry] = []

    def last(self) -> int:
        return self.log[-1].index if self.log else self.start

    def read(self, lo: int, hi: int, limit: int) -> list[Entry]:
        selected: list[Entry] = []
        for entry in self.log[lo - self.start - 1 : hi - self.start - 1]:
            if selected and cost([*selected, entry]) > limit:
                break
            selected.append(entry)
        return selected


def payload_entries(rng: random.Random, lo: int, count: int, term: int) -> list[Entry]:
    return [Entry(Index(i), Term(term), EntryKind.META, rng.randbytes(rng.choice((1, 40, 200, 900))))
            for i in range(lo, lo + count)]


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_read_the_same_with_and_without_the_cache(tmp_path, seed):
    # Goal: over random appends, conflicts, truncations, compactions, snapshots, releases,
    # reopens and budget pressure from another log, every read (storage.entries and the
    # core's RaftLog.slice over it) equals a store without a cache and a naive model.
    rng = random.Random(seed)
    budget = EntryCacheBudget(bytes_max=(4000, 20_000, 200_000)[seed % 3])
    db = StateDatabase(str(tmp_path / "state"))
    files = OsFiles()

    def open_store(group: int, store_budget: EntryCacheBudget) -> SegmentStore:
        return SegmentStore(GroupId(group), os.path.join(tmp_path, str(group)), db, files,
                            cache_budget=store_budget)

    cached, plain, noise = open_store(1, budget), open_store(2, EntryCacheBudget(0)), open_store(3, budget)
    model, term = Model(), 1
    for step in range(300):
        op = rng.random()
        last = model.last()
        if op < 0.45 or last == model.start:
            made = payload_entries(rng, last + 1, rng.randint(1, 6), term)
        elif op < 0.6:  # a conflict: a later term rewrites the tail
            term += 1
            made = payload_entries(rng, rng.randint(model.start + 1, last), rng.randint(1, 4), term)
        elif op < 0.68:
            at = rng.randint(model.start + 1, last)
            for store in (cached, plain):
                store.truncate_from(Index(at))
            del model.log[at - model.start - 1 :]
            made = []
        elif op < 0.74:
            at = rng.randint(model.start + 1, last)
            for store in (cached, plain):
                store.compact(Index(at))
            del model.log[: at - model.start]
            model.start = at
            made = []
        elif op < 0.77:
            at = last + rng.randint(0, 5)
            term += 1
            snapshot = Snapshot(meta=SnapshotMeta(index=Index(at), term=Term(term), membership=MEMBERS))
            for store in (cached, plain):
                store.apply_snapshot(snapshot)
            model.start, model.log = at, []
            made = []
        elif op < 0.87:
            cached.release_cached(Index(rng.randint(0, last)))
            made = []
        elif op < 0.9:
            cached.sync()
            cached.close()
            cached = open_store(1, budget)
            plain.sync()
            plain.close()
            plain = open_store(2, EntryCacheBudget(0))
            made = []
        else:
            noise.append(payload_entries(rng, noise.last_index() + 1, rng.randint(1, 8), 1))
            made = []
        if made:
            for store in (cached, plain):
                store.append(made)
            del model.log[made[0].index - model.start - 1 :]
            model.log += made
        assert budget.bytes <= budget.bytes_max
        assert budget.bytes == cached.cached_bytes + noise.cached_bytes
        last = model.last()
        if last == model.start:
            continue
        for _ in range(3):
            lo = rng.randint(model.start + 1, last)
            hi = rng.randint(lo, last + 1)
            limit = rng.choice((1, 300, 2000, ALL))
            expected = model.read(lo, hi, limit)
            assert cached.entries(Index(lo), Index(hi), limit) == expected, (seed, step, lo, hi, limit)
            assert plain.entries(Index(lo), Index(hi), limit) == expected, (seed, step, lo, hi, limit)
            with_cache = RaftLog(cached, Index(model.start)).slice(Index(lo), Index(hi), limit)
            without = RaftLog(plain, Index(model.start)).slice(Index(lo), Index(hi), limit)
            assert with_cache == without == expected
    assert budget.entries_read > 0, "the cache served reads"
    for store in (cached, plain, noise):
        store.close()
    assert budget.bytes == 0 and budget.holding() == 0
    db.close()


def test_frames_stored_byte_for_byte_drop_the_cached_entries(harness):
    # Goal: `append_frames` writes entries the cache never saw: it holds nothing after it,
    # and reads serve the frames' entries, also across a conflict they made.
    from storage.frames import encode_frame, record_count_of

    store = harness.store
    store.append(entries(1, 10))
    replacement = entries(6, 9, term=2)
    offset = store.offset_after(Index(5))
    parts: list[bytes] = []
    for entry in replacement:
        count = record_count_of(entry)
        header, payload = encode_frame(entry, offset, count)
        parts += (header, payload)
        offset += count
    store.append_frames(b"".join(parts))
    assert store.cached_bytes == 0 and store._cache._entries is None
    assert store.entries(Index(1), Index(9), ALL) == entries(1, 6) + replacement


def test_a_write_that_fails_partway_leaves_no_cached_entry_it_was_replacing(tmp_path, monkeypatch):
    # Goal: truncate_from, apply_snapshot and close drop the cached entries before any step
    # that can raise (a closed segment found corrupt on reopen, an unlink, a database
    # write): after the failure the cache serves nothing the files may no longer hold.
    from storage.config import StoreConfig
    from storage.errors import CorruptionError

    made = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096), durable_files=False)
    store = made.store
    for lo in range(1, 200, 10):  # a segment rolls between appends
        store.append(entries(lo, lo + 10))
    assert any(segment.closed for segment in store._segments)
    cut = next(segment for segment in store._segments if segment.closed).last_index
    assert store._cache.first_index() == 1

    def corrupt(segment, batch):
        raise CorruptionError("injected")

    monkeypatch.setattr(store, "_reopen", corrupt)
    with pytest.raises(CorruptionError):
        store.truncate_from(Index(cut))
    assert store._cache.first_index() == 1 and len(store._cache) == cut - 1, "nothing from the cut on"
    monkeypatch.undo()

    def failing(*args):
        raise OSError("injected")

    snapshot = Snapshot(meta=SnapshotMeta(index=Index(300), term=Term(3), membership=MEMBERS))
    monkeypatch.setattr(store, "_drop_segment_file", failing)
    with pytest.raises(OSError):
        store.apply_snapshot(snapshot)
    assert store.cached_bytes == 0 and store._cache._entries is None
    monkeypatch.undo()

    other = SegmentHarness(str(tmp_path / "other"), durable_files=False)
    other.store.append(entries(1, 10))
    monkeypatch.setattr(other.files, "close", failing)
    with pytest.raises(OSError):
        other.store.close()
    assert other.store.cached_bytes == 0 and other.store._cache._budget.bytes == 0
    monkeypatch.undo()
    other.db.close()
    made.db.close()


def test_the_budget_charges_the_memory_cached_entries_hold(harness):
    # Goal: a cached entry is charged what it keeps alive in this interpreter (the Entry,
    # its payload, its index, a list slot; measured by tracemalloc), not the protocol's
    # 32 B overhead; a log's list is charged while it holds entries; all of it comes
    # back when the log is released.
    import tracemalloc

    rng = random.Random(7)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = [Entry(Index(1000 + i), Term(1), EntryKind.META, rng.randbytes(rng.choice((1, 100, 1000))))
                for i in range(2000)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    charged = sum(entry_cost_bytes(e) for e in made)
    assert held <= charged <= held * 1.1, (held, charged)
    store = harness.store
    small = entries(1, 11)
    store.append(small)
    assert store.cached_bytes == memory(small) == store._cache._budget.bytes
    assert store.cached_bytes > cost(small) + len(small) * 100
    store.release_cached(Index(4))
    assert store.cached_bytes == memory(small[4:])
    store.release_cached(Index(10))
    assert store.cached_bytes == 0 and store._cache._budget.bytes == 0 and store._cache._budget.holding() == 0


def test_a_payload_the_caller_could_mutate_is_refused(harness):
    # Goal: the cache serves entries as appended, so only immutable payloads are kept: a
    # bytearray changed after the append would make memory disagree with the file.
    mutable = Entry(Index(1), Term(1), EntryKind.META, bytearray(b"abc"))  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        harness.store._cache.remember([mutable])
