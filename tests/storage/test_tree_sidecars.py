"""Closed segments' tree sidecars (storage/tree_sidecar.py, storage/scrub.py): a tree composed
from sidecars is the tree read from the log, bit for bit, and a sidecar that does not
describe its segment as it is now is never used."""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.messages import Entry, EntryKind, HardState
from raftlog.types import Index, Term
from storage.config import StoreConfig
from storage.far_install import replace_log
from storage.node_state import StartPoint
from storage.scrub import build_tree, valid_sidecar, write_made
from storage.segments import SegmentStore
from storage.tictac import LeafAccumulator, TicTacTree, element_hash
from storage.tree_sidecar import decode, encode, is_sidecar, read_sidecar, sidecar_path
from tests.storage.helpers import GROUP, SegmentHarness, batch, data_entry
from tests.storage.test_far_install import _leader, _stage

SMALL = StoreConfig(segment_bytes_max=4096)


def reference_tree(store: SegmentStore, lo: int, hi: int) -> TicTacTree:
    """The tree as defined (docs/mirror.md), from every frame of the log: each DATA batch whose
    base offset lies in `[lo, hi)`, hashed with its base offset. No sidecar, no shortcut."""
    leaves = LeafAccumulator(lo, hi)
    for info, payload in store.frames(store.first_index(), Index(store.last_index() + 1)):
        if info.kind is EntryKind.DATA and lo <= info.base_offset < hi:
            leaves.add(info.base_offset, element_hash(info.base_offset, payload))
    return leaves.tree()


def _fill(store: SegmentStore, rng: random.Random, entries_count: int, term: int = 1) -> None:
    """Batches of 1..700 records and 1..300-byte values, NOOP/META entries between, appended a
    few at a time (segments roll between appends)."""
    index = store.last_index() + 1
    end = index + entries_count
    while index < end:
        chunk = []
        for i in range(index, min(end, index + rng.randint(1, 6))):
            roll = rng.random()
            if roll < 0.15:
                chunk.append(Entry(Index(i), Term(term), EntryKind.META, b"meta-%d" % i))
            elif roll < 0.2:
                chunk.append(Entry(Index(i), Term(term), EntryKind.NOOP, b""))
            else:
                chunk.append(Entry(Index(i), Term(term), EntryKind.DATA,
                                   batch(rng.randint(1, 700), rng.randint(1, 300), seed=i + 1000 * term)))
        store.append(chunk)
        index += len(chunk)
    store.set_hard_state(HardState(term=Term(term), commit=store.last_index()))
    store.sync()


def _sidecar_every_closed_segment(store: SegmentStore) -> int:
    """What the warmer does: a deep build over the whole log, its sidecars written; then their
    names synced, so that the tests see them on the OS (the write-behind double holds names
    back until a `sync_dir`; the node never syncs a sidecar: a cache)."""
    written = write_made(store, build_tree(store, int(store.log_start_offset), int(store.log_end_offset), deep=True))
    store.files.sync_dir(store.directory)
    return written


def _closed(store: SegmentStore) -> list:
    return [s for s in store.segments if s.closed]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), segment_bytes=st.sampled_from([4096, 9000, 60_000]),
       written=st.floats(0, 1), spans=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=8),
       compacted=st.one_of(st.none(), st.floats(0, 1)))
