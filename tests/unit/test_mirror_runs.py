"""Goal: a filtered mirror's pull and verify read the source by one set of rules
(multiraft/node/mirror_runs.py, docs/mirror.md "Record filters"):

- a position inside a source batch (a kept-prefix cut at a run, the sink's log start after
  retention, a span's leaf-aligned start) is accepted for a filtered link when it is an
  output boundary of that batch's filtered output (the pull) or simply drops the outputs
  below it (the verify's tree), and refused (`Diverged`) otherwise; an unfiltered link
  stays as strict as ever;
- any fault the filter meets is the source's (`SourceError`: the pull backs off);
- a filtered chunk goes as proposals of at most 1,024 entries and a chunk's bytes, the
  window bounds holding, plain and compressed;
- the verify feeds its leaves as it goes and matches the sink's tree over any span start;
- gap batches read through an unfiltered link are refused below feature level 3.
"""

from __future__ import annotations

import asyncio
import struct
import tracemalloc

import pytest

from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node import mirror_runs, mirror_verify_filtered
from multiraft.node.mirror_filter import filter_batch, filter_chunk
from multiraft.node.mirror_runs import (
    ENTRIES_PER_PROPOSAL_MAX,
    contiguous,
    filter_from,
    pieces,
    starting_at,
)
from multiraft.node.mirror_source import Diverged, LogChunk, SourceError
from multiraft.node.mirror_verify_filtered import filtered_source_tree
from multiraft.node.mirror_window import CHUNK_BYTES, PipelineBounds
from raftlog.messages import EntryKind
from raftlog.types import GroupId
from storage.batch import (
    Compression,
    Record,
    encode_batch,
    encode_gap_batch,
    read_header,
)
from storage.tictac import LeafAccumulator, element_hash
from tests.unit.test_mirror_pull import FakeRegistry, FakeSource, _data, _pulls, _until, pauses  # noqa: F401

ASYNC = pytest.mark.asyncio(loop_scope="function")

EU = RecordMatcher.of((("key_prefix", "eu-"),))


async def _pull_until(pulls, source, condition, what: str, *link) -> None:  # type: ignore[no-untyped-def]
    """Partition 0 of "orders" pulled by link "dr" into group 100 (`link`: its feature level and
    matcher, if any) until `condition` holds; the pull is then cancelled."""
    task = asyncio.create_task(pulls._pull(GroupId(100), "dr", source, "orders", 0, *link))
    try:
        await _until(condition, what)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _mixed(keys: list[bytes], compression: Compression = Compression.NONE, first_ms: int = 1000) -> bytes:
    return encode_batch([Record(k, b"v%d" % i, (), i) for i, k in enumerate(keys)], first_timestamp_ms=first_ms,
                        compression=compression)


# A source batch at 10 whose filtered output is gap [10,12), run [12,14), gap [14,15).
MIXED = _mixed([b"us", b"us", b"eu-1", b"eu-2", b"us"])


def test_an_unfiltered_position_inside_a_batch_is_still_diverged() -> None:
    with pytest.raises(Diverged):
        contiguous([(10, MIXED)], 12)
    assert contiguous([(10, MIXED)], 12, inside=True) == ([MIXED], 10, 15)


def test_a_filtered_position_at_an_output_boundary_inside_a_batch_is_accepted() -> None:
    whole = filter_chunk(EU, [MIXED], 10)
    payloads, first, _ = contiguous([(10, MIXED)], 12, inside=True)
    assert starting_at(filter_from(EU, payloads, first, 12), 12) == whole[1:]
    assert starting_at(filter_from(EU, payloads, first, 14), 14) == whole[2:]
    with pytest.raises(Diverged):  # 13 is inside the run [12, 14)
        starting_at(filter_from(EU, payloads, first, 13), 13)


@ASYNC
async def test_the_pull_resumes_inside_a_source_batch_at_a_run(pauses: list[float]) -> None:  # noqa: F811
    # Goal: a kept-prefix cut after the gap [10,12) of a split batch: the new incarnation's
    # pull starts at 12 and copies on (before: Diverged, for good).
    registry = FakeRegistry()
    runtime = registry.add(100, start=12)
    after = _mixed([b"eu-9"])
    source = FakeSource({0: [(10, MIXED), (15, after)]})
    pulls = _pulls(registry, 1)
    await _pull_until(pulls, source, lambda: runtime.machine.state.next_offset == 16, "copied from inside the batch",
                      1, EU)
    assert _data(runtime) == [*filter_chunk(EU, [MIXED], 10)[1:], after]


def test_any_fault_of_the_filter_is_the_source_s(monkeypatch: pytest.MonkeyPatch) -> None:
    for fault in (struct.error("out of range"), OverflowError("big"), ValueError("bad")):
        def broken(*_: object, fault: Exception = fault) -> list[bytes]:
            raise fault
        monkeypatch.setattr(mirror_runs, "filter_chunk", broken)
        with pytest.raises(SourceError):
            filter_from(EU, [MIXED], 10, 10)


