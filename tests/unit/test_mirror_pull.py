"""Goal: the pull loops of mirror partitions (multiraft/node/mirror_pull.py) copy every
partition a node leads whatever the read bound, never spin against a source or a
group that keeps refusing, and re-check leadership between the skips' META entry and
the data proposal.

`MirrorPulls` runs here over fakes: a registry whose runtimes apply proposals at once,
a catalog holding one mirror topic, and a source serving in-memory logs. Pauses are
recorded (and shortened) by patching `asyncio.sleep` as the module sees it.
"""

from __future__ import annotations

import asyncio
import importlib
import random
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.http.mirror_openapi import PATHS
from multiraft.metadata.catalog_records import PartitionInfo, TopicInfo
from multiraft.metadata.mirror_commands import LinkState, MirrorLink, Priority
from multiraft.node import mirror_pull
from multiraft.node.mirror_pull import (
    IDLE_PAUSE_MAX_S,
    RESYNC_PAUSE_MAX_S,
    SETTLE_POLL_S,
    MirrorPulls,
    ReadSlots,
)
from multiraft.node.mirror_source import LogChunk, PartitionView
from multiraft.node.mirror_window import PipelineBounds
from raftlog.errors import ProposalDropped
from raftlog.messages import EntryKind
from raftlog.types import GroupId, NodeId
from storage.batch import Record, encode_batch, read_header

