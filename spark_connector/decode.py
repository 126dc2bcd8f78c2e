"""Stored record batches to Arrow record batches, with no per-record Python work.

A fetch answer holds whole stored batches (`storage/batch.py`: a header, then
columns of timestamp deltas, key lengths and value lengths, then the keys, the
values and optional headers back to back). That layout is already columnar, so
a batch becomes Arrow columns with numpy over its length columns: the key and
value bytes are sliced out as one region per batch and joined once per fetch,
and the offsets buffer is a cumulative sum. Only record headers (rare, and only
with `includeHeaders`) are decoded record by record.

The result has exactly `ARROW_SCHEMA` (or `ARROW_SCHEMA_WITH_HEADERS`): Spark
compares the first batch's schema with the declared one and refuses any other
type (`binary`, not `large_binary`; `timestamp[us, tz=UTC]`; nullable fields).
The record timestamp is the producer's (Kafka's CreateTime, `timestampType` 0).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import msgpack
import numpy as np
import pyarrow as pa

from storage.batch import (
    FLAG_COMPRESSION_MASK,
    FLAG_HEADERS,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    Compression,
)

TIMESTAMP_TYPE_CREATE_TIME = 0
HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
])
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))
_UNCOMPRESSED_BYTES_MAX = 64 * 1024 * 1024  # a stored batch is at most 16 MiB; inflate no further


class CorruptBatchError(Exception):
    """A fetched batch fails its checks (magic, length, CRC): bytes were damaged in transit."""


@dataclass
class _Columns:
    """The parts of one fetch's records, gathered batch by batch, joined once."""

    key_lengths: list[np.ndarray] = field(default_factory=list)
    value_lengths: list[np.ndarray] = field(default_factory=list)
    key_bytes: list[memoryview] = field(default_factory=list)
    value_bytes: list[memoryview] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)
    timestamps_us: list[np.ndarray] = field(default_factory=list)
    headers: list[list | None] = field(default_factory=list)  # per batch: records' pairs, or None
    any_headers: bool = False
    rows: int = 0


def _section(batch: memoryview) -> tuple[int, int, int, memoryview]:
    """Check a batch; returns (flags, record count, first timestamp ms, records section)."""
    if len(batch) < HEADER_BYTES:
        raise CorruptBatchError(f"a batch of {len(batch)} bytes is shorter than its header")
    magic, crc, flags, count, records_bytes, first_ms, *_ = HEADER.unpack_from(batch)
    if magic != MAGIC or HEADER_BYTES + records_bytes != len(batch) or count < 1:
        raise CorruptBatchError("a batch has a bad magic byte or length")
    if zlib.crc32(batch[5:]) != crc:
        raise CorruptBatchError("a batch fails its CRC")
    section = batch[HEADER_BYTES:]
    if flags & FLAG_COMPRESSION_MASK == Compression.ZLIB:
        inflater = zlib.decompressobj()
        section = memoryview(inflater.decompress(section, _UNCOMPRESSED_BYTES_MAX))
        if not inflater.eof:
            raise CorruptBatchError("a compressed batch does not inflate")
    elif flags & FLAG_COMPRESSION_MASK != Compression.NONE:
        raise CorruptBatchError(f"a batch has unknown flags {flags:#x}")
    return flags, count, first_ms, section