def test_pieces_bound_entries_and_bytes() -> None:
    batches = [encode_gap_batch(1, first_timestamp_ms=0)] * 3000
    parts = pieces(batches, 5, CHUNK_BYTES)
    assert [len(p[2]) for p in parts] == [1024, 1024, 952]
    assert [(p[0], p[1]) for p in parts] == [(5, 1029), (1029, 2053), (2053, 3005)]
    parts = pieces(batches, 0, 36 * 10)
    assert all(len(p[2]) == 10 for p in parts) and len(parts) == 300


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZLIB])
@ASYNC
async def test_a_huge_alternating_batch_goes_as_bounded_proposals(pauses: list[float],  # noqa: F811
                                                                  compression: Compression) -> None:
    # Goal: 20,000 alternating records (20,000 outputs) are not one proposal: each carries at
    # most 1,024 entries and a chunk's bytes, and the window's bound on proposals holds.
    keys = [b"eu-" if i % 2 else b"us" for i in range(20_000)]
    data = _mixed(keys, compression)
    registry = FakeRegistry()
    runtime = registry.add(100)
    source = FakeSource({0: [(0, data)]})
    bounds = PipelineBounds(2, 2 * 64 * 1024, 64 * 1024)
    pulls = _pulls(registry, 1, bounds)
    in_flight: list[int] = []
    original = pulls._take_applied

    async def watched(window, *args, **kwargs):  # type: ignore[no-untyped-def]
        in_flight.append(len(window.chunks))
        await original(window, *args, **kwargs)

    pulls._take_applied = watched  # type: ignore[method-assign]
    await _pull_until(pulls, source, lambda: runtime.machine.state.next_offset == 20_000, "everything copied", 1, EU)
    sizes = [payloads for kind, payloads in runtime.proposals if kind is EntryKind.DATA]
    assert len(sizes) >= 20_000 // ENTRIES_PER_PROPOSAL_MAX
    assert all(len(p) <= ENTRIES_PER_PROPOSAL_MAX and sum(map(len, p)) <= 64 * 1024 for p in sizes)
    assert _data(runtime) == filter_batch(EU, data) and max(in_flight) <= 2


class _Client:
    def __init__(self, log: list[tuple[int, bytes]]) -> None:
        self.log = log

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        batches, size = [], 0
        for b, d in self.log:
            if b + read_header(d).record_count > offset and (not batches or size + len(d) <= max_bytes):
                batches.append((b, d))
                size += len(d)
        end = self.log[-1][0] + read_header(self.log[-1][1]).record_count
        return LogChunk(batches, (), end, end, self.log[0][0])


@pytest.mark.parametrize("lo", [10, 12, 13, 15])
@ASYNC
async def test_the_filtered_verify_starts_inside_a_source_batch(lo: int) -> None:
    # Goal: the sink's log start (retention) or a span's start inside a source batch: the tree
    # is the sink's (its batches based at lo or later), not UNREACHABLE (Diverged) for good.
    after = _mixed([b"eu-9", b"us"])
    log = [(10, MIXED), (15, after)]
    span = await filtered_source_tree(_Client(log), "t", 0, lo, 17, EU, 1 << 20)  # type: ignore[arg-type]
    leaves, base = LeafAccumulator(lo, 17), 10
    for data in filter_chunk(EU, [MIXED, after], 10):
        if base >= lo:
            leaves.add(base, element_hash(base, data))
        base += read_header(data).record_count
    assert span.tree == leaves.tree()


def _gap_pulls(level: int) -> tuple[FakeRegistry, object, object]:
    registry = FakeRegistry()
    runtime = registry.add(100)
    pulls = _pulls(registry, 1)
    pulls._catalog.catalog.feature_level = level  # type: ignore[attr-defined]
    return registry, runtime, pulls


@pytest.mark.parametrize("level", [2, 3])
@ASYNC
async def test_gap_batches_through_an_unfiltered_link_need_level_3(pauses: list[float],  # noqa: F811
                                                                   level: int) -> None:
    _, runtime, pulls = _gap_pulls(level)
    log = [(0, encode_gap_batch(4, first_timestamp_ms=1)), (4, _mixed([b"eu-1"]))]
    source = FakeSource({0: log})
    status = pulls.status
    if level == 3:
        await _pull_until(pulls, source, lambda: runtime.machine.state.next_offset == 5, "copied")  # type: ignore[attr-defined]
    else:
        await _pull_until(pulls, source, lambda: GroupId(100) in status and status[GroupId(100)].failures >= 2,
                          "refused, backing off")
    if level == 2:
        assert status[GroupId(100)].state == "backing_off" and "feature level 3" in status[GroupId(100)].last_error
        assert runtime.machine.state.next_offset == 0  # type: ignore[attr-defined]


@ASYNC
async def test_a_verify_keeps_nothing_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: the verify's memory is one read's outputs, not one tuple per output of its whole
    # span (64 MiB of small alternating records was ~5M tuples). 128 source batches of 1,000
    # alternating records (128,000 outputs), read 16 KiB a time: the peak stays a read's worth.
    monkeypatch.setattr(mirror_verify_filtered, "READ_CHUNK_BYTES", 16 * 1024)
    data = _mixed([b"eu-" if i % 2 else b"us" for i in range(1000)])
    log = [(1000 * n, data) for n in range(128)]
    tracemalloc.start()
    try:
        span = await filtered_source_tree(_Client(log), "t", 0, 0, 128_000, EU, 1 << 30)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert span.tree.hi == 128_000 and span.bytes_read == 128 * len(data)
    assert peak < 4 * 1024 * 1024, peak
