"""Bad input and damaged files: each is detected, never served, never acknowledged."""

from __future__ import annotations

import os

import pytest

from raftlog.messages import HardState
from raftlog.storage import UnavailableError
from raftlog.types import Index, Offset, Term
from storage.config import StoreConfig
from storage.errors import CorruptionError, DiskFullError, InvalidBatchError, OffsetOutOfRangeError
from storage.frames import encode_frame
from storage.offsets import read_records
from tests.storage.helpers import SegmentHarness, data_entry

_CONFIG = StoreConfig(segment_bytes_max=4096)


@pytest.fixture
def harness(tmp_path):
    made = SegmentHarness(str(tmp_path), config=_CONFIG)
    yield made
    made.close()


def _fill(harness: SegmentHarness, count: int, commit: int) -> None:
    store = harness.store
    for first in range(1, count + 1, 5):  # several appends, so segments roll
        last = min(first + 5, count + 1)
        store.append([data_entry(i, 1, count=3, value_bytes=50) for i in range(first, last)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(commit)))
    store.sync()


def _segment_paths(harness: SegmentHarness) -> list[str]:
    return [s.path for s in harness.store.segments]


def _reopen(harness: SegmentHarness):
    return harness.crash()


def test_truncated_tail_is_cut_back(harness):
    # Goal: a frame cut short at the end (torn write) is truncated, not reported.
    _fill(harness, 40, commit=30)
    last = _segment_paths(harness)[-1]
    os.truncate(last, os.path.getsize(last) - 7)
    store = _reopen(harness)
    assert store.recovery.corruption == ()
    assert store.recovery.truncated_tail_bytes > 0
    assert store.last_index() == 39
    store.append([data_entry(40, 1)])
    assert store.last_index() == 40


def test_garbage_tail_is_cut_back(harness):
    # Goal: random bytes after the last frame are dropped.
    _fill(harness, 40, commit=40)
    with open(_segment_paths(harness)[-1], "ab") as file:
        file.write(os.urandom(100))
    store = _reopen(harness)
    assert store.recovery.corruption == () and store.recovery.truncated_tail_bytes == 100
    assert store.last_index() == 40


def test_bit_flip_inside_last_segment_needs_repair(harness):
    # Goal: damage followed by valid frames is corruption: reported, cut, remembered.
    _fill(harness, 40, commit=10)
    last = _segment_paths(harness)[-1]
    store = harness.store
    first_in_last = store.segments[-1].first_index
    with open(last, "r+b") as file:
        file.seek(60)  # inside the first frame's payload
        byte = file.read(1)
        file.seek(60)
        file.write(bytes([byte[0] ^ 0x10]))
    store = _reopen(harness)
    assert store.recovery.needs_repair
    assert store.repair_reason is not None
    assert store.initial_state().needs_repair, "the core learns it must not vote or lead"
    assert store.last_index() == first_in_last - 1, "nothing from the damage on is served"
    store = _reopen(harness)
    assert store.repair_reason is not None, "the marker survives a restart"
    store.mark_repaired()
    assert _reopen(harness).repair_reason is None


def test_torn_tail_below_commit_needs_repair(harness):
    # Goal: losing a committed entry is never silently accepted as a torn tail.
    _fill(harness, 40, commit=40)
    last = _segment_paths(harness)[-1]
    os.truncate(last, os.path.getsize(last) - 7)
    store = _reopen(harness)
    assert store.recovery.needs_repair
    # The core starts from what is there: the commit clamped to the log end; the node
    # keeps the replica from voting until its leader gave back up to the old commit.
    assert store.initial_state().hard_state.commit == store.last_index() == 39
    assert store.initial_state().needs_repair and store.repair_until == 40


def test_bit_flip_in_closed_segment_is_never_served(harness):
    # Goal: reads check every frame's CRC; a flipped bit raises instead of serving.
    _fill(harness, 40, commit=40)
    first = _segment_paths(harness)[0]
    with open(first, "r+b") as file:
        file.seek(100)
        byte = file.read(1)
        file.seek(100)
        file.write(bytes([byte[0] ^ 0x01]))
    store = _reopen(harness)
    with pytest.raises(CorruptionError):
        store.entries(Index(1), Index(5), 1 << 20)


