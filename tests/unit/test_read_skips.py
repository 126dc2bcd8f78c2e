"""Goal: naming the skipped batches of a read costs what the read answers, not the
number of skipped ranges up to the high watermark times the batches answered (a
mirror's read of a source with many skips used to stall the source's event loop).
"""

from __future__ import annotations

import random

from multiraft.node.partition_ops import skipped_batches
from multiraft.state.partition import PartitionState
from raftlog.types import Index, Offset
from storage.offsets import StoredBatch


class CountedBatches(list):  # type: ignore[type-arg]
    """A list of batches that counts how often it is walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.walks += 1
        return super().__iter__()


def _state(ranges: list[tuple[int, int]]) -> PartitionState:
    state = PartitionState(topic="t", partition=0)
    state.skipped_ranges = [(Offset(b), n) for b, n in ranges]
    return state


def _stored(base: int, count: int) -> StoredBatch:
    return StoredBatch(Offset(base), count, Index(0), memoryview(b""))


def test_skipped_between_is_the_linear_scan_over_ordered_disjoint_ranges() -> None:
    rng = random.Random(5)
    ranges, offset = [], 0
    for _ in range(300):
        offset += rng.randrange(0, 4)
        count = rng.randrange(1, 4)
        ranges.append((offset, count))
        offset += count
    state = _state(ranges)
    for _ in range(500):
        start = rng.randrange(0, offset + 5)
        end = start + rng.randrange(0, 30)
        want = [(b, n) for b, n in ranges if b < end and b + n > start]
        assert state.skipped_between(Offset(start), Offset(end)) == want, (start, end)


def test_many_skips_and_batches_are_named_in_one_pass() -> None:
    # 20,000 skipped ranges in the span, 40,000 batches answered (every other one skipped):
    # the batches are walked once (the quadratic version walked them per range).
    batches = CountedBatches(_stored(2 * i, 2) for i in range(40_000))
    state = _state([(4 * i, 2) for i in range(20_000)] + [(200_000 + 2 * i, 2) for i in range(100_000)])
    ranges = state.skipped_between(Offset(0), Offset(80_000))
    assert len(ranges) == 20_000  # only the span's ranges, not the 100,000 past it
    named = skipped_batches(ranges, batches)
    assert batches.walks == 1
    assert named == {(4 * i, 2) for i in range(20_000)}
    assert skipped_batches(state.skipped_between(Offset(5), Offset(9)), batches) == {(4, 2), (8, 2)}
