"""Tree sidecars (storage/tree_sidecar.py, storage/scrub.py) against a log that changes under
them: a segment replaced while its sidecar is computed, a log starting inside a segment, a
sidecar that cannot be unlinked, and the write's cost (no fsync: a cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.messages import Entry, EntryKind, HardState
from raftlog.types import Index, Term
from storage.config import StoreConfig
from storage.scrub import SegmentLeavesBuilder, build_tree, valid_sidecar, write_made
from storage.segments import SegmentStore
from storage.tree_sidecar import is_sidecar, sidecar_path
from tests.storage.helpers import SegmentHarness, batch, data_entry
from tests.storage.test_tree_sidecars import _closed, _sidecar_every_closed_segment, reference_tree

SMALL = StoreConfig(segment_bytes_max=4096)


def _shaped(index: int, term: int) -> Entry:
    """An entry whose frame has the same size whatever its term: same records, other bytes."""
    return Entry(Index(index), Term(term), EntryKind.DATA, batch(5, 40, seed=index + 100 * term))


def _fill(store: SegmentStore, term: int, lo: int, hi: int) -> None:
    for first in range(lo, hi, 4):
        store.append([_shaped(i, term) for i in range(first, min(hi, first + 4))])


@pytest.mark.parametrize("cut_in", ["earlier", "same"])
def test_a_segment_replaced_while_its_sidecar_is_computed_gets_no_sidecar(tmp_path: Path, cut_in: str) -> None:
    # Goal: a Raft conflict truncating into an earlier segment (the segment read is dropped, and
    # a new one of the same name is made) or into the segment read itself (reopened, then closed
    # again), refilled in the same shape (same indexes, sizes and offsets, other bytes), between
    # two slices of a sidecar's build: the build never hands back a sidecar describing a mix of
    # the two, nothing is written, and a tree built afterwards is the log's.
    harness = SegmentHarness(str(tmp_path), config=SMALL)
    store = harness.store
    _fill(store, 1, 1, 61)
    store.set_hard_state(HardState(term=Term(1), commit=Index(4)))
    store.sync()
    earlier, target = _closed(store)[1:3]
    shape = (target.first_index, target.last_index, target.size, target.first_offset, target.next_offset)
    builder = SegmentLeavesBuilder(store, target)
    assert not builder.step(entries_max=2)  # the first two entries read, of term 1
    cut = Index(earlier.first_index + 4) if cut_in == "earlier" else Index(target.first_index + 1)
    boundary = cut + ((1 - cut) % 4 or 4)  # the first fill's appends began at 1, 5, 9, ...: so do these
    store.append([_shaped(i, 2) for i in range(cut, boundary)])  # the conflict: a truncation from `cut`
    _fill(store, 2, boundary, 61)  # then term 2 in the same shape
    store.set_hard_state(HardState(term=Term(2), commit=Index(60)))
    store.sync()
    now = store.segment_of(target.first_index)
    assert now.closed and (now.first_index, now.last_index, now.size, now.first_offset, now.next_offset) == shape
    while not builder.step(entries_max=2):
        pass
    assert write_made(store, builder) == 0, "a sidecar of a mix of two segments' frames was written"
    hi = int(store.log_end_offset)
    assert valid_sidecar(store, now) is None
    assert build_tree(store, 0, hi).tree() == reference_tree(store, 0, hi)
    harness.close()


def test_a_log_starting_inside_a_segment_builds_from_its_start(tmp_path: Path) -> None:
    # Goal: a log compacted into the middle of its first segment (entries before the start are
    # gone, the segment stays): a build from the log start reads from the first index, never
    # below it, and is the reference tree; that segment gets no sidecar (it is not whole).
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=1 << 20))
    store = harness.store
    store.append([Entry(Index(1), Term(1), EntryKind.NOOP, b""), Entry(Index(2), Term(1), EntryKind.NOOP, b"")]
                 + [data_entry(i, 1) for i in range(3, 10)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(9)))
    store.sync()
    store.compact(Index(2))  # two NOOPs: the log start offset is still the segment's first offset
    assert store.segments[0].first_index < store.first_index()
    assert store.segments[0].first_offset == store.log_start_offset
    lo, hi = int(store.log_start_offset), int(store.log_end_offset)
    built = build_tree(store, lo, hi)
    assert built.tree() == reference_tree(store, lo, hi) and built.made == [] and not built.damaged
    harness.close()


def test_a_sidecar_that_cannot_be_unlinked_never_stops_a_truncation_or_a_retention_drop(tmp_path: Path) -> None:
    # Goal: forgetting a sidecar is a cache's cleanup: an unlink that fails (EACCES, EIO) is
    # logged, and the truncation or the retention drop around it completes; a sidecar left
    # behind never matches what the store holds after.
    harness = SegmentHarness(str(tmp_path), config=SMALL, durable_files=False)
    store = harness.store
    _fill(store, 1, 1, 61)
    store.set_hard_state(HardState(term=Term(1), commit=Index(20)))
    store.sync()
    assert _sidecar_every_closed_segment(store) > 3
    files, unlink = store.files, store.files.unlink

    def failing(path: str) -> None:
        if is_sidecar(os.path.basename(path)):
            raise PermissionError(13, "permission denied", path)
        unlink(path)

    files.unlink = failing  # type: ignore[method-assign]
    first = _closed(store)[0]
    store.compact(Index(_closed(store)[1].first_index))  # retention: the first segment goes
    assert not os.path.exists(first.path) and os.path.exists(sidecar_path(first.path))
    truncated = _closed(store)[-1]
    store.append([_shaped(truncated.first_index + 1, 2)])  # a conflict inside the last closed segment
    assert store.last_index() == truncated.first_index + 1
    _fill(store, 2, truncated.first_index + 2, 61)
    store.set_hard_state(HardState(term=Term(2), commit=Index(60)))
    store.sync()
    lo, hi = int(store.log_start_offset), int(store.log_end_offset)
    assert build_tree(store, lo, hi).tree() == reference_tree(store, lo, hi)
    harness.close()


def test_a_sidecar_write_syncs_nothing(tmp_path: Path) -> None:
    # Goal: a sidecar is a cache checked by its CRC and stamp: written with no fsync of the
    # file nor of the directory (two disk flushes a verify would otherwise wait for).
    harness = SegmentHarness(str(tmp_path), config=SMALL, durable_files=False)
    store = harness.store
    _fill(store, 1, 1, 41)
    store.set_hard_state(HardState(term=Term(1), commit=Index(40)))
    store.sync()
    synced: list[str] = []
    files = store.files
    files.fsync = lambda handle: synced.append(handle.path)  # type: ignore[method-assign]
    files.detached_fsync = lambda handle: lambda: synced.append(handle.path)  # type: ignore[method-assign]
    files.sync_dir = synced.append  # type: ignore[method-assign]
    hi = int(store.log_end_offset)
    built = build_tree(store, 0, hi)
    assert write_made(store, built) == len(built.made) > 2
    assert synced == []
    assert all(valid_sidecar(store, s) is not None for s in _closed(store) if s.first_offset > 0)
    harness.close()
