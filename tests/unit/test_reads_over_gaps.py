"""Goal: reads over a filtered mirror's gap batches (and skipped duplicates) behave as if the
left-out offsets were not there: they do not use up a read's max_records (a one-record read
passed one gap batch, so a time lookup gave up after 8 in a row), a time lookup finds the
record past a long run of gaps, a search by time answers the offset after the last older
record (it answered an earlier one: a reset to a time re-delivered older records), and a
group fetch whose partition reads only gaps answers at once with the position moved (it
waited out the other partitions' long polls, moving max_records offsets a poll).

A real segment store and the real PartitionOps read path; routing, catalog and raft are
stand-ins that say "this node holds a voting, caught-up replica".
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

import storage.offsets
from multiraft.node.group_reads import GroupReads
from multiraft.node.partition_ops import PartitionOps
from multiraft.node.record_times import (
    GAP_READS_MAX,
    NotReached,
    first_at_or_after,
    offset_for_time,
)
from multiraft.state.partition import PartitionState
from raftlog.messages import Entry, EntryKind
from raftlog.types import GroupId, Index, Offset, Term
from storage.batch import Record, encode_batch, encode_gap_batch
from tests.storage.helpers import SegmentHarness

RUN = 49  # gap batches between two record batches: far more than GAP_READS_MAX
assert RUN > GAP_READS_MAX


def _layout(batches: int) -> list[bytes]:
    """Batch n at time n s: every RUN+1-th holds 2 records, the others are 3-offset gaps."""
    out = []
    for n in range(batches):
        if n % (RUN + 1) == 0:
            out.append(encode_batch([Record(b"k", b"v%d" % n), Record(b"k", b"w%d" % n)],
                                    first_timestamp_ms=1_000 * n))
        else:
            out.append(encode_gap_batch(3, first_timestamp_ms=1_000 * n))
    return out


def _offsets(layout: list[bytes]) -> tuple[list[tuple[int, int]], int]:
    """(offset, timestamp ms) of every record, and the log end, computed from the layout."""
    records, offset = [], 0
    for n in range(len(layout)):
        count = 3 if n % (RUN + 1) else 2
        if count == 2:
            records += [(offset, 1_000 * n), (offset + 1, 1_000 * n)]
        offset += count
    return records, offset


class _Node:
    """PartitionOps over real stores: topic "t", partition p is group p + 1."""

    def __init__(self, root, layouts: list[list[bytes]]) -> None:
        partitions, stores, groups = {}, {}, {}
        for p, layout in enumerate(layouts):
            store = SegmentHarness(str(root / str(p))).store
            store.append([Entry(Index(i + 1), Term(1), EntryKind.DATA, data) for i, data in enumerate(layout)])
            state = PartitionState(topic="t", partition=p, next_offset=Offset(store.log_end_offset))
            never = asyncio.Event()
            partitions[GroupId(p + 1)] = SimpleNamespace(state=state, wait_for_change=never.wait)
            stores[GroupId(p + 1)] = store
            groups[GroupId(p + 1)] = SimpleNamespace(replay_until=0, core=SimpleNamespace(
                applied_index=10**9, leader=1, membership=SimpleNamespace(voters=(1,))))
        self.registry = SimpleNamespace(partitions=partitions, stores=stores, groups=groups)
        self.routing = SimpleNamespace(id=1, registry=self.registry)
        self.catalog = SimpleNamespace(
            partition_group=lambda topic, p: GroupId(p + 1),
            catalog=SimpleNamespace(topics={"t": SimpleNamespace(partitions=list(range(len(layouts))))}))
        self.rpc = SimpleNamespace(register=lambda *args: None)
        self.ops = PartitionOps(self.routing, self.catalog, self.rpc,
                                lambda machine, store, isolation: machine.state.high_watermark,
                                lambda group_id: None, None)


async def test_gaps_do_not_use_up_max_records(tmp_path) -> None:
    layout = _layout(3 * (RUN + 1))
    records, end = _offsets(layout)
    ops = _Node(tmp_path, [layout]).ops
    read = await ops.consume("t", 0, 2, max_records=1)  # right after the first record batch
    assert [(b, n) for b, n, _ in read.batches] == [(records[2][0], 2)]  # past 49 gaps, one read
    assert read.next_offset == records[2][0] + 2
    read = await ops.consume("t", 0, 0, max_records=3)  # counts records returned: 2, then 2 more
    assert [b for b, _, _ in read.batches] == [0, records[2][0]]
    read = await ops.consume("t", 0, 2, max_records=1, max_bytes=1)  # still bounded by bytes
    assert (read.batches, read.next_offset) == ([], 5)
    mirror = await ops.consume("t", 0, 2, max_records=1, keep_skipped=True)  # a mirror's read counts offsets
    assert [(b, n) for b, n, _ in mirror.batches] == [(2, 3)]
    assert end == read.high_watermark


async def test_a_read_passes_at_most_left_out_max_gap_batches(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(storage.offsets, "LEFT_OUT_MAX", 5)
    ops = _Node(tmp_path, [_layout(RUN + 2)]).ops
    read = await ops.consume("t", 0, 2, max_records=1)
    assert (read.batches, read.next_offset) == ([], 2 + 5 * 3)


async def test_skipped_duplicates_do_not_use_up_max_records(tmp_path) -> None:
    layout = _layout(2 * (RUN + 1) + 1)
    records, _ = _offsets(layout)
    node = _Node(tmp_path, [layout])
    node.registry.partitions[GroupId(1)].state.skipped_ranges = [(Offset(records[2][0]), 2)]
    read = await node.ops.consume("t", 0, 2, max_records=1)
    assert [b for b, _, _ in read.batches] == [records[4][0]]


async def test_time_lookups_pass_long_runs_of_gaps(tmp_path) -> None:
    layout = _layout(6 * (RUN + 1) + 1)
    records, end = _offsets(layout)
    ops = _Node(tmp_path, [layout]).ops
    for offset in range(0, end, 7):
        want = next(((o, t) for o, t in records if o >= offset), None)
        assert await first_at_or_after(ops, "t", 0, offset) == want, offset
    for stamp in range(-1, 1_000 * len(layout) + 2, 500):
        older = [o for o, t in records if t < stamp]
        want = older[-1] + 1 if older else 0  # the offset after the last older record
        assert await offset_for_time(ops, "t", 0, 0, end, stamp) == want, stamp


async def test_a_lookup_that_runs_out_says_so_and_the_search_goes_on(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(storage.offsets, "LEFT_OUT_MAX", 2)  # 1 + 7 * 2 gap batches a lookup at most
    layout = _layout(2 * (RUN + 1) + 1)
    records, end = _offsets(layout)
    ops = _Node(tmp_path, [layout]).ops
    found = await first_at_or_after(ops, "t", 0, 2)
    assert isinstance(found, NotReached) and 2 < found.reached < records[2][0]
    for stamp in (1_000, 50_000, 50_001, 100_000, 100_001):
        older = [o for o, t in records if t < stamp]
        assert await offset_for_time(ops, "t", 0, 0, end, stamp) == older[-1] + 1, stamp


async def test_a_group_fetch_over_gaps_answers_at_once_with_the_position_moved(tmp_path) -> None:
    # Partition 0 holds 200 gap batches and then a record; a read's bytes pass only some of
    # the gaps (36 bytes each), so its position moves with more of the log to follow.
    gaps = [encode_gap_batch(3, first_timestamp_ms=n) for n in range(200)]
    tail = [encode_batch([Record(b"k", b"v")], first_timestamp_ms=1)]
    node = _Node(tmp_path, [gaps + tail, tail])

    async def command(heartbeat):
        return {"assignment": [{"topic": "t", "partitions": [0, 1]}], "session_timeout_ms": 60_000}

    reads = GroupReads(SimpleNamespace(command=command), node.ops, node.routing, node.catalog, node.rpc)
    began = time.monotonic()
    # Partition 1 waits at its end for new records.
    fetch = await reads.fetch(SimpleNamespace(group="g"), {("t", 0): 0, ("t", 1): 1}, "earliest",
                              max_records=10, max_bytes=2 * 100 * 36, wait_ms=10_000)
    assert time.monotonic() - began < 5
    (answer,) = [f for f in fetch.partitions if f.partition == 0]
    assert answer.result is not None and answer.result.batches == []
    assert 10 < answer.result.next_offset < 600  # gaps passed, more than max_records offsets


async def test_a_group_fetch_at_the_end_over_gaps_waits_its_poll(tmp_path) -> None:
    # Review: at the log's end, a partition that only passed gaps does not end the fetch (each
    # gap a filtered mirror commits would otherwise answer a long poll at once).
    gaps = [encode_gap_batch(3, first_timestamp_ms=n) for n in range(200)]
    node = _Node(tmp_path, [gaps, [encode_batch([Record(b"k", b"v")], first_timestamp_ms=1)]])

    async def command(heartbeat):
        return {"assignment": [{"topic": "t", "partitions": [0, 1]}], "session_timeout_ms": 60_000}

    reads = GroupReads(SimpleNamespace(command=command), node.ops, node.routing, node.catalog, node.rpc)
    began = time.monotonic()
    fetch = await reads.fetch(SimpleNamespace(group="g"), {("t", 0): 0, ("t", 1): 1}, "earliest",
                              max_records=10, max_bytes=1 << 20, wait_ms=1_500)
    assert time.monotonic() - began >= 1.0, "answered before its poll ended"
    (answer,) = [f for f in fetch.partitions if f.partition == 0]
    assert answer.result is not None and answer.result.batches == [] and answer.result.next_offset == 600


pytestmark = pytest.mark.asyncio