pytestmark = pytest.mark.asyncio(loop_scope="function")
_STATUS_SCHEMA = PATHS["/v1/admin/mirrors/{name}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
_PULL_SCHEMA = _STATUS_SCHEMA["properties"]["topics"]["items"]["properties"]["partitions"]["items"]
_real_sleep = asyncio.sleep
LINK = MirrorLink("dr", ("127.0.0.1:1",), "*", Priority.NORMAL, LinkState.RUNNING)


def _batch(n: int, records: int = 2) -> bytes:
    return encode_batch([Record(b"k", b"v%d-%d" % (n, i)) for i in range(records)], first_timestamp_ms=n + 1)


class FakeLog:
    def __init__(self, runtime: FakeRuntime) -> None:
        self._runtime = runtime

    def last_index(self) -> int:
        return self._runtime.last

    def term_or_none(self, index: int) -> int | None:
        return self._runtime.core.term if index <= self._runtime.last else None


class FakeCore:
    """A leader whose log is all committed and applied (its last index)."""

    def __init__(self, runtime: FakeRuntime, term: int) -> None:
        self.term = term
        self.log = FakeLog(runtime)
        self._runtime = runtime

    @property
    def commit_index(self) -> int:
        return self._runtime.last

    @property
    def applied_index(self) -> int:
        return self._runtime.last


class FakeRuntime:
    """A group leader whose proposals apply at once (DATA moves the next offset); a
    proposal's guard decides before it is appended, as on the group's task."""

    def __init__(self, machine: Any, term: int = 2) -> None:
        self.machine = machine
        self.proposals: list[tuple[EntryKind, list[bytes]]] = []
        self.refuse: Exception | None = None
        self.on_meta: Any = None
        self.last = 10
        self.core = FakeCore(self, term)
        self.gate: asyncio.Event | None = None  # DATA proposals answer once it is set (in flight until then)
        self.waiting = 0  # DATA proposals appended, waiting on the gate
        self.drop_once: set[int] = set()  # chunk first offsets dropped once before the append
        self.on_read_index: Any = None  # called as a ReadIndex is confirmed (a step down, a move, say)
        self.read_indexes = 0

    async def read_index(self) -> int:
        """A ReadIndex the group confirms at once (its log is all applied), after `on_read_index`."""
        await _real_sleep(0)
        self.read_indexes += 1
        if self.on_read_index is not None:
            self.on_read_index()
        return self.last

    async def propose(self, payloads: list[bytes], kind: EntryKind = EntryKind.DATA,
                      guard: Any = None) -> list[Any]:
        await _real_sleep(0)
        if guard is not None:
            guard.check(self.core)
        if guard is not None and kind is EntryKind.DATA and guard.first_offset in self.drop_once:
            self.drop_once.discard(guard.first_offset)
            raise ProposalDropped("too many uncommitted bytes; retry after commits catch up")
        self.proposals.append((kind, payloads))
        if self.refuse is not None:
            raise self.refuse
        if kind is EntryKind.META and self.on_meta is not None:
            self.on_meta()
        state, results = self.machine.state, []
        for payload in payloads:
            self.last += 1
            if kind is EntryKind.DATA:
                results.append(SimpleNamespace(stored_base_offset=state.next_offset))
                state.next_offset += read_header(payload).record_count
        state.applied_index = self.last
        if guard is not None:
            guard.appended(self.core)
        if self.gate is not None and kind is EntryKind.DATA:
            self.waiting += 1
            await self.gate.wait()
            self.waiting -= 1
        return results


class FakeRegistry:
    def __init__(self) -> None:
        self.partitions: dict[GroupId, Any] = {}
        self.leaders: dict[GroupId, FakeRuntime] = {}

    def add(self, group_id: int, start: int = 0) -> FakeRuntime:
        machine = SimpleNamespace(state=SimpleNamespace(mirror=True, next_offset=start, applied_index=10))
        self.partitions[GroupId(group_id)] = machine
        runtime = self.leaders[GroupId(group_id)] = FakeRuntime(machine)
        return runtime

    def leading(self, group_id: GroupId) -> FakeRuntime | None:
        return self.leaders.get(group_id)


class FakeSource:
    """In-memory source logs by partition: [(base offset, batch bytes)]; counts reads."""

    def __init__(self, logs: dict[int, list[tuple[int, bytes]]], skipped: tuple[tuple[int, int], ...] = ()) -> None:
        self.logs = logs
        self.skipped = skipped
        self.reads: list[tuple[int, int]] = []
        self.start = 0
        self.stale = False  # answer the log's first batches whatever the offset asked
        self.group = 900  # the source partition's group id (its identity at the source)
        self.replica_starts: list[int] | None = None  # each replica's log start as described (None: [start])
        self.replica_groups: list[int] | None = None  # each replica's node's answer of the identity (None: group)
        self.described = 0  # descriptions asked (partition_views)
        self.rotations = 0

    def _high_watermark(self, partition: int) -> int:
        log = self.logs[partition]
        return log[-1][0] + read_header(log[-1][1]).record_count if log else self.start

    async def partition_views(self, topic: str, partition: int) -> list[PartitionView]:
        """Each replica as its node (1, 2, ...) describes it: the identity (`group`, or
        `replica_groups`), the replicas on nodes 1..n, its log start (`replica_starts`)."""
        await _real_sleep(0)
        self.described += 1
        hw = self._high_watermark(partition)
        starts = self.replica_starts or [self.start]
        groups, replicas = self.replica_groups or [self.group] * len(starts), tuple(range(1, len(starts) + 1))
        return [PartitionView(group, start, max(start, hw), replicas, node)
                for node, (group, start) in enumerate(zip(groups, starts, strict=True), 1)]

    def rotate(self) -> None:
        self.rotations += 1

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        await _real_sleep(0)  # answers at once, whatever wait_ms says
        self.reads.append((partition, offset))
        log = self.logs[partition]
        hw = self._high_watermark(partition)
        batches = [(b, d) for b, d in log if self.stale or b + read_header(d).record_count > offset][:2]
        next_offset = batches[-1][0] + read_header(batches[-1][1]).record_count if batches else offset
        return LogChunk(batches, self.skipped, next_offset, hw, self.start)

    def scrub(self, text: str) -> str:
        return text

    async def close(self) -> None:
        pass


def _log(batches: int, records: int = 2, first: int = 0) -> list[tuple[int, bytes]]:
    return [(first + i * records, _batch(i, records)) for i in range(batches)]


def _pulls(registry: FakeRegistry, partitions: int, bounds: PipelineBounds | None = None) -> MirrorPulls:
    topic = TopicInfo("orders", 3, {}, tuple(PartitionInfo(p, GroupId(100 + p), (NodeId(1),))
                                             for p in range(partitions)), "dr", False, partitions)
    catalog = SimpleNamespace(catalog=SimpleNamespace(topics={"orders": topic}, mirror_links={"dr": LINK}))
    logger = SimpleNamespace(info=lambda *a, **k: None, error=lambda *a, **k: None)
    return MirrorPulls(registry, catalog, logger, random.Random(7), bounds)  # type: ignore[arg-type]


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every pause the pull loops take, recorded; each lasts a millisecond."""
    recorded: list[float] = []

    async def sleep(seconds: float) -> None:
        recorded.append(seconds)
        await _real_sleep(0.001)

    monkeypatch.setattr(mirror_pull.asyncio, "sleep", sleep)
    return recorded


async def _until(condition: Any, what: str, timeout_s: float = 5.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await _real_sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_every_mirrored_partition_is_copied_when_there_are_more_than_read_slots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: with 7 mirror partitions led here and 2 read slots, all 7 are copied to the
    # source's end (a bound on the set of pulled partitions left 5 never copied).
    monkeypatch.setattr(mirror_pull, "PULLS_MAX", 2)
    registry = FakeRegistry()
    runtimes = [registry.add(100 + p) for p in range(7)]
    source = FakeSource({p: _log(5) for p in range(7)})
    monkeypatch.setattr(mirror_pull, "source_client", lambda *_args: source)
    pulls = _pulls(registry, 7)
    try:
        await pulls.scan()
        await _until(lambda: all(r.machine.state.next_offset == 10 for r in runtimes), "every partition copied")
    finally:
        await pulls.stop()
    assert {p for p, _ in source.reads} == set(range(7))


async def test_read_slots_bound_reads_and_serve_high_priority_first() -> None:
    # Goal: at most `count` holders at once; a freed slot goes to the best rank waiting
    # (then the earliest); a waiter cancelled after being granted passes the slot on.
    slots = ReadSlots(1)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str, rank: int) -> None:
        async with slots.held(rank):
            order.append(name)
            await release.wait()

    async with asyncio.timeout(5):
        first = asyncio.create_task(hold("first", 1))
        await _real_sleep(0)
        tasks = [asyncio.create_task(hold(name, rank)) for name, rank in
                 [("low", 2), ("normal-a", 1), ("high", 0), ("normal-b", 1)]]
        cancelled = asyncio.create_task(hold("cancelled", 0))
        await _real_sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert order == ["first"]
        release.set()
        await asyncio.gather(first, *tasks)
    assert order == ["first", "high", "normal-a", "normal-b", "low"]


@pytest.mark.parametrize("stale", [
    pytest.param(False, id="a source that ignores wait_ms"),
    pytest.param(True, id="a source sending only batches before the position"),
])
async def test_early_answers_with_nothing_to_copy_back_off(pauses: list[float], stale: bool) -> None:
    # Goal: a source that answers at once with nothing to copy is asked again after a
    # growing, jittered, bounded pause, not as fast as it answers.
    registry = FakeRegistry()
    runtime = registry.add(100, start=6)
    source = FakeSource({0: _log(3) if stale else []})
    source.start, source.stale = 6, stale
    pulls = _pulls(registry, 1)
    task = asyncio.create_task(pulls._pull(GroupId(100), "dr", source, "orders", 0))  # type: ignore[arg-type]
    try:
        await _until(lambda: len(source.reads) >= 12, "12 reads")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert runtime.proposals == []
    assert len(pauses) >= len(source.reads) - 1, "a read followed another without a pause"
    assert pauses[-1] > 0.3 and max(pauses) <= IDLE_PAUSE_MAX_S
    assert len(set(pauses)) > 5, "the pauses are jittered"


async def test_a_proposal_refused_again_and_again_backs_off(pauses: list[float]) -> None:
    # Goal: ProposalDropped every time (a group that stays full) is retried after growing
    # pauses up to RESYNC_PAUSE_MAX_S, not every SETTLE_POLL_S.
    registry = FakeRegistry()
    runtime = registry.add(100)
    runtime.refuse = ProposalDropped("the group is full")
    source = FakeSource({0: _log(3)})
    pulls = _pulls(registry, 1)
    task = asyncio.create_task(pulls._pull(GroupId(100), "dr", source, "orders", 0))  # type: ignore[arg-type]
    try:
        # The state is `running` while a retry's proposal is in flight and `resyncing` in
        # the pause after its refusal: wait for the pause (reading it at once flaked under load).
        await _until(lambda: len(runtime.proposals) >= 10 and pulls.status[GroupId(100)].state == "resyncing",
                     "10 proposals, then a pause after a refusal")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert max(pauses) > 4 * SETTLE_POLL_S and max(pauses) <= RESYNC_PAUSE_MAX_S
    assert min(pauses[-3:]) >= RESYNC_PAUSE_MAX_S / 2  # at the bound, half of it fixed


async def test_leadership_is_checked_again_between_the_skips_and_the_data(pauses: list[float]) -> None:
    # Goal: when the term moves while the skips' META entry is proposed, the chunk's data
    # is not proposed in the new term (the docs promise a check before each proposal).
    registry = FakeRegistry()
    runtime = registry.add(100)
    source = FakeSource({0: _log(3)}, skipped=((2, 2),))

    def lose_leadership() -> None:
        runtime.core.term += 1
        registry.leaders.clear()

    runtime.on_meta = lose_leadership
    pulls = _pulls(registry, 1)
    async with asyncio.timeout(5):
        await pulls._pull(GroupId(100), "dr", source, "orders", 0)  # type: ignore[arg-type]
    assert [kind for kind, _ in runtime.proposals] == [EntryKind.META]
    assert runtime.machine.state.next_offset == 0


def _data(runtime: FakeRuntime) -> list[bytes]:
    return [p for kind, payloads in runtime.proposals if kind is EntryKind.DATA for p in payloads]


@pytest.mark.parametrize("proposals_max, chunks_of_bytes, in_flight", [
    pytest.param(4, 8, 4, id="proposals bound"),
    pytest.param(8, 3, 3, id="bytes bound"),
])
async def test_chunks_are_pipelined_up_to_the_bounds(proposals_max: int, chunks_of_bytes: int,
                                                     in_flight: int) -> None:
    # Goal: the pull proposes the next chunks while earlier ones are not applied, up to
    # the window's bounds and no further (the bytes bound counts a chunk to come at its
    # largest), and its status shows them in flight, with the limits, in the shape the
    # OpenAPI document gives a link's status; released, everything is copied in order.
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's validator (the fuzz pass's)
    registry = FakeRegistry()
    runtime = registry.add(100)
    runtime.gate = asyncio.Event()
    log = _log(20)
    chunk = 2 * max(len(data) for _, data in log)  # the fake source answers two batches a read
    bounds = PipelineBounds(proposals_max, chunks_of_bytes * chunk, chunk)
    source = FakeSource({0: log})
    pulls = _pulls(registry, 1, bounds)
    task = asyncio.create_task(pulls._pull(GroupId(100), "dr", source, "orders", 0))  # type: ignore[arg-type]
    try:
        await _until(lambda: runtime.waiting == in_flight, f"{in_flight} proposals in flight")
        await _real_sleep(0.05)
        assert runtime.waiting == in_flight and len(_data(runtime)) == 2 * in_flight
        assert pulls.status[GroupId(100)].position == 0  # nothing applied yet
        view = pulls.status[GroupId(100)].view()
        assert view["in_flight"] == {"chunks": in_flight, "bytes": sum(len(d) for _, d in log[:2 * in_flight]),
                                     "chunks_max": proposals_max, "bytes_max": chunks_of_bytes * chunk}
        jsonschema_rs.Draft202012Validator(_PULL_SCHEMA).validate({**view, "node": 1, "last_verify": None})
        runtime.gate.set()
        await _until(lambda: pulls.status[GroupId(100)].position == 40, "everything applied")
        assert pulls.status[GroupId(100)].view()["in_flight"]["chunks"] == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert _data(runtime) == [data for _, data in log]
    assert pulls.status[GroupId(100)].records_copied == 40


async def test_a_dropped_chunk_refuses_the_later_ones_and_the_pull_resumes_exactly(pauses: list[float]) -> None:
    # Goal: chunk k dropped before its append (the group full) while k+1.. are queued:
    # the guard refuses them (nothing appended after the hole), the pull settles and
    # starts again from the log's end; the copy is the source's batches, each once.
    registry = FakeRegistry()
    runtime = registry.add(100)
    runtime.drop_once = {8}
    log = _log(20)
    source = FakeSource({0: log})
    pulls = _pulls(registry, 1, PipelineBounds(4, 4 * 1024, 1024))
    task = asyncio.create_task(pulls._pull(GroupId(100), "dr", source, "orders", 0))  # type: ignore[arg-type]
    try:
        await _until(lambda: runtime.machine.state.next_offset == 40, "everything copied")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert _data(runtime) == [data for _, data in log]
    assert pulls.status[GroupId(100)].resyncs == 0 and pauses  # it resynced once, then copied on


async def test_the_pull_tests_run_without_the_schema_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: only the test that checks a status against the OpenAPI document needs
    # jsonschema_rs (an optional package, schemathesis's); without it this module still
    # imports, so its other pull tests run rather than skip with it.
    monkeypatch.setitem(sys.modules, "jsonschema_rs", None)  # `import jsonschema_rs` fails
    monkeypatch.delitem(sys.modules, __name__)  # imported afresh below; put back after the test
    try:
        importlib.import_module(__name__)
    except pytest.skip.Exception as skipped:
        pytest.fail(f"the whole module skips without jsonschema_rs: {skipped}")
