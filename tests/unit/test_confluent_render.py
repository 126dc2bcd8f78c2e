"""Goal: a Confluent records GET's positions (multiraft/http/handlers/confluent_consumers.py
`_render`): a partition whose read returned no batch it may answer, yet moved on (the
read skipped duplicate or refused batches: `next_offset` past the start), goes on from
there, else the instance reads the skipped range again forever; a partition cut by the
answer's limits goes on from its last record answered, or from its start."""

from __future__ import annotations

from multiraft.http.handlers.confluent_consumers import _render
from multiraft.node.group_reads import MemberFetch, PartitionFetch
from multiraft.node.partition_ops import ConsumeResult
from storage.batch import Record, encode_batch


def _batch(count: int) -> bytes:
    return encode_batch([Record(None, b"v")] * count, first_timestamp_ms=1)


def test_a_read_that_skipped_batches_moves_the_position_past_them() -> None:
    skipped = PartitionFetch("t", 0, 5, ConsumeResult([], 8, 10, 0))  # [5, 8) skipped on apply
    read = PartitionFetch("t", 1, 0, ConsumeResult([(0, 2, _batch(2))], 4, 4, 0))  # [2, 4) skipped after
    records, positions = _render(MemberFetch({}, [skipped, read]), "binary", 1 << 20)
    assert [(r["partition"], r["offset"]) for r in records] == [(1, 0), (1, 1)]
    assert positions == {("t", 0): 8, ("t", 1): 4}


def test_a_partition_cut_by_max_bytes_goes_on_from_its_last_record_answered() -> None:
    first = PartitionFetch("t", 0, 0, ConsumeResult([(0, 3, _batch(3))], 9, 9, 0))
    second = PartitionFetch("t", 1, 7, ConsumeResult([(7, 1, _batch(1))], 8, 8, 0))
    records, positions = _render(MemberFetch({}, [first, second]), "binary", 2)  # two values of one byte
    assert [(r["partition"], r["offset"]) for r in records] == [(0, 0), (0, 1)]
    assert positions == {("t", 0): 2, ("t", 1): 7}