def test_a_tree_composed_from_sidecars_is_the_tree_read_from_the_log(tmp_path_factory, seed, segment_bytes,
                                                                       written, spans, compacted) -> None:
    # Goal: random logs (batches of random sizes and counts, non-DATA entries between, segments
    # of several sizes), sometimes compacted at a random entry (the log then starts inside a
    # segment, or past whole ones), sidecars on a random share of the closed segments, random
    # spans within the log: the tree a build makes (sidecars where they match, the rest read)
    # is the reference tree, and so are a deep build's and the build with no sidecar at all.
    rng = random.Random(seed)
    harness = SegmentHarness(str(tmp_path_factory.mktemp("log")), config=StoreConfig(segment_bytes_max=segment_bytes))
    try:
        store = harness.store
        _fill(store, rng, rng.randint(1, 160))
        if compacted is not None:
            store.compact(Index(int(compacted * int(store.last_index()))))
        start, hi = int(store.log_start_offset), int(store.log_end_offset)
        spans = [(start + int(lo * (hi - start)), width) for lo, width in spans]
        bare = [build_tree(store, lo, lo + int(width * (hi - lo))) for lo, width in spans]
        chosen = [s for s in _closed(store) if s.first_index >= store.first_index() and rng.random() < written]
        for segment in chosen:
            made = build_tree(store, int(segment.first_offset), int(segment.next_offset), deep=True)
            write_made(store, made)
        for (lo, width), without in zip(spans, bare, strict=True):
            span_hi = lo + int(width * (hi - lo))
            expected = reference_tree(store, lo, span_hi)
            quick, deep = build_tree(store, lo, span_hi), build_tree(store, lo, span_hi, deep=True)
            assert quick.tree() == expected == deep.tree() == without.tree()
            assert not quick.damaged and not deep.damaged and not deep.mismatched
            assert deep.from_sidecars == 0
            whole = [s for s in _closed(store) if lo <= s.first_offset and s.next_offset <= span_hi
                     and s.first_index >= store.first_index()]
            assert quick.from_sidecars == sum(1 for s in whole if valid_sidecar(store, s) is not None)
    finally:
        harness.close()


def test_identical_copies_read_only_their_open_segments_once_sidecars_are_written(tmp_path: Path) -> None:
    # Goal: the point of it: with every closed segment's sidecar written, a tree of the whole
    # log hashes only the open segment's batches. Sidecars are not fsynced (a cache): after a
    # power failure, whatever of them survived, the tree is the same.
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    _fill(store, random.Random(7), 120)
    hi = int(store.log_end_offset)
    first = build_tree(store, 0, hi)
    assert first.from_sidecars == 0 and len(first.made) == len(_closed(store)) - (store.segments[0].first_offset > 0)
    assert write_made(store, first) == len(first.made)
    again = build_tree(store, 0, hi)
    open_segment = store.segments[-1]
    assert again.tree() == first.tree() == reference_tree(store, 0, hi)
    assert again.from_sidecars == len(first.made) and again.made == []
    assert again.bytes_hashed <= open_segment.size
    store = harness.crash()  # a power failure: the sidecars' names and bytes were never synced
    after = build_tree(store, 0, hi)
    assert after.tree() == first.tree() == reference_tree(store, 0, hi)
    harness.close()


def test_a_sidecar_that_does_not_match_is_ignored_and_rebuilt(tmp_path: Path) -> None:
    # Goal: a sidecar is used only when its CRC holds and its stamp is its segment's now:
    # one with a flipped byte, one moved beside another segment, and one describing a longer
    # copy of its segment (a mirror repair's cut copy, a file replaced) are each ignored,
    # the segment read, and a matching sidecar made in their place.
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    _fill(store, random.Random(3), 100)
    _sidecar_every_closed_segment(store)
    a, b, c = _closed(store)[1:4]
    raw = Path(sidecar_path(a.path)).read_bytes()
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x10
    assert decode(bytes(flipped)) is None and decode(raw) is not None
    Path(sidecar_path(a.path)).write_bytes(bytes(flipped))
    Path(sidecar_path(b.path)).write_bytes(Path(sidecar_path(c.path)).read_bytes())  # c's, beside b
    longer = decode(Path(sidecar_path(c.path)).read_bytes())
    assert longer is not None
    stamp = longer.stamp
    wrong = type(longer)(type(stamp)(stamp.first_index, stamp.last_index + 1, stamp.size + 100, stamp.first_offset,
                                     stamp.next_offset + 5, stamp.last_term, stamp.last_crc), longer.leaves)
    Path(sidecar_path(c.path)).write_bytes(encode(wrong))
    harness.store.close()
    harness.store = store = harness._open()  # a reopen: only OS bytes (the writes above bypassed the double)
    for segment in (a, b, c):
        assert valid_sidecar(store, store.segment_of(segment.first_index)) is None
    hi = int(store.log_end_offset)
    built = build_tree(store, 0, hi)
    assert built.tree() == reference_tree(store, 0, hi)
    assert sorted(s.stamp.first_index for s in built.made) == [a.first_index, b.first_index, c.first_index]
    write_made(store, built)
    assert all(valid_sidecar(store, s) is not None for s in _closed(store) if s.first_offset > 0)
    harness.close()


