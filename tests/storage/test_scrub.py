"""A replica's tictac tree from its segments (storage/scrub.py): byte level, sliced,
unreadable frames counted as differences rather than served."""

from __future__ import annotations

import pytest

from raftlog.messages import HardState
from raftlog.types import Index, Term
from storage.config import StoreConfig
from storage.scrub import build_tree
from storage.tictac import LEAF_OFFSETS, compare_trees
from tests.storage.helpers import SegmentHarness, data_entry

_CONFIG = StoreConfig(segment_bytes_max=4096)


def _filled(path: str, count: int = 40, records: int = 300) -> SegmentHarness:
    harness = SegmentHarness(path, config=_CONFIG)
    store = harness.store
    for first in range(1, count + 1, 5):
        store.append([data_entry(i, 1, count=records, value_bytes=1) for i in range(first, min(first + 5, count + 1))])
    store.set_hard_state(HardState(term=Term(1), commit=Index(count)))
    store.sync()
    return harness


@pytest.fixture
def two(tmp_path):
    made = [_filled(str(tmp_path / "a")), _filled(str(tmp_path / "b"))]
    yield made
    for harness in made:
        harness.close()


def test_two_copies_of_one_log_have_one_root_and_slices_change_nothing(two):
    a, b = (harness.store for harness in two)
    hi = int(a.log_end_offset)
    assert hi == 40 * 300 and len([s for s in a.segments if s.closed]) >= 2
    whole = build_tree(a, 0, hi)
    sliced = build_tree(b, 0, hi)
    while not sliced.step(entries_max=3):
        pass
    assert whole.tree().root == sliced.tree().root and not whole.damaged
    assert whole.bytes_hashed > 0


def test_a_flipped_byte_in_a_closed_segment_is_exactly_its_leaf(two):
    # Goal: the frame fails its check, is never served, and its leaf differs.
    a, b = (harness.store for harness in two)
    target = [s for s in b.segments if s.closed][1]
    with open(target.path, "r+b") as file:
        file.seek(target.size // 2)
        byte = file.read(1)
        file.seek(target.size // 2)
        file.write(bytes([byte[0] ^ 0x01]))
    hi = int(a.log_end_offset)
    good, bad = build_tree(a, 0, hi), build_tree(b, 0, hi)
    assert len(bad.damaged) == 1
    damaged_offset = int(b.offset_after(Index(bad.damaged[0] - 1)))
    leaf = damaged_offset // LEAF_OFFSETS
    compared = compare_trees(good.tree(), bad.tree()).comparison
    assert compared.ranges == ((leaf * LEAF_OFFSETS, min(hi, (leaf + 1) * LEAF_OFFSETS)),)


def test_a_shorter_replica_compares_over_its_prefix(two):
    a, b = (harness.store for harness in two)
    full, prefix = build_tree(a, 0, int(a.log_end_offset)), build_tree(b, 0, 2 * LEAF_OFFSETS)
    compared = compare_trees(full.tree(), prefix.tree())
    assert compared.comparison.identical and compared.length_difference == 2 * LEAF_OFFSETS - 12_000
