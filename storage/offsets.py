"""Reads by logical offset: what consumers fetch.

An offset maps to the DATA entry whose batch holds it: the open segment answers
from memory, closed segments through the database (`seek_for_prev` on the
big-endian offset keys finds the greatest base offset <= the target). Reads
return whole stored batches (the consumer skips records before its offset in
the first one, as Kafka's fetch does) and stop at the committed end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.messages import EntryKind
from raftlog.types import Index, Offset
from storage.catalog import OFFSET_VALUE
from storage.errors import CorruptionError, OffsetOutOfRangeError
from storage.segments import SegmentStore
from storage.state_db import OFFSET, int_key

# Batches one read passes without counting them (`left_out`) at most. Byte-bounded alone, a read
# of 64 MiB over a filtered mirror's 36-byte gap batches would walk 1.8 million frames on the
# event loop; this keeps a read's walk near what max_records allows (MAX_RECORDS_MAX one-record
# batches), and a reader continues from the answer's next offset.
LEFT_OUT_MAX = 10_000


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: Offset
    record_count: int
    index: Index
    payload: memoryview  # the record batch, as stored (validate_batch-clean)


@dataclass(frozen=True, slots=True)
class ReadResult:
    batches: list[StoredBatch]
    log_start_offset: Offset
    end_offset: Offset  # the committed end the read was bounded to


def lookup(store: SegmentStore, offset: Offset) -> tuple[Index, int]:
    """(raft index, position) of the DATA entry holding `offset` (within the log)."""
    segments = store.segments
    assert segments and store.log_start_offset <= offset < store.log_end_offset
    newest = segments[-1]
    if not newest.closed and newest.data_offsets and offset >= newest.data_offsets[0]:
        found = newest.open_lookup(offset)
        assert found is not None
        return found
    key = int_key(OFFSET, store.group, offset)
    hit = store.db.seek_for_prev(key, int_key(OFFSET, store.group, 0))
    if hit is None:
        raise CorruptionError(f"no offset index key at or below {offset}")
    index, _segment, position = OFFSET_VALUE.unpack(hit[1])
    return Index(index), position


def read_records(
    store: SegmentStore,
    offset: Offset,
    *,
    end_offset: Offset,
    max_records: int,
    max_bytes: int,
    left_out: Callable[[Offset, int, memoryview], bool] | None = None,
) -> ReadResult:
    """Batches holding records from `offset`, up to `max_records`/`max_bytes`
    (at least one batch), never past `end_offset` (the high watermark).

    `left_out(base offset, record count, payload)` names the batches the caller leaves out of
    its answer (a filtered mirror's gap batches, skipped duplicates): they are returned (the
    caller drops them) and count toward `max_bytes`, not toward `max_records`, which counts
    the records a reader gets. Counted, each gap used the budget of its offsets: a one-record
    read over gaps answered one gap batch, and a time lookup gave up after a few of them.
    At most LEFT_OUT_MAX of them a read. Without `left_out` (a mirror's read, which copies
    every batch) every offset counts."""
    assert max_records > 0 and max_bytes > 0
    assert end_offset <= store.log_end_offset, "the committed end lies inside the log"
    start = store.log_start_offset
    if offset < start or offset > end_offset:
        raise OffsetOutOfRangeError(offset, start, end_offset)
    if offset == end_offset:
        return ReadResult([], start, end_offset)
    index, _ = lookup(store, offset)
    batches: list[StoredBatch] = []
    records, total_bytes, passed = 0, 0, 0
    for info, payload in store.frames(index, Index(store.last_index() + 1)):
        if info.base_offset >= end_offset:
            break
        if info.kind is not EntryKind.DATA:
            continue
        total_bytes += len(payload)
        if batches and total_bytes > max_bytes:
            break
        batches.append(StoredBatch(info.base_offset, info.record_count, info.index, payload))
        if left_out is not None and left_out(info.base_offset, info.record_count, payload):
            passed += 1
            if passed >= LEFT_OUT_MAX:
                break
            continue
        records += info.next_offset - max(offset, info.base_offset)
        if records >= max_records:
            break
    return ReadResult(batches, start, end_offset)