def test_a_bad_frame_met_by_a_read_is_cut_away_at_the_next_open(harness):
    # Goal: a closed segment whose size matches its catalog entry is trusted at open,
    # so a flipped bit in it survives a plain reopen; after a read met it
    # (request_full_check), the next open scans every segment, cuts the log before the
    # bad frame and marks the log for repair, once (the check is not repeated).
    _fill(harness, 40, commit=40)
    with open(_segment_paths(harness)[1], "r+b") as file:
        file.seek(100)
        byte = file.read(1)
        file.seek(100)
        file.write(bytes([byte[0] ^ 0x01]))
    store = _reopen(harness)
    assert not store.recovery.needs_repair and store.last_index() == 40, "trusted by its catalog entry"
    bad_segment_first = store.segments[1].first_index
    with pytest.raises(CorruptionError):
        store.entries(bad_segment_first, Index(40), 1 << 20)
    store.request_full_check()
    store = _reopen(harness)
    assert store.recovery.needs_repair
    assert bad_segment_first <= store.last_index() + 1 < 40
    assert len(store.entries(Index(1), Index(store.last_index() + 1), 1 << 20)) == store.last_index()
    store = _reopen(harness)
    assert store.recovery.rescanned_segments == 1, "only the open segment: the full check ran once"


def test_truncated_closed_segment_needs_repair(harness):
    # Goal: a closed segment shorter than its catalog entry is corruption.
    _fill(harness, 40, commit=40)
    first = _segment_paths(harness)[0]
    os.truncate(first, os.path.getsize(first) - 1)
    store = _reopen(harness)
    assert store.recovery.needs_repair
    assert store.last_index() < 40


def test_missing_newest_segment_needs_repair(harness):
    # Goal: deleting the newest segment is detected (the database remembers it).
    _fill(harness, 40, commit=5)
    os.unlink(_segment_paths(harness)[-1])
    store = _reopen(harness)
    assert any("missing" in reason for reason in store.recovery.corruption)


def test_disk_full_acknowledges_nothing_and_recovers(harness):
    # Goal: ENOSPC fails the append cleanly; nothing half-written; works again later.
    _fill(harness, 5, commit=5)
    store = harness.store
    size_before = store.segments[-1].size
    harness.files.free_bytes = 30  # less than one frame
    with pytest.raises(DiskFullError):
        store.append([data_entry(6, 1), data_entry(7, 1)])
    assert store.last_index() == 5
    assert store.segments[-1].size == size_before, "the partial write was cut back"
    harness.files.free_bytes = None
    store.append([data_entry(6, 1)])
    assert store.sync().durable_index == 6
    store = _reopen(harness)
    assert store.last_index() == 6 and store.recovery.corruption == ()


def test_reads_out_of_range(harness):
    # Goal: beyond the end and below the log start are typed, with the start carried.
    _fill(harness, 10, commit=10)
    store = harness.store
    with pytest.raises(UnavailableError):
        store.entries(Index(5), Index(12), 100)
    with pytest.raises(OffsetOutOfRangeError) as raised:
        read_records(store, Offset(31), end_offset=Offset(30), max_records=1, max_bytes=1)
    assert raised.value.log_start_offset == 0 and raised.value.log_end_offset == 30


def test_received_frames_with_bad_crc_or_lying_length_are_rejected(harness):
    # Goal: frames from the wire are validated before a single byte is stored.
    _fill(harness, 3, commit=3)
    store = harness.store
    header, payload = encode_frame(data_entry(4, 1, count=3), Offset(9), 3)
    good = header + payload
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    lying = bytearray(good)
    lying[0:4] = (len(good) + 100).to_bytes(4, "big")
    miscounted_header, _ = encode_frame(data_entry(4, 1, count=3), Offset(9), 5)
    size_before = store.segments[-1].size
    for bad in (bytes(flipped), bytes(lying), miscounted_header + payload, good[:-3]):
        with pytest.raises(InvalidBatchError):
            store.append_frames(bad)
        assert store.last_index() == 3 and store.segments[-1].size == size_before
    store.append_frames(good)
    assert store.last_index() == 4
    assert store.entries(Index(4), Index(5), 1 << 20) == [data_entry(4, 1, count=3)]


