"""Retention and segment transfer."""

from __future__ import annotations

import pytest

from raftlog.messages import HardState, Snapshot, SnapshotMeta
from raftlog.types import Index, Term
from storage.config import StoreConfig
from storage.errors import CorruptionError
from storage.transfer import (
    enforce_retention,
    install_segment,
    list_closed_segments,
    read_segment_chunk,
)
from tests.storage.helpers import SegmentHarness, data_entry


def _fill(harness: SegmentHarness, count: int) -> None:
    store = harness.store
    for first in range(1, count + 1, 5):
        store.append(
            [
                data_entry(i, 1, count=2, value_bytes=60)
                for i in range(first, min(first + 5, count + 1))
            ]
        )
        harness.now_ms[0] += 1000
    store.set_hard_state(HardState(term=Term(1), commit=Index(count)))
    store.sync()


def test_retention_by_size_and_time(tmp_path):
    # Goal: retention deletes only closed segments below applied, and advances the log start.
    config = StoreConfig(segment_bytes_max=4096, retention_bytes=10_000, retention_ms=None)
    harness = SegmentHarness(str(tmp_path), config=config)
    _fill(harness, 80)
    store = harness.store
    assert enforce_retention(store, harness.now_ms[0], applied=Index(0)) == 1
    first = enforce_retention(store, harness.now_ms[0], applied=Index(80))
    assert first > 1 and store.log_start_offset == (first - 1) * 2
    assert sum(s.size for s in store.segments) <= 10_000 + store.segments[0].size
    store = harness.crash()
    assert store.first_index() == first and store.recovery.corruption == ()
    harness.close()
    timed = SegmentHarness(
        str(tmp_path / "timed"), config=StoreConfig(segment_bytes_max=4096, retention_ms=3000)
    )
    _fill(timed, 80)
    before = len(timed.store.segments)
    enforce_retention(timed.store, timed.now_ms[0], applied=Index(80))
    assert 0 < len(timed.store.segments) < before
    timed.close()


def test_segment_transfer_round_trip(tmp_path):
    # Goal: a follower installs the leader's closed segments and reads the same entries.
    leader = SegmentHarness(str(tmp_path / "leader"), config=StoreConfig(segment_bytes_max=4096))
    _fill(leader, 60)
    descriptors = list_closed_segments(leader.store)
    assert len(descriptors) >= 2
    follower = SegmentHarness(
        str(tmp_path / "follower"), config=StoreConfig(segment_bytes_max=4096)
    )
    follower.store.apply_snapshot(
        Snapshot(
            meta=SnapshotMeta(
                index=Index(0), term=Term(0), membership=leader.store.snapshot().meta.membership
            )
        )
    )
    directory = follower.store.directory
    for descriptor in descriptors:
        chunks = [
            read_segment_chunk(leader.store, descriptor.first_index, position, 1000)
            for position in range(0, descriptor.size_bytes, 1000)
        ]
        install_segment(follower.files, directory, descriptor, chunks)
    store = follower.crash()
    last = descriptors[-1].last_index
    assert store.last_index() == last and store.recovery.corruption == ()
    assert store.entries(Index(1), Index(last + 1), 1 << 30) == leader.store.entries(
        Index(1), Index(last + 1), 1 << 30
    )
    damaged = [b"x" * descriptors[0].size_bytes]
    with pytest.raises(CorruptionError):
        install_segment(follower.files, str(tmp_path), descriptors[0], damaged)
    leader.close()
    follower.close()


def test_file_crc_by_path_matches_the_stores(tmp_path):
    # Goal: the CRC a far-horizon transfer computes on a thread (by path) is the one the
    # store computes through its Files, the one a follower checks against.
    from storage.transfer import file_crc

    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096), durable_files=False)
    _fill(harness, 40)
    closed = [s for s in harness.store.segments if s.closed]
    by_path = [file_crc(s.path) for s in closed]
    assert by_path == [d.crc for d in list_closed_segments(harness.store)]
    harness.close()
