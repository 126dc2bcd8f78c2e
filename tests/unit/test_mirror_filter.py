"""A filtered mirror's chunk (multiraft/node/mirror_filter.py, docs/mirror.md "Record filters").

Goal: every source batch becomes batches covering exactly its offsets; a wholly matching
batch stays the source's bytes; one matching nothing, one the source skipped and one
already a gap become one gap batch; mixed batches become runs whose records keep their
keys, values, headers and source timestamps, the producer and (advanced) sequence, the
compression; the result is deterministic; a malformed batch is refused; the size bound holds.
"""

from __future__ import annotations

import pytest

from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node.mirror_filter import READ_SHARE, filter_batch, filter_chunk
from multiraft.node.mirror_runs import ENTRIES_PER_PROPOSAL_MAX, pieces
from multiraft.node.mirror_window import CHUNK_BYTES
from storage.batch import (
    HEADER_BYTES,
    Compression,
    Record,
    check_stored_batch,
    decode_columns,
    encode_batch,
    encode_gap_batch,
    is_gap,
    read_header,
)
from storage.errors import InvalidBatchError

EU = RecordMatcher.of((("key_prefix", "eu-"), ("header", "keep")))
FIRST_MS = 1_700_000_000_000


def _batch(keys: list[bytes | None], compression: Compression = Compression.NONE, sequence: int = 10,
           headers: dict[int, tuple[tuple[str, bytes], ...]] | None = None) -> bytes:
    records = [Record(k, b"value-%d" % i, (headers or {}).get(i, ()), 5 * i + (3 if i == 2 else 0))
               for i, k in enumerate(keys)]
    return encode_batch(records, first_timestamp_ms=FIRST_MS, producer_id=77, producer_epoch=3,
                        base_sequence=sequence, compression=compression)


def _records(batches: list[bytes], base: int) -> dict[int, tuple[bytes | None, bytes | None, tuple, int]]:
    """Offset -> (key, value, headers, timestamp) of every record the batches hold (gaps hold none)."""
    found = {}
    for data in batches:
        decoded = decode_columns(data)
        for i, key in enumerate(decoded.keys):
            found[base + i] = (key, decoded.values[i], decoded.headers[i],
                               decoded.header.first_timestamp_ms + decoded.timestamp_deltas_ms[i])
        base += decoded.header.record_count
    return found


def test_a_wholly_matching_batch_stays_the_source_bytes() -> None:
    data = _batch([b"eu-1", b"eu-2"])
    assert filter_batch(EU, data) == [data]


def test_a_batch_matching_nothing_is_one_gap() -> None:
    data = _batch([b"us-1", None, b"us-3"])
    (gap,) = filter_batch(EU, data)
    assert gap == encode_gap_batch(3, first_timestamp_ms=FIRST_MS) and len(gap) == HEADER_BYTES


@pytest.mark.parametrize("compression", list(Compression))
def test_runs_keep_offsets_records_timestamps_producer_and_compression(compression: Compression) -> None:
    keys = [b"us-0", b"eu-1", b"eu-2", None, b"us-4", b"x", b"eu-6"]
    data = _batch(keys, compression, headers={5: (("keep", b""),)})
    out = filter_batch(EU, data)
    assert [read_header(b).record_count for b in out] == [1, 2, 2, 2]
    assert [is_gap(b) for b in out] == [True, False, True, False]
    for batch in out:
        check_stored_batch(batch)
    source = _records([data], 100)
    assert _records(out, 100) == {o: r for o, r in source.items() if o in (101, 102, 105, 106)}
    runs = [read_header(b) for b in out if not is_gap(b)]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in runs] == [(77, 3, 11), (77, 3, 15)]
    assert all(h.compression is compression for h in runs)
    # Runs and gaps keep the source batch's first timestamp (records their own deltas).
    assert all(read_header(b).first_timestamp_ms == FIRST_MS for b in out)


def test_sequences_none_stay_none_and_wrap() -> None:
    assert read_header(filter_batch(EU, _batch([b"us", b"eu-1"], sequence=-1))[1]).base_sequence == -1
    assert read_header(filter_batch(EU, _batch([b"us", b"eu-1"], sequence=2**31 - 1))[1]).base_sequence == 0


def test_a_chunk_turns_skipped_batches_and_gaps_into_gaps_and_is_deterministic() -> None:
    first, skipped, gap, last = _batch([b"eu-1", b"us"]), _batch([b"eu-9"]), encode_gap_batch(4, first_timestamp_ms=1), \
        _batch([b"eu-5"])
    batches = [first, skipped, gap, last]
    out = filter_chunk(EU, batches, 50, ((52, 1),))
    assert out == filter_chunk(EU, batches, 50, ((52, 1),))
    assert sum(read_header(b).record_count for b in out) == 2 + 1 + 4 + 1
    assert out[2] == encode_gap_batch(1, first_timestamp_ms=FIRST_MS) and out[3] == gap and out[4] == last
    assert set(_records(out, 50)) == {50, 57}
    assert filter_chunk(EU, batches, 50) != out  # unskipped, 52 is copied


def test_a_malformed_batch_is_refused() -> None:
    data = bytearray(_batch([b"eu-1"]))
    data[-1] ^= 1
    with pytest.raises(InvalidBatchError):
        filter_chunk(EU, [bytes(data)], 0)


def test_the_filtered_size_stays_below_the_read_share_bound() -> None:
    # The worst case: one-record runs alternating, empty keys and values.
    keys = [b"eu-" if i % 2 else b"" for i in range(1000)]
    data = encode_batch([Record(k, None) for k in keys], first_timestamp_ms=0)
    out = filter_batch(EU, data)
    assert len(out) == 1000 and sum(len(b) for b in out) < READ_SHARE * len(data)


def test_timestamps_near_the_end_of_i64_filter() -> None:
    # A produce-valid batch whose first timestamp is near 2**63: a run keeps it and its records'
    # deltas (before, first + min(delta) overflowed i64: struct.error, the pull's task died).
    records = [Record(k, b"v", (), d) for k, d in ((b"us", 0), (b"eu-1", 1), (b"us", 5), (b"eu-2", 9))]
    data = encode_batch(records, first_timestamp_ms=2**63 - 2)
    out = filter_batch(EU, data)
    assert [read_header(b).first_timestamp_ms for b in out] == [2**63 - 2] * 4
    assert [decode_columns(b).timestamp_deltas_ms for b in out if not is_gap(b)] == [[1], [9]]


def test_a_compressed_batch_outgrows_the_read_share_so_proposals_are_split() -> None:
    # A compressed batch of alternating records re-encodes to many times its bytes (each run
    # its own zlib stream and header): the read share bounds nothing there, so the pull
    # splits the filtered chunk into proposals of bounded entries and bytes (mirror_runs.py).
    keys = [b"eu-" if i % 2 else b"" for i in range(100_000)]
    data = encode_batch([Record(k, None) for k in keys], first_timestamp_ms=0, compression=Compression.ZLIB)
    out = filter_batch(EU, data)
    assert sum(len(b) for b in out) > 10 * READ_SHARE * len(data)
    parts = pieces(out, 0, CHUNK_BYTES)
    assert all(len(p) <= ENTRIES_PER_PROPOSAL_MAX and sum(map(len, p)) <= CHUNK_BYTES for _, _, p in parts)
    assert parts[-1][1] == 100_000 and [b for _, _, p in parts for b in p] == out
