"""Record batch codec: round trips (hypothesis) and rejection of bad input."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch import (
    FLAG_COMPRESSION_MASK,
    HEADER_BYTES,
    INFLATE_FLOOR_BYTES,
    RECORD_BYTES_MAX,
    RECORD_COUNT_MAX,
    Compression,
    Record,
    check_stored_batch,
    decode_batch,
    decode_columns,
    encode_batch,
    inflated_bytes_max,
    validate_batch,
)
from storage.errors import InvalidBatchError
from tests.fuzzing import cost, fuzz_examples
from tests.storage.helpers import max_compressed

_FLAGS_AT = 5  # magic u8, crc32 u32, then flags (storage/batch.py's header layout)
# Memory a check or a decode may allocate per input byte, and in all: the records section
# is copied at most twice (a slice, an inflate), a record costs a handful of small objects.
BYTES_PER_INPUT_BYTE = 8
BYTES_FIXED = 64 * 1024

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
    # Goal: a small compressed batch cannot inflate past the batch limit, nor past its
    # ratio to the bytes it came in.
    records = [Record(None, b"\x00" * 100_000)] * 20
    data = encode_batch(records, first_timestamp_ms=1, compression=Compression.ZLIB)
    assert len(data) < 100_000
    with pytest.raises(InvalidBatchError):
        validate_batch(data, batch_bytes_max=1_000_000)
    bomb = max_compressed(records)
    with pytest.raises(InvalidBatchError, match="inflates beyond the limit"):
        validate_batch(bomb)  # 2 MB from 2 KiB: beyond INFLATE_RATIO_MAX
    fits = encode_batch([Record(None, b"\x00" * 100_000)] * 5, first_timestamp_ms=1, compression=Compression.ZLIB)
    assert validate_batch(fits).record_count == 5  # under the floor: any ratio


def test_a_few_bytes_cannot_declare_a_million_records():
    # Goal (issue 21): 16 KB of zlib that inflates to 980,000 empty records is refused:
    # every read of one of them would otherwise pay for all of them.
    data = max_compressed([Record(None, None)] * 980_000)
    assert len(data) < 20_000
    with pytest.raises(InvalidBatchError, match="out of range"):
        validate_batch(data)
    data = max_compressed([Record(None, None)] * 50_000)
    with pytest.raises(InvalidBatchError, match="records declared in"):
        validate_batch(data)
    plain = encode_batch([Record(None, None)] * (RECORD_COUNT_MAX + 1), first_timestamp_ms=1)
    with pytest.raises(InvalidBatchError, match="out of range"):
        validate_batch(plain)
    assert validate_batch(encode_batch([Record(None, None)] * RECORD_COUNT_MAX, first_timestamp_ms=1))


def test_a_batch_stored_before_the_produce_bounds_still_replicates():
    # Goal: a follower or a segment transfer checks a stored batch's integrity only, so a
    # log an older version wrote (150,000 records, a 2 MiB record) still replicates,
    # while a damaged one is refused as before.
    for records in ([Record(None, None)] * 150_000, [Record(None, b"v" * (2 * RECORD_BYTES_MAX))]):
        legacy = encode_batch(records, first_timestamp_ms=1)
        with pytest.raises(InvalidBatchError):
            validate_batch(legacy)
        assert check_stored_batch(legacy).record_count == len(records)
        with pytest.raises(InvalidBatchError, match="CRC"):
            check_stored_batch(legacy[:-1] + bytes([legacy[-1] ^ 1]))


@pytest.mark.parametrize("compression", list(Compression))
def test_no_record_above_the_record_limit_hides_in_a_batch(compression):
    # Goal: the 1 MiB record limit holds for binary batches too, not only for JSON.
    at_limit = Record(b"k", b"v" * (RECORD_BYTES_MAX - 1 - 11), (("h", b"x" * 5),))  # headers: 11 bytes
    ok = encode_batch([Record(b"a", b"b"), at_limit], first_timestamp_ms=1, compression=compression)
    assert validate_batch(ok).record_count == 2
    over = Record(None, b"v" * (RECORD_BYTES_MAX + 1))
    small_fields = [Record(b"k" * 600_000, None), Record(None, b"v" * 600_000)]  # big columns, small records
    assert validate_batch(encode_batch(small_fields, first_timestamp_ms=1, compression=compression))
    with pytest.raises(InvalidBatchError, match="record 1 is"):
        validate_batch(encode_batch([Record(b"a", b"b"), over], first_timestamp_ms=1, compression=compression))


@settings(max_examples=200, deadline=None)
@given(records=_records, bounds=st.tuples(st.integers(-3, 60), st.integers(-3, 60)),
       compression=st.sampled_from(list(Compression)))
def test_a_decoded_range_is_that_slice_of_the_whole(records, bounds, compression):
    # Goal: a read decodes only the records it returns, and they are the right ones.
    data = encode_batch(records, first_timestamp_ms=7, compression=compression)
    start, stop = bounds
    part = decode_columns(data, start, stop)
    _, whole = decode_batch(data)
    first = max(0, min(start, max(0, min(stop, len(records)))))
    wanted = whole[first : max(first, min(stop, len(records)))]
    assert part.first == first
    assert list(zip(part.keys, part.values, part.headers, part.timestamp_deltas_ms, strict=True)) == \
        [(r.key, r.value, r.headers, r.timestamp_delta_ms) for r in wanted]


@settings(max_examples=fuzz_examples(500), deadline=None)
@given(data=st.binary(max_size=600) | st.builds(
    lambda records, cut, junk, compression: (
        encode_batch(records, first_timestamp_ms=1, compression=compression)[:cut] + junk),
    _records, st.integers(HEADER_BYTES, 5_000), st.binary(max_size=16), st.sampled_from(list(Compression))))
def test_any_bytes_validate_or_raise_the_typed_error_within_bounds(data):
    # Goal: whatever arrives, validate_batch returns or raises InvalidBatchError (never
    # another exception), and what it accepts is bounded by the bytes that came in:
    # records by the byte, inflated size by the ratio. Checking and decoding cost
    # memory and CPU within a bound per input byte (a compressed batch's bytes counted
    # as what it may inflate to). A read then decodes cleanly.
    compressed = len(data) > _FLAGS_AT and bool(data[_FLAGS_AT] & FLAG_COMPRESSION_MASK)
    input_bytes = len(data) + (inflated_bytes_max(len(data)) if compressed else 0)
    checked = cost(lambda: validate_batch(data))
    checked.assert_within(input_bytes=input_bytes, bytes_per_byte=BYTES_PER_INPUT_BYTE, bytes_fixed=BYTES_FIXED)
    if isinstance(checked.outcome, InvalidBatchError):
        return
    assert not isinstance(checked.outcome, Exception), repr(checked.outcome)
    header = checked.outcome
    assert header.record_count <= len(data)
    read = cost(lambda: decode_columns(data))
    read.assert_within(input_bytes=input_bytes, bytes_per_byte=BYTES_PER_INPUT_BYTE, bytes_fixed=BYTES_FIXED)
    decoded = read.outcome
    inflated = 4 * 3 * header.record_count + sum(len(v or b"") + len(k or b"")
                                                 for k, v in zip(decoded.keys, decoded.values, strict=True))
    assert inflated <= max(inflated_bytes_max(len(data)), INFLATE_FLOOR_BYTES)
