"""The record batch: the one format of the HTTP API, the wire and the disk.

Layout (big-endian; see docs/format.md for the table and the measurements):

    header (36 bytes): magic u8, crc32 u32 (over bytes [5, end)), flags u8,
        record_count u32, records_bytes u32, first_timestamp_ms i64,
        producer_id i64, producer_epoch i16, base_sequence i32
    records section (records_bytes, zlib-compressed when flags say so):
        timestamp_delta_ms u32 x n, key_length i32 x n, value_length i32 x n,
        [headers_length u32 x n when FLAG_HEADERS], keys, values, [headers]
    a gap batch (FLAG_GAP, a filtered mirror's): record_count offsets holding no
        records, records_bytes 0, no records section; decoders yield no records

Why columns instead of one length-prefixed record after another: every length
sits in a contiguous array, so validating the declared lengths is `array`
construction plus `min`/`sum`/`count` over it, all C loops. The produce path
does O(1) Python work per batch, never per record. Length -1 means null.
Offsets are not stored: record i has offset `base_offset + i`, where the base
offset lives in the entry frame the batch is stored in.
"""

from __future__ import annotations

import enum
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

import msgpack

from storage.errors import InvalidBatchError

MAGIC = 0xB1
HEADER = struct.Struct(">BIBIIqqhi")
HEADER_BYTES = HEADER.size  # 36
CRC_START = 5  # the CRC covers everything after itself
FLAG_COMPRESSION_MASK = 0x03
FLAG_HEADERS = 0x04
# A gap batch: `record_count` offsets that hold no records (a filtered mirror left the
# source's records there out, docs/mirror.md "Record filters"). No other flag, no records
# section, no producer (-1). Stored, replicated, hashed and served by the raw log read as
# any batch; every read that returns records leaves it out (an offset gap, as in a Kafka
# compacted topic). Never a produce: `validate_batch` refuses it.
FLAG_GAP = 0x08
_FLAGS_KNOWN = FLAG_COMPRESSION_MASK | FLAG_HEADERS | FLAG_GAP
_NULL = -1
_BIG_ENDIAN_HOST = sys.byteorder == "big"

# Kafka's default message.max.bytes is ~1 MiB; we allow more for large values but bound it.
BATCH_BYTES_MAX = 16 * 1024 * 1024
# What one batch may declare, so that a few bytes on the wire cannot become work a
# reader pays on every read (16 KB of zlib once declared 980,000 records, and every
# read of one of them decoded them all). Kafka bounds a batch by bytes only, but its
# records cost at least seven bytes each on the wire; here a compressed record can
# cost nothing, hence a count per wire byte and an inflation ratio too.
RECORD_COUNT_MAX = 100_000
RECORDS_PER_WIRE_BYTE_MAX = 1
INFLATE_RATIO_MAX = 256
INFLATE_FLOOR_BYTES = 1024 * 1024  # below this a ratio means nothing (tiny batches compress well)
# One record (key + value + headers), wherever it comes from: Kafka's message.max.bytes.
RECORD_BYTES_MAX = 1024 * 1024
# What a batch already stored may hold: the bounds before the ones above existed. A
# follower catching up, or a segment transfer, checks a stored batch's integrity
# against these (`check_stored_batch`), so a log written by an older version still
# replicates; the tighter bounds apply where new batches enter (`validate_batch`).
STORED_RECORD_COUNT_MAX = 1_000_000


class Compression(enum.IntEnum):
    NONE = 0
    ZLIB = 1


