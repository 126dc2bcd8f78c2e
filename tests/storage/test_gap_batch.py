"""Gap batches (FLAG_GAP, docs/format.md): offsets that hold no records, a filtered mirror's.

Goal: a gap batch encodes to 36 bytes whatever its count, passes the stored check, decodes
to no records, is refused where new batches enter (the produce check), and any other shape
with the flag (a records section, another flag, a producer) is refused.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from storage.batch import (
    FLAG_GAP,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    Record,
    check_stored_batch,
    decode_batch,
    decode_columns,
    encode_batch,
    encode_gap_batch,
    is_gap,
    read_header,
    validate_batch,
)
from storage.errors import InvalidBatchError


def _batch(flags: int, count: int, section: bytes = b"", producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    head = HEADER.pack(MAGIC, 0, flags, count, len(section), 7, *producer)
    body = head[5:] + section
    return head[:1] + struct.pack(">I", zlib.crc32(body)) + body


@pytest.mark.parametrize("count", [1, 2, 100_000, 1_000_000])
def test_gap_batch_round_trip(count: int) -> None:
    data = encode_gap_batch(count, first_timestamp_ms=1_700_000_000_000)
    assert len(data) == HEADER_BYTES
    header = check_stored_batch(data)
    assert (header.flags, header.record_count, header.records_bytes) == (FLAG_GAP, count, 0)
    assert header.first_timestamp_ms == 1_700_000_000_000
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert read_header(data) == header
    assert is_gap(data)
    assert decode_batch(data) == (header, [])
    decoded = decode_columns(data, 0, count)
    assert (decoded.keys, decoded.values, decoded.headers, decoded.timestamp_deltas_ms) == ([], [], [], [])


def test_gap_batch_is_deterministic() -> None:
    assert encode_gap_batch(5, first_timestamp_ms=-3) == encode_gap_batch(5, first_timestamp_ms=-3)
    assert _batch(FLAG_GAP, 5) == encode_gap_batch(5, first_timestamp_ms=7)


def test_a_normal_batch_is_no_gap() -> None:
    data = encode_batch([Record(b"k", b"v")], first_timestamp_ms=1)
    assert not is_gap(data)


def test_produce_check_refuses_a_gap_batch() -> None:
    with pytest.raises(InvalidBatchError, match="gap batch"):
        validate_batch(encode_gap_batch(1, first_timestamp_ms=0))


@pytest.mark.parametrize("data", [
    _batch(FLAG_GAP | 0x01, 1),  # compressed
    _batch(FLAG_GAP | 0x04, 1),  # headers
    _batch(FLAG_GAP, 1, b"\x00" * 12),  # a records section
    _batch(FLAG_GAP, 1, producer=(5, 0, 0)),  # a producer
    _batch(FLAG_GAP, 1, producer=(-1, -1, 0)),
    _batch(FLAG_GAP, 0),  # no offsets
])
def test_malformed_gap_batches_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidBatchError):
        check_stored_batch(data)
    with pytest.raises(InvalidBatchError):
        validate_batch(data)


def test_a_gap_batch_with_a_bad_crc_is_refused() -> None:
    data = bytearray(encode_gap_batch(3, first_timestamp_ms=0))
    data[20] ^= 1
    with pytest.raises(InvalidBatchError, match="CRC"):
        check_stored_batch(bytes(data))