def test_a_raft_truncation_into_a_closed_segment_drops_its_sidecar(tmp_path: Path) -> None:
    # Goal: a conflict truncating into a closed segment (a follower's uncommitted entries)
    # reopens it: its sidecar goes, and entries of the new term appended in the same shape
    # (same sizes, same record counts) never meet the old sidecar.
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    for first in range(1, 41, 4):
        store.append([data_entry(i, 1, count=5, value_bytes=40) for i in range(first, first + 4)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(4)))
    store.sync()
    _sidecar_every_closed_segment(store)
    target = _closed(store)[2]
    assert os.path.exists(sidecar_path(target.path))
    cut = Index(target.first_index + 1)
    later = [s.path for s in store.segments if s.first_index > target.first_index]
    store.append([data_entry(cut, 2, count=5, value_bytes=40)])  # the conflict: truncates from `cut`
    assert not os.path.exists(sidecar_path(target.path))
    assert not any(os.path.exists(sidecar_path(p)) for p in later)
    store.append([data_entry(i, 2, count=5, value_bytes=40) for i in range(cut + 1, 41)])
    store.set_hard_state(HardState(term=Term(2), commit=Index(40)))
    store.sync()
    hi = int(store.log_end_offset)
    assert build_tree(store, 0, hi).tree() == reference_tree(store, 0, hi)
    harness.close()


def test_retention_deletes_sidecars_with_their_segments(tmp_path: Path) -> None:
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    _fill(store, random.Random(5), 80)
    _sidecar_every_closed_segment(store)
    dropped = [s.path for s in _closed(store)[:3]]
    assert all(os.path.exists(sidecar_path(p)) for p in dropped)
    store.compact(Index(_closed(store)[3].first_index))
    assert not any(os.path.exists(p) or os.path.exists(sidecar_path(p)) for p in dropped)
    lo, hi = int(store.log_start_offset), int(store.log_end_offset)
    assert build_tree(store, lo, hi).tree() == reference_tree(store, lo, hi)
    harness.close()


def test_recovery_cutting_a_rotten_segment_never_uses_its_sidecar(tmp_path: Path) -> None:
    # Goal: rot in a closed segment under its sidecar is not seen by a build that takes the
    # sidecar (rot does not update it), is seen by a deep one (damaged), and once the full
    # check at reopen cuts the log at the bad frame, the cut segment's sidecar (and those of
    # the segments removed after it) are never used: the tree is the cut log's.
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    for first in range(1, 61, 3):
        store.append([data_entry(i, 1, count=7, value_bytes=30) for i in range(first, first + 3)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(60)))
    store.sync()
    _sidecar_every_closed_segment(store)
    target = _closed(store)[3]
    hi = int(store.log_end_offset)
    sound = build_tree(store, 0, hi).tree()
    with open(target.path, "r+b") as file:
        file.seek(target.size - 10)  # inside its last frame's payload
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x01]))
    assert build_tree(store, 0, hi).tree() == sound, "taken from the sidecar: the rot is not read"
    deep = build_tree(store, 0, hi, deep=True)
    assert deep.damaged == [int(target.last_index)] and deep.tree() != sound
    store.request_full_check()
    store = harness.crash()
    assert store.recovery.corruption and store.last_index() < target.last_index
    assert [name for name in os.listdir(store.directory) if is_sidecar(name)
            and not os.path.exists(os.path.join(store.directory, name.removesuffix(".leaves")))] == []
    cut_hi = int(store.log_end_offset)
    built = build_tree(store, 0, cut_hi)
    assert built.tree() == reference_tree(store, 0, cut_hi) and not built.damaged
    harness.close()