class Record(NamedTuple):
    """One record. A NamedTuple, not a dataclass: decoding builds one per record and
    a tuple is ~4x cheaper to construct than a frozen dataclass (docs/format.md)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_delta_ms: int = 0


@dataclass(frozen=True, slots=True)
class BatchHeader:
    flags: int
    record_count: int
    records_bytes: int
    first_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def compression(self) -> Compression:
        return Compression(self.flags & FLAG_COMPRESSION_MASK)


def _column(values: list[int], typecode: str) -> bytes:
    column = array(typecode, values)
    if not _BIG_ENDIAN_HOST:
        column.byteswap()
    return column.tobytes()


def _read_column(section: memoryview, start: int, count: int, typecode: str) -> array:
    column = array(typecode)
    column.frombytes(section[start : start + 4 * count])
    if not _BIG_ENDIAN_HOST:
        column.byteswap()
    return column


def encode_batch(
    records: list[Record] | tuple[Record, ...],
    *,
    first_timestamp_ms: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: Compression = Compression.NONE,
) -> bytes:
    """Encode records into one batch (the client or the HTTP layer does this)."""
    assert records, "a batch holds at least one record"
    keys = [r.key for r in records]
    values = [r.value for r in records]
    has_headers = any(r.headers for r in records)
    columns = [
        _column([r.timestamp_delta_ms for r in records], "I"),
        _column([_NULL if k is None else len(k) for k in keys], "i"),
        _column([_NULL if v is None else len(v) for v in values], "i"),
    ]
    blobs = [b"".join(k for k in keys if k), b"".join(v for v in values if v)]
    if has_headers:
        encoded = [_encode_headers(r.headers) for r in records]
        columns.append(_column([len(h) for h in encoded], "I"))
        blobs.append(b"".join(encoded))
    section = b"".join(columns + blobs)
    if compression is Compression.ZLIB:
        section = zlib.compress(section, 1)
    flags = int(compression) | (FLAG_HEADERS if has_headers else 0)
    head = HEADER.pack(
        MAGIC, 0, flags, len(records), len(section),
        first_timestamp_ms, producer_id, producer_epoch, base_sequence,
    )  # fmt: skip
    body = head[CRC_START:] + section
    crc = zlib.crc32(body)
    return head[:1] + struct.pack(">I", crc) + body


def encode_gap_batch(record_count: int, *, first_timestamp_ms: int) -> bytes:
    """A gap batch of `record_count` offsets (36 bytes whatever the count): the source
    batch's `first_timestamp_ms` kept, so retention and time lookups see its time."""
    assert 1 <= record_count <= STORED_RECORD_COUNT_MAX
    head = HEADER.pack(MAGIC, 0, FLAG_GAP, record_count, 0, first_timestamp_ms, -1, -1, -1)
    body = head[CRC_START:]
    return head[:1] + struct.pack(">I", zlib.crc32(body)) + body


def is_gap(data: bytes | memoryview) -> bool:
    """Whether a stored (already checked) batch is a gap batch: its flags byte, nothing decoded."""
    return len(data) > CRC_START and bool(data[CRC_START] & FLAG_GAP)


def _encode_headers(headers: tuple[tuple[str, bytes], ...]) -> bytes:
    if not headers:
        return b""
    return msgpack.packb([[k, v] for k, v in headers], use_bin_type=True)


def read_header(data: bytes | memoryview) -> BatchHeader:
    """Parse the header only (no CRC check): for callers that already validated."""
    if len(data) < HEADER_BYTES:
        raise InvalidBatchError(f"batch of {len(data)} bytes is shorter than its header")
    magic, _crc, *fields = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise InvalidBatchError(f"unknown batch magic {magic:#x}")
    return BatchHeader(*fields)


def validate_batch(
    data: bytes | memoryview,
    *,
    batch_bytes_max: int = BATCH_BYTES_MAX,
    record_count_max: int = RECORD_COUNT_MAX,
    record_bytes_max: int = RECORD_BYTES_MAX,
) -> BatchHeader:
    """Check a batch before storing it: header, CRC, every declared length, what it
    may declare relative to its size, and the size of each record.

    O(1) Python work for a batch without headers; the loops run in C.
    """
    header = _checked_header(data, batch_bytes_max, record_count_max)
    if header.flags & FLAG_GAP:
        raise InvalidBatchError("a gap batch is written only by a filtered mirror, never produced")
    if header.record_count > RECORDS_PER_WIRE_BYTE_MAX * len(data):
        raise InvalidBatchError(f"{header.record_count} records declared in {len(data)} bytes")
    section = _records_section(data, header, min(batch_bytes_max, inflated_bytes_max(len(data))))
    _validate_lengths(section, header, record_bytes_max)
    return header


def check_stored_batch(data: bytes | memoryview) -> BatchHeader:
    """Check a batch a leader sends or a transfer carries: header, CRC, every length,
    within the bounds any stored batch meets (not the produce bounds: see above)."""
    header = _checked_header(data, BATCH_BYTES_MAX, STORED_RECORD_COUNT_MAX)
    if header.flags & FLAG_GAP:
        return header  # no records section (`_checked_header` held it to its shape)
    _validate_lengths(_records_section(data, header, BATCH_BYTES_MAX), header, BATCH_BYTES_MAX)
    return header