def test_a_failed_flush_of_unsynced_bytes_leaves_the_file_appendable(tmp_path):
    # Goal: ENOSPC while the write-behind double flushes its unsynced tail must not pin
    # that tail (a kept traceback holding views of it made every later append fail).
    import errno

    from storage.write_behind import WriteBehindFiles

    files = WriteBehindFiles(str(tmp_path))
    handle = files.create(str(tmp_path / "f"))
    files.append(handle, [b"x" * 100])
    real_writev = os.writev

    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")

    os.writev = full
    try:
        with pytest.raises(OSError) as failure:  # kept alive, as a failed task keeps its exception
            files.fsync(handle)
    finally:
        os.writev = real_writev
    files.append(handle, [b"y" * 10])
    files.fsync(handle)
    assert files.read(handle, 0, 110) == b"x" * 100 + b"y" * 10
    assert failure.value.errno == errno.ENOSPC


def test_a_partial_flush_leaves_no_stray_bytes_on_disk(tmp_path):
    # Goal: when the double's flush writes part of the tail and then hits ENOSPC, the
    # part is cut from the OS file again; otherwise the retried flush appends after it
    # and what a crash leaves is garbage in the middle (chaos seed 305: a segment whose
    # first frame "declares an impossible length").
    import errno

    from storage.write_behind import WriteBehindFiles

    files = WriteBehindFiles(str(tmp_path))
    path = str(tmp_path / "f")
    handle = files.create(path)
    files.sync_dir(str(tmp_path))
    files.append(handle, [b"a" * 10])
    files.fsync(handle)
    files.append(handle, [b"x" * 100])
    real_writev = os.writev
    calls = []

    def fills_the_disk(fd, buffers):
        calls.append(fd)
        if len(calls) == 1:
            return os.write(fd, bytes(buffers[0])[:37])  # the part that fit
        raise OSError(errno.ENOSPC, "No space left on device")

    os.writev = fills_the_disk
    try:
        with pytest.raises(OSError):
            files.fsync(handle)
    finally:
        os.writev = real_writev
    assert os.path.getsize(path) == 10, "the partial write was cut from the OS file"
    files.fsync(handle)
    with open(path, "rb") as stored:  # what a kill -9 now would leave
        assert stored.read() == b"a" * 10 + b"x" * 100


class _CountingDatabase:
    """The state database, counting synced writes (the harness's own, wrapped)."""

    def __init__(self, db) -> None:
        self._db = db
        self.synced = 0

    def write(self, batch, *, sync: bool) -> None:
        self.synced += int(sync)
        self._db.write(batch, sync=sync)

    def __getattr__(self, name):
        return getattr(self._db, name)


def _reopen_counting(harness: SegmentHarness) -> int:
    harness.store.close()
    counting = _CountingDatabase(harness.db)
    harness.db = counting
    harness.store = harness._open()
    return counting.synced


def test_a_clean_reopen_makes_no_synced_database_write(harness):
    # Goal: a recovery that changed nothing on disk writes its state unsynced (a node
    # reopening 10,000 replicas made 10,000 synced writes), and reads back the same log.
    _fill(harness, 40, commit=30)
    before = [(s.first_index, s.last_index) for s in harness.store.segments]
    assert _reopen_counting(harness) == 0
    assert [(s.first_index, s.last_index) for s in harness.store.segments] == before
    assert harness.store.recovery.corruption == ()


def test_a_reopen_that_cuts_a_torn_tail_syncs_its_state(harness):
    # Goal: a recovery that changed the disk makes what it wrote durable at once.
    _fill(harness, 40, commit=30)
    last = _segment_paths(harness)[-1]
    os.truncate(last, os.path.getsize(last) - 7)
    assert _reopen_counting(harness) == 1
    assert harness.store.recovery.truncated_tail_bytes > 0