def _add_batch(columns: _Columns, base: int, batch: memoryview, start: int, end: int,
               include_headers: bool) -> None:
    """Records [start, end) of one stored batch (base offset `base`) into `columns`."""
    flags, count, first_ms, section = _section(batch)
    low, high = max(start - base, 0), min(end - base, count)
    if low >= high:
        return
    has_headers = bool(flags & FLAG_HEADERS)
    deltas = np.frombuffer(section, dtype=">u4", count=count, offset=0)
    key_lengths = np.frombuffer(section, dtype=">i4", count=count, offset=4 * count).astype(np.int32)
    value_lengths = np.frombuffer(section, dtype=">i4", count=count, offset=8 * count).astype(np.int32)
    key_ends = np.cumsum(np.maximum(key_lengths, 0), dtype=np.int64)
    value_ends = np.cumsum(np.maximum(value_lengths, 0), dtype=np.int64)
    keys_at = 4 * count * (4 if has_headers else 3)
    values_at = keys_at + int(key_ends[-1])
    if values_at + int(value_ends[-1]) > len(section):
        raise CorruptBatchError("a batch's lengths overrun its records section")
    key_from = keys_at + (int(key_ends[low - 1]) if low else 0)
    value_from = values_at + (int(value_ends[low - 1]) if low else 0)
    columns.key_bytes.append(section[key_from : keys_at + int(key_ends[high - 1])])
    columns.value_bytes.append(section[value_from : values_at + int(value_ends[high - 1])])
    columns.key_lengths.append(key_lengths[low:high])
    columns.value_lengths.append(value_lengths[low:high])
    columns.offsets.append(np.arange(base + low, base + high, dtype=np.int64))
    columns.timestamps_us.append((deltas[low:high].astype(np.int64) + first_ms) * 1000)
    headers = None
    if include_headers and has_headers:
        headers_at = values_at + int(value_ends[-1])
        header_lengths = np.frombuffer(section, dtype=">u4", count=count, offset=12 * count).astype(np.int64)
        header_ends = np.concatenate(([0], np.cumsum(header_lengths))) + headers_at
        headers = [_pairs(section[header_ends[i] : header_ends[i + 1]]) for i in range(low, high)]
        columns.any_headers = True
    columns.headers.append(headers)
    columns.rows += high - low


def _pairs(blob: memoryview) -> list[dict[str, object]] | None:
    if not blob:
        return None  # Spark's Kafka source gives null, not [], for a record without headers
    return [{"key": name, "value": value} for name, value in msgpack.unpackb(blob, raw=False)]


def _binary(lengths: list[np.ndarray], parts: list[memoryview], rows: int) -> pa.Array:
    joined = np.concatenate(lengths)
    ends = np.cumsum(np.maximum(joined, 0), dtype=np.int64)
    if rows and ends[-1] >= 2**31:
        raise CorruptBatchError("a fetch holds over 2 GiB of keys or values (lower fetchMaxBytes)")
    offsets = np.zeros(rows + 1, dtype=np.int32)
    offsets[1:] = ends
    nulls = joined < 0
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    data = pa.py_buffer(b"".join(parts))
    return pa.Array.from_buffers(pa.binary(), rows, [validity, pa.py_buffer(offsets), data],
                                 null_count=int(nulls.sum()))


def _constant_string(value: str, rows: int) -> pa.Array:
    encoded = value.encode()
    offsets = np.arange(rows + 1, dtype=np.int32) * len(encoded)
    return pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * rows)])


def to_record_batch(topic: str, partition: int, frames: list[tuple[int, bytes | memoryview]], start: int,
                    end: int, include_headers: bool = False) -> pa.RecordBatch | None:
    """The records of `frames` (base offset, stored batch) within [start, end), or None if none."""
    columns = _Columns()
    for base, batch in frames:
        _add_batch(columns, base, memoryview(batch), start, end, include_headers)
    rows = columns.rows
    if not rows:
        return None
    arrays = [
        _binary(columns.key_lengths, columns.key_bytes, rows),
        _binary(columns.value_lengths, columns.value_bytes, rows),
        _constant_string(topic, rows),
        pa.array(np.full(rows, partition, dtype=np.int32)),
        pa.array(np.concatenate(columns.offsets)),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows,
                              [None, pa.py_buffer(np.concatenate(columns.timestamps_us))]),
        pa.array(np.full(rows, TIMESTAMP_TYPE_CREATE_TIME, dtype=np.int32)),
    ]
    if not include_headers:
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
    arrays.append(_headers(columns, rows))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA_WITH_HEADERS)


def _headers(columns: _Columns, rows: int) -> pa.Array:
    if not columns.any_headers:
        return pa.nulls(rows, type=HEADERS_TYPE)
    values: list[list | None] = []
    for per_batch, lengths in zip(columns.headers, columns.key_lengths, strict=True):
        values.extend(per_batch if per_batch is not None else [None] * len(lengths))
    return pa.array(values, type=HEADERS_TYPE)


def record_timestamps(batch: bytes | memoryview) -> tuple[int, np.ndarray]:
    """(record count, timestamps in ms) of one stored batch: for offset-by-timestamp lookups."""
    _flags, count, first_ms, section = _section(memoryview(batch))
    deltas = np.frombuffer(section, dtype=">u4", count=count, offset=0)
    return count, deltas.astype(np.int64) + first_ms
