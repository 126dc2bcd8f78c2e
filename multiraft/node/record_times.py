"""Record times by offset, read from a replica: a group's lag in seconds, and a reset to a time.

There is no time index yet (DESIGN.md section 13 plans one), so:
- `first_at_or_after` reads the one record at an offset (a one-record read of the
  batch that holds it) and takes its timestamp: what describe and /metrics call
  the lag in seconds is now less the time of the oldest unconsumed record;
- `offset_for_time` finds the first offset whose record is at or after a time by
  binary search over [log start, high watermark): at most 64 one-record reads per
  partition. It assumes times rise with offsets, as they do when producers stamp
  records with their clock (a producer that sets older times by hand makes the
  answer one of the offsets where the time is crossed, not necessarily the first).

Batches refused or found duplicate on apply are skipped by reads, so the record
found may lie after the offset asked; callers get its offset with its time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.batch import decode_columns

if TYPE_CHECKING:
    from multiraft.node.partition_ops import PartitionOps

# Reads one binary search may make: ceil(log2(2**63)) + 1, whatever the log's size.
SEARCH_READS_MAX = 64
# Reads past batches a read leaves out (gap batches of a filtered mirror: 36 bytes each, so
# one read of GAP_READ_BYTES passes about 1,800), before a lookup says it found no record.
GAP_READS_MAX = 8
GAP_READ_BYTES = 64 * 1024


async def first_at_or_after(reads: PartitionOps, topic: str, partition: int,
                            offset: int) -> tuple[int, int] | None:
    """(offset, timestamp ms) of the first readable record at or after `offset` below the
    high watermark; None when there is none. Raises the read's ClientError."""
    position, max_bytes = offset, 1
    for _ in range(GAP_READS_MAX):
        result = await reads.consume(topic, partition, position, max_records=1, max_bytes=max_bytes)
        for base, count, batch in result.batches:
            if base + count <= position:
                continue
            index = max(0, position - base)
            decoded = decode_columns(batch, index, index + 1)
            if decoded.timestamp_deltas_ms:
                return base + index, decoded.header.first_timestamp_ms + decoded.timestamp_deltas_ms[0]
        if result.batches or result.next_offset <= position or result.next_offset >= result.high_watermark:
            return None
        # Only batches reads leave out (a filtered mirror's gaps, skipped duplicates): read on past them.
        position, max_bytes = result.next_offset, GAP_READ_BYTES
    return None


async def offset_for_time(reads: PartitionOps, topic: str, partition: int, start: int, end: int,
                          timestamp_ms: int) -> int:
    """The first offset in [start, end] whose record is at or after `timestamp_ms` (`end`
    when every record is older): Kafka's ListOffsets by time, by binary search."""
    low, high = start, end
    for _ in range(SEARCH_READS_MAX):
        if low >= high:
            return low
        middle = (low + high) // 2
        found = await first_at_or_after(reads, topic, partition, middle)
        if found is None or found[1] >= timestamp_ms:
            high = middle  # the answer is at or before the record found (those between are skipped)
        else:
            low = found[0] + 1
    return low