def test_a_changed_segment_whose_frames_pass_their_checks_is_a_deep_mismatch(tmp_path: Path) -> None:
    # Goal: bytes changed under an unchanged stamp with every CRC fixed up (a bug, not rot):
    # a build from the sidecar cannot see it; a deep build reads the new bytes, names the
    # segment `mismatched` and makes the sidecar that describes them.
    harness = SegmentHarness(str(tmp_path), config=SMALL, durable_files=False)
    store = harness.store
    for first in range(1, 41, 4):
        store.append([data_entry(i, 1, count=5, value_bytes=40) for i in range(first, first + 4)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(40)))
    store.sync()
    _sidecar_every_closed_segment(store)
    target = _closed(store)[1]
    hi = int(store.log_end_offset)
    before = build_tree(store, 0, hi).tree()
    _rewrite_middle_frame(store, target)
    assert build_tree(store, 0, hi).tree() == before
    deep = build_tree(store, 0, hi, deep=True)
    assert deep.mismatched == [int(target.first_index)] and not deep.damaged
    assert deep.tree() == reference_tree(store, 0, hi) != before
    assert write_made(store, deep) == 1
    assert build_tree(store, 0, hi).tree() == deep.tree()
    harness.close()


def _rewrite_middle_frame(store: SegmentStore, segment) -> None:
    """Change a byte of a DATA frame's payload that is not the segment's last, and its CRC."""
    index = Index(segment.first_index + 1)
    assert index < segment.last_index
    start = store._position(segment, index)
    end = store._position(segment, Index(index + 1))
    with open(segment.path, "r+b") as file:
        file.seek(start)
        frame = bytearray(file.read(end - start))
        frame[-5] ^= 0x01  # a byte of a record's value
        struct.pack_into(">I", frame, 4, zlib.crc32(frame[8:]))
        file.seek(start)
        file.write(frame)


def test_a_far_catch_up_install_removes_the_sidecars_it_replaces(tmp_path: Path) -> None:
    # Goal: a follower's log replaced by its leader's segments keeps none of its sidecars (same
    # names as the installed segments), and its trees are the leader's.
    leader = _leader(str(tmp_path / "leader"))
    follower = SegmentHarness(str(tmp_path / "follower"), config=SMALL)
    for first in range(1, 61, 6):  # the same indexes, other batches: its segments have the leader's names
        follower.store.append([data_entry(i, 1, count=3, value_bytes=49) for i in range(first, first + 6)])
    follower.store.set_hard_state(HardState(term=Term(1), commit=Index(30)))
    follower.store.sync()
    assert _sidecar_every_closed_segment(follower.store) > 2
    staged = _stage(leader, follower, Index(120))
    follower.store.close()
    start = StartPoint(leader.store.snapshot(), leader.store.log_start_offset)
    replace_log(GROUP, follower.store.directory, follower.db, follower.files, staged, start, Term(2),
                follower.now_ms[0])
    store = follower.crash()
    assert not any(is_sidecar(name) for name in os.listdir(store.directory))
    upto = staged[-1].descriptor.last_index
    hi = int(store.offset_after(upto))
    assert build_tree(store, 0, hi).tree() == build_tree(leader.store, 0, hi).tree() == reference_tree(store, 0, hi)
    assert read_sidecar(store.files, store.segments[0].path) is None
    leader.close()
    follower.close()


@pytest.mark.parametrize("deep", [False, True])
def test_a_damaged_segment_gets_no_sidecar_and_its_damage_is_where_a_plain_read_puts_it(tmp_path: Path,
                                                                                       deep: bool) -> None:
    # Goal: a closed segment without a sidecar whose read fails its check is read again
    # directly: the same damaged entry and the same tree as the reference build marks, no sidecar.
    clean = SegmentHarness(str(tmp_path / "clean"), config=SMALL)
    rotten = SegmentHarness(str(tmp_path / "rotten"), config=SMALL)
    for harness in (clean, rotten):
        for first in range(1, 61, 3):
            harness.store.append([data_entry(i, 1, count=7, value_bytes=30) for i in range(first, first + 3)])
        harness.store.set_hard_state(HardState(term=Term(1), commit=Index(60)))
        harness.store.sync()
    target = _closed(rotten.store)[2]
    with open(target.path, "r+b") as file:
        file.seek(target.size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x01]))
    hi = int(clean.store.log_end_offset)
    built = build_tree(rotten.store, 0, hi, deep=deep)
    assert len(built.damaged) == 1 and target.first_index <= built.damaged[0] <= target.last_index
    assert all(s.stamp.first_index != target.first_index for s in built.made)
    differs = [leaf for leaf, (a, b) in enumerate(zip(built.tree().levels[0], build_tree(clean.store, 0, hi).tree()
                                                      .levels[0], strict=True)) if a != b]
    assert len(differs) == 1
    clean.close()
    rotten.close()
