"""Goal: startingTimestamp over a filtered mirror's gaps (offsets without records, which reads
leave out) answers an offset between the last record older than the time and the first one
at or after it. A probe that landed in a run of gaps took "no record here" for "none after
it" and answered before older records, which the read then included.

The real read path (PartitionOps over a real segment store, tests/unit/test_reads_over_gaps.py)
behind the client's consume_batches; no Spark, no HTTP.
"""

from __future__ import annotations

import pytest

import spark_connector.cluster
import storage.offsets
from multiraft.client.http import BatchRead
from spark_connector.cluster import offset_for_timestamp
from spark_connector.planning import PartitionState
from tests.unit.test_reads_over_gaps import _layout, _Node, _offsets

pytestmark = pytest.mark.asyncio


class _Client:
    """The one call the search makes, answered by the node's read path."""

    def __init__(self, node: _Node) -> None:
        self.node = node

    async def consume_batches(self, topic: str, partition: int, offset: int, *, max_records: int, max_bytes: int,
                              isolation: str, server: str) -> BatchRead:
        read = await self.node.ops.consume(topic, partition, offset, max_records=max_records, max_bytes=max_bytes,
                                           isolation=isolation)
        return BatchRead([(b, data) for b, _, data in read.batches], read.next_offset, read.high_watermark,
                         read.log_start_offset)


async def test_starting_timestamp_over_runs_of_gaps(tmp_path) -> None:
    layout = _layout(6 * 50 + 1)
    records, end = _offsets(layout)
    client = _Client(_Node(tmp_path, [layout]))
    state = PartitionState("t", 0, ("n1",), "n1", 0, end, end)
    for stamp in range(-1, 1_000 * len(layout) + 2, 500):
        older = [o for o, t in records if t < stamp]
        newer = [o for o, t in records if t >= stamp]
        answer = await offset_for_timestamp(client, state, stamp)  # type: ignore[arg-type]
        if not newer:
            assert answer is None, stamp
        else:  # reading from it gives exactly the records at or after the time
            assert answer is not None and (older[-1] if older else -1) < answer <= newer[0], (stamp, answer)


async def test_a_probe_that_runs_out_in_gaps_answers_early_never_late(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(storage.offsets, "LEFT_OUT_MAX", 2)
    monkeypatch.setattr(spark_connector.cluster, "PROBE_READS_MAX", 2)  # 3 gap batches a probe at most
    layout = _layout(6 * 50 + 1)
    records, end = _offsets(layout)
    client = _Client(_Node(tmp_path, [layout]))
    state = PartitionState("t", 0, ("n1",), "n1", 0, end, end)
    for stamp in range(1, 1_000 * len(layout) + 2, 2_500):
        newer = [o for o, t in records if t >= stamp]
        answer = await offset_for_timestamp(client, state, stamp)  # type: ignore[arg-type]
        if newer:  # at or before the first record at or after the time: none of those left out
            assert answer is not None and answer <= newer[0], (stamp, answer)