def _checked_header(data: bytes | memoryview, batch_bytes_max: int, record_count_max: int) -> BatchHeader:
    """Size, header fields, declared length and CRC: what every check of a batch starts with."""
    if len(data) > batch_bytes_max:
        raise InvalidBatchError(f"batch of {len(data)} bytes exceeds {batch_bytes_max}")
    header = read_header(data)
    if header.flags & ~_FLAGS_KNOWN or header.flags & FLAG_COMPRESSION_MASK > Compression.ZLIB:
        raise InvalidBatchError(f"unknown batch flags {header.flags:#x}")
    if header.flags & FLAG_GAP and (header.flags != FLAG_GAP or header.records_bytes
                                    or (header.producer_id, header.producer_epoch, header.base_sequence) != (-1, -1, -1)):
        raise InvalidBatchError("a gap batch has no other flag, no records section and no producer")
    if HEADER_BYTES + header.records_bytes != len(data):
        raise InvalidBatchError("declared records length does not match the batch length")
    if not 1 <= header.record_count <= record_count_max:
        raise InvalidBatchError(f"record count {header.record_count} is out of range 1..{record_count_max}")
    (crc,) = struct.unpack_from(">I", data, 1)
    if zlib.crc32(memoryview(data)[CRC_START:]) != crc:
        raise InvalidBatchError("batch CRC mismatch")
    return header


def inflated_bytes_max(wire_bytes: int) -> int:
    """How large a compressed batch of `wire_bytes` may inflate (BATCH_BYTES_MAX at most)."""
    return min(BATCH_BYTES_MAX, max(INFLATE_FLOOR_BYTES, INFLATE_RATIO_MAX * wire_bytes))


