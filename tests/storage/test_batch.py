"""Record batch codec: round trips (hypothesis) and rejection of bad input."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch import (
    HEADER_BYTES,
    Compression,
    Record,
    decode_batch,
    encode_batch,
    validate_batch,
)
from storage.errors import InvalidBatchError

_records = st.lists(
    st.builds(
        Record,
        key=st.none() | st.binary(max_size=20),
        value=st.none() | st.binary(max_size=200),
        headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(
            tuple
        ),
        timestamp_delta_ms=st.integers(0, 2**32 - 1),
    ),
    min_size=1,
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(
    records=_records,
    compression=st.sampled_from(list(Compression)),
    producer=st.tuples(
        st.integers(-1, 2**62), st.integers(-1, 2**15 - 1), st.integers(-1, 2**31 - 1)
    ),
)
def test_round_trip(records, compression, producer):
    # Goal: whatever is encoded validates and decodes to the same records and header.
    producer_id, epoch, sequence = producer
    data = encode_batch(
        records, first_timestamp_ms=123, producer_id=producer_id, producer_epoch=epoch,
        base_sequence=sequence, compression=compression,
    )  # fmt: skip
    header = validate_batch(data)
    assert header.record_count == len(records)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    decoded_header, decoded = decode_batch(data)
    assert decoded_header == header
    assert decoded == records


@settings(max_examples=200, deadline=None)
@given(records=_records, position=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_bit_flip_is_rejected(records, position, bit):
    # Goal: one flipped bit anywhere is caught before the batch is stored.
    data = bytearray(encode_batch(records, first_timestamp_ms=1))
    position %= len(data)
    data[position] ^= 1 << bit
    with pytest.raises(InvalidBatchError):
        validate_batch(bytes(data))


def _resealed(data: bytearray) -> bytes:
    """Recompute the CRC, so only the lie under test is wrong."""
    struct.pack_into(">I", data, 1, zlib.crc32(bytes(data[5:])))
    return bytes(data)


def test_lying_lengths_are_rejected():
    # Goal: lengths that do not add up are rejected even with a correct CRC.
    good = bytearray(encode_batch([Record(b"k", b"value")] * 3, first_timestamp_ms=1))
    lying_key = bytearray(good)
    struct.pack_into(">i", lying_key, HEADER_BYTES + 12, 2)  # key 0 claims 2 bytes
    with pytest.raises(InvalidBatchError, match="lengths"):
        validate_batch(_resealed(lying_key))
    negative = bytearray(good)
    struct.pack_into(">i", negative, HEADER_BYTES + 12, -5)
    with pytest.raises(InvalidBatchError, match="negative"):
        validate_batch(_resealed(negative))
    too_many = bytearray(good)
    struct.pack_into(">I", too_many, 6, 1000)
    with pytest.raises(InvalidBatchError):
        validate_batch(_resealed(too_many))
    with pytest.raises(InvalidBatchError):
        validate_batch(bytes(good[:-1]))
    with pytest.raises(InvalidBatchError):
        validate_batch(b"\xb1" + b"\x00" * 10)


def test_compression_bomb_is_bounded():
    # Goal: a small compressed batch cannot inflate past the batch limit.
    records = [Record(None, b"\x00" * 100_000)] * 20
    data = encode_batch(records, first_timestamp_ms=1, compression=Compression.ZLIB)
    assert len(data) < 100_000
    with pytest.raises(InvalidBatchError):
        validate_batch(data, batch_bytes_max=1_000_000)
    validate_batch(data, batch_bytes_max=4_000_000)
