"""A filtered mirror's chunk (docs/mirror.md "Record filters"): the source's batches, the
records the link's filter leaves out turned into gap batches, so every offset stays the source's.

Pure and deterministic: the same batches, position, skipped ranges and filter give the same
bytes (a filtered mirror's verify recomputes them from the source: mirror_verify.py). Each
source batch (base b, n records) becomes batches covering exactly [b, b + n):
- wholly matching: the source's batch itself, byte for byte (no re-encode);
- matching nothing, skipped by the source (a read leaves it out there), or already a gap
  batch (the source is a filtered mirror): one gap batch (a gap batch is kept as it is);
- else each maximal run of matching records re-encoded as one batch (the source's
  compression, the source batch's first timestamp and each record's delta, the producer id
  and epoch kept and the base sequence advanced by the run's position when the source had
  one), each maximal run of the others as one gap batch (the source batch's first timestamp).
Record counts are kept, so the compare-and-append (mirror_append.py) and the window
(mirror_window.py) count offsets as for an unfiltered chunk.

Size. A run re-encoded from a plain batch holds a subset of its columns and fields plus a
36-byte header, and a gap batch is 36 bytes where its records took at least 12 (three
4-byte lengths each): so a plain batch of S bytes becomes less than 4 S (S + 36 per run, at
most one run per record). A compressed run is zlib's output for its records, at most
zlib's bound over their inflated bytes, which can be tens of times the compressed batch
read: the pull splits a filtered chunk into proposals of bounded entries and bytes
(mirror_runs.py). `READ_SHARE` is how much smaller the pull reads a filtered link's chunks.
"""

from __future__ import annotations

import itertools

from multiraft.metadata.record_filter import RecordMatcher
from storage.batch import (
    BATCH_BYTES_MAX,
    FLAG_COMPRESSION_MASK,
    FLAG_GAP,
    Compression,
    DecodedBatch,
    Record,
    check_stored_batch,
    decode_columns,
    encode_batch,
    encode_gap_batch,
)
from storage.errors import InvalidBatchError

READ_SHARE = 4  # a filtered chunk of plain batches is below 4x the bytes read (above)
_SEQUENCE_MODULUS = 2**31  # base sequences are i32 >= 0 and wrap, as Kafka's do


def filter_chunk(matcher: RecordMatcher, batches: list[bytes], position: int,
                 skipped: tuple[tuple[int, int], ...] = ()) -> list[bytes]:
    """The contiguous source `batches` from offset `position` (each checked as any stored
    batch; InvalidBatchError if one is not), filtered. `skipped`: the source's skipped
    batches as (base, count); they become gaps, so the caller names no skips to the sink."""
    skips = set(skipped)
    out: list[bytes] = []
    base = position
    for data in batches:
        header = check_stored_batch(data)
        count = header.record_count
        if header.flags & FLAG_GAP:
            out.append(data)
        elif (base, count) in skips:
            out.append(encode_gap_batch(count, first_timestamp_ms=header.first_timestamp_ms))
        else:
            out.extend(filter_batch(matcher, data))
        base += count
    return out


def filter_batch(matcher: RecordMatcher, data: bytes) -> list[bytes]:
    """One checked, non-gap source batch as the batches covering its offsets (above)."""
    decoded = decode_columns(data)
    header = decoded.header
    count = header.record_count
    copied = [matcher.matches(k, h) for k, h in zip(decoded.keys, decoded.headers, strict=True)]
    assert len(copied) == count
    if all(copied):
        return [data]
    if not any(copied):
        return [encode_gap_batch(count, first_timestamp_ms=header.first_timestamp_ms)]
    out: list[bytes] = []
    start = 0
    for matching, run in itertools.groupby(copied):
        stop = start + len(list(run))
        if not matching:
            out.append(encode_gap_batch(stop - start, first_timestamp_ms=header.first_timestamp_ms))
        else:
            out.append(_run_batch(decoded, start, stop))
        start = stop
    assert start == count
    return out


def _run_batch(decoded: DecodedBatch, start: int, stop: int) -> bytes:
    """Records [start, stop) of a decoded batch as one batch, each at its source timestamp: the
    source batch's first timestamp and each record's own delta, as the source held them (so
    they always fit: a first timestamp moved by a delta could pass i64 and not encode)."""
    header = decoded.header
    records = [Record(decoded.keys[i], decoded.values[i], decoded.headers[i], decoded.timestamp_deltas_ms[i])
               for i in range(start, stop)]
    sequence = header.base_sequence
    if sequence >= 0:
        sequence = (sequence + start) % _SEQUENCE_MODULUS
    data = encode_batch(records, first_timestamp_ms=header.first_timestamp_ms, producer_id=header.producer_id,
                        producer_epoch=header.producer_epoch, base_sequence=sequence,
                        compression=Compression(header.flags & FLAG_COMPRESSION_MASK))
    if len(data) > BATCH_BYTES_MAX:  # a compressed run that zlib could not make small enough
        raise InvalidBatchError(f"a filtered run of {stop - start} records re-encodes to {len(data)} bytes, "
                                f"more than a batch may hold ({BATCH_BYTES_MAX})")
    return data