def _records_section(
    data: bytes | memoryview, header: BatchHeader, uncompressed_bytes_max: int
) -> memoryview:
    stored = memoryview(data)[HEADER_BYTES:]
    if header.compression is Compression.NONE:
        return stored
    # Bounded inflate: a small batch must not expand into gigabytes (zip bomb).
    inflater = zlib.decompressobj()
    try:
        section = inflater.decompress(stored, uncompressed_bytes_max)
    except zlib.error as error:
        raise InvalidBatchError(f"batch does not decompress: {error}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise InvalidBatchError("compressed batch is truncated or inflates beyond the limit")
    return memoryview(section)


def _column_count(header: BatchHeader) -> int:
    return 4 if header.flags & FLAG_HEADERS else 3


def _data_bytes(lengths: array) -> int:
    """The bytes fields of these lengths take (a null, -1, takes none): C loops only."""
    return sum(lengths) + lengths.count(_NULL)


def _validate_lengths(section: memoryview, header: BatchHeader, record_bytes_max: int) -> None:
    count = header.record_count
    columns_bytes = 4 * count * _column_count(header)
    if columns_bytes > len(section):
        raise InvalidBatchError("record count does not fit the records section")
    keys = _read_column(section, 4 * count, count, "i")
    values = _read_column(section, 8 * count, count, "i")
    if min(keys) < _NULL or min(values) < _NULL:
        raise InvalidBatchError("negative key or value length")
    data_bytes = _data_bytes(keys) + _data_bytes(values)
    headers = _read_column(section, 12 * count, count, "I") if header.flags & FLAG_HEADERS else None
    headers_bytes = sum(headers) if headers is not None else 0
    if columns_bytes + data_bytes + headers_bytes != len(section):
        raise InvalidBatchError("declared record lengths do not match the records section")
    _check_record_sizes(keys, values, headers, record_bytes_max)
    if headers_bytes:
        _validate_headers(section, header)


def _check_record_sizes(keys: array, values: array, headers: array | None, record_bytes_max: int) -> None:
    """No record above `record_bytes_max`: the sum of the largest of each column bounds
    every record, so the per-record loop runs only for a batch holding large fields."""
    headers_max = max(headers) if headers is not None else 0
    if max(keys) + max(values) + headers_max <= record_bytes_max:
        return
    sizes = (max(k, 0) + max(v, 0) for k, v in zip(keys, values, strict=True))
    if headers is not None:
        sizes = (size + h for size, h in zip(sizes, headers, strict=True))
    for i, size in enumerate(sizes):
        if size > record_bytes_max:
            raise InvalidBatchError(f"record {i} is {size} bytes, more than {record_bytes_max}")


def _decode_headers(blob: memoryview) -> tuple[tuple[str, bytes], ...]:
    try:
        pairs = msgpack.unpackb(blob, use_list=True, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as error:  # TypeError: an unhashable map key
        raise InvalidBatchError(f"record headers do not decode: {error}") from None
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise InvalidBatchError("record headers are not a list of pairs")
    return tuple((p[0], p[1]) for p in pairs)


def _fields(section: memoryview, lengths: array, column_at: int, start: int, stop: int) -> list[bytes | None]:
    """Fields start..stop of one column whose data begins at `column_at` (None for nulls).

    The fields before `start` are skipped by summing their lengths (C loops); one
    comprehension over precomputed ends then slices the wanted ones out of one copy
    of their bytes: the only per-record Python work of a decode.
    """
    wanted = lengths[start:stop]
    first = column_at + _data_bytes(lengths[:start])
    raw = section[first : first + _data_bytes(wanted)].tobytes()
    ends = list(accumulate((n if n > 0 else 0 for n in wanted), initial=0))
    return [raw[a:b] if n >= 0 else None for a, b, n in zip(ends, ends[1:], wanted, strict=False)]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """Records `first` .. `first + len(keys)` of a batch as columns: the fast shape
    for building JSON responses."""

    header: BatchHeader
    first: int
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[tuple[str, bytes], ...]]
    timestamp_deltas_ms: list[int]


def decode_columns(data: bytes | memoryview, start: int = 0, stop: int | None = None) -> DecodedBatch:
    """Decode records [start, stop) of a stored (already validated) batch into columns.

    Only those records are sliced out and built as Python objects: a read of one
    record of a large batch pays C loops over the length columns, not a Python
    object per record of the batch.
    """
    header = read_header(data)
    if header.flags & FLAG_GAP:  # offsets without records
        return DecodedBatch(header, 0, [], [], [], [])
    section = _records_section(data, header, BATCH_BYTES_MAX)  # stored: it may predate the ratio
    return _decode_section(section, header, start, stop)


def _decode_section(section: memoryview, header: BatchHeader, start: int = 0,
                    stop: int | None = None) -> DecodedBatch:
    count = header.record_count
    stop = count if stop is None else max(0, min(stop, count))
    start = max(0, min(start, stop))
    deltas = _read_column(section, 4 * start, stop - start, "I").tolist()
    key_lengths = _read_column(section, 4 * count, count, "i")
    value_lengths = _read_column(section, 8 * count, count, "i")
    keys_at = 4 * count * _column_count(header)
    values_at = keys_at + _data_bytes(key_lengths)
    keys = _fields(section, key_lengths, keys_at, start, stop)
    values = _fields(section, value_lengths, values_at, start, stop)
    headers: list[tuple[tuple[str, bytes], ...]] = [()] * (stop - start)
    if header.flags & FLAG_HEADERS:
        header_lengths = _read_column(section, 12 * count, count, "I")
        blobs = _fields(section, header_lengths, values_at + _data_bytes(value_lengths), start, stop)
        headers = [_decode_headers(blob) if blob else () for blob in blobs]
    return DecodedBatch(header, start, keys, values, headers, deltas)


def _validate_headers(section: memoryview, header: BatchHeader) -> None:
    """Headers are rare; this loop runs only for batches that carry them."""
    for headers in _decode_section(section, header).headers:
        for name, value in headers:
            if not isinstance(name, str) or not isinstance(value, bytes):
                raise InvalidBatchError("a header is not a (str, bytes) pair")


def decode_batch(data: bytes | memoryview) -> tuple[BatchHeader, list[Record]]:
    """Decode a stored (already validated) batch into records, for JSON responses."""
    decoded = decode_columns(data)
    records = list(
        map(Record, decoded.keys, decoded.values, decoded.headers, decoded.timestamp_deltas_ms)
    )
    return decoded.header, records
