"""The real-time path of mirrors: each mirror partition's sink leader pulls from the source.

Riak's real-time replication queue, on a log (docs/mirror.md): the source keeps no
queue per sink, since its log is the queue; the sink's partition leader reads the
source's committed batches from its position and appends them, byte for byte,
through its own Raft group. The position is the partition's own next offset
(`PartitionState.next_offset`): replicated state of the same group, moved only by
the appends themselves, so it never goes back and a new leader resumes exactly
where the committed log ends.

Exactly once, across leader changes, by three rules:
- a pull starts (and starts again after any failure) only on a leader that has
  applied its whole log, its own term's NOOP included: nothing of an earlier leader
  or of an earlier attempt of its own is still in flight, so the applied next
  offset is the log's end;
- each proposal (a chunk of whole batches, never refused in part, and the META entry
  of its skips) carries the offset it starts at and is appended only in the pull's
  term where the log ends at that offset, a compare-and-append decided on the group's
  task (mirror_append.py): so several may be in flight (mirror_window.py), and a
  failed one makes every later one fail instead of leaving it after a hole;
- before each proposal the leader checks it still leads in the same term.

Bounds: per partition at most `PROPOSALS_IN_FLIGHT_MAX` proposals and
`BYTES_IN_FLIGHT_MAX` bytes in flight, chunks of `CHUNK_BYTES` (mirror_window.py);
at most `PULLS_MAX` source reads in flight per node (`ReadSlots`): every mirror
partition this node leads has its pull, and a pull holds a slot only for one read, so
all of them are copied in turn, a freed slot going to high priority links first (then normal, then low); a
source that fails is retried after `backoff_s` (jittered, up to 30 s); an answer
with nothing to copy that came back before its long poll ended (a source that
ignores `wait_ms`, or sends only batches before the position) and a resync (a
proposal refused, leadership moved) are followed by jittered pauses growing to
`IDLE_PAUSE_MAX_S` and `RESYNC_PAUSE_MAX_S`, so no loop spins; a long poll at the
source waits at most `LONG_POLL_MS`, and the source holds nothing for a sink between
calls, so a stalled sink costs the source nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import random
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.metadata.features import FeatureLevel, supports
from multiraft.metadata.mirror_commands import LinkState, MirrorLink
from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node.mirror_append import LogPoint, LogTail, MirrorAppend, applied_point
from multiraft.node.mirror_filter import READ_SHARE
from multiraft.node.mirror_runs import contiguous, filter_from, pieces, starting_at
from multiraft.node.mirror_source import (
    Diverged,
    SourceClient,
    SourceError,
    backoff_s,
    source_client,
)
from multiraft.node.mirror_truncated import Proposer, TruncatedResyncs, Truncation
from multiraft.node.mirror_window import InFlight, PipelineBounds, Window
from multiraft.runtime.supervision import watch
from multiraft.state.mirror_meta import MirrorPromote, MirrorSkips, encode_mirror_meta
from raftlog.errors import ClientError
from raftlog.messages import EntryKind
from raftlog.types import GroupId
from storage.batch import is_gap

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime

PULLS_MAX = 32  # source reads one node has in flight at once (its partitions take turns)
PIPELINE = PipelineBounds()  # every pull's window on this node (mirror_window.py)
LONG_POLL_MS = 500
SCAN_INTERVAL_S = 0.2
SETTLE_POLL_S = 0.05
# Pauses (equal jitter, doubling from the first to the max) after an early answer with
# nothing to copy, and after a resync: a source that ignores the long poll, or a
# proposal refused again and again (ProposalDropped while the group is full), would
# otherwise make the loop ask the source as fast as it answers. The idle pause's first
# steps are below the long poll, so a source that answers early now and then costs
# little latency; its max is two long polls.
IDLE_PAUSE_FIRST_S = 0.05
IDLE_PAUSE_MAX_S = 1.0
RESYNC_PAUSE_MAX_S = 2.0
# A gap batch (a filtered mirror's) read through an unfiltered link: copied byte for byte, it
# would stall the sink's followers of a build from before gap batches (they refuse it).
GAPS_BELOW_LEVEL = ("the source holds gap batches (it is a filtered mirror): this sink copies them only once "
                    "finalized at feature level 3 (mirror_filter; docs/node.md \"Upgrading\")")
READ_INDEX_WAIT_S = 5.0  # a leader confirming it still leads before a truncated resync (else it settles again)


@dataclass(slots=True)
class PullStatus:
    """What one mirror partition's pull is doing, on the node that leads it."""

    link: str
    topic: str
    partition: int
    state: str = "starting"  # running, backing_off, paused, source_truncated, diverged, resyncing
    position: int = 0
    source_high_watermark: int | None = None
    source_log_start_offset: int | None = None
    bytes_copied: int = 0
    records_copied: int = 0
    batches_copied: int = 0
    failures: int = 0
    last_error: str | None = None
    resyncs: int = 0  # resyncs since a chunk was last appended (the pause grows with them)
    empty_reads: int = 0  # early answers with nothing to copy in a row (the pause grows with them)
    bounds: PipelineBounds = PIPELINE  # the window's limits on this node
    window: Window | None = None  # the copy's chunks proposed and not yet applied (None between copies)

    @property
    def lag_records(self) -> int | None:
        if self.source_high_watermark is None:
            return None
        return max(0, self.source_high_watermark - self.position)

    def view(self) -> dict[str, Any]:
        return {"link": self.link, "topic": self.topic, "partition": self.partition, "state": self.state,
                "position": self.position, "source_high_watermark": self.source_high_watermark,
                "source_log_start_offset": self.source_log_start_offset, "lag_records": self.lag_records,
                "bytes_copied": self.bytes_copied, "records_copied": self.records_copied,
                "failures": self.failures, "last_error": self.last_error, "in_flight": self.in_flight()}

    def in_flight(self) -> dict[str, int]:
        """Chunks (and their bytes) proposed and not yet applied, and the window's limits."""
        window = self.window
        return {"chunks": len(window.chunks) if window is not None else 0,
                "bytes": window.bytes_in_flight if window is not None else 0,
                "chunks_max": self.bounds.proposals_max, "bytes_max": self.bounds.bytes_max}


class _Resync(Exception):
    """The leader's view moved (leadership, state): settle again before the next chunk."""


class ReadSlots:
    """At most `count` source reads in flight on this node. A freed slot goes to the
    waiter of the best rank (lower first: high priority links), first come first served
    within one rank, so partitions of one priority take turns."""

    def __init__(self, count: int) -> None:
        assert count >= 1
        self._free = count
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # heap; cancelled ones skipped
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def held(self, rank: int) -> AsyncIterator[None]:
        await self._acquire(rank)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, rank: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._arrivals), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted, then cancelled: pass it on
                self._release()
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot passes to it (the free count stays)
                return
        self._free += 1


class MirrorPulls:
    """The pulls of the mirror partitions this node leads (one supervised loop owns them all)."""

    def __init__(self, registry: GroupRegistry, catalog: CatalogHolder, logger: Any,
                 rng: random.Random | None = None, bounds: PipelineBounds | None = None,
                 local_host: str | None = None,
                 chunk_filter: Callable[[list[bytes]], list[bytes]] | None = None,
                 metadata: Proposer | None = None) -> None:
        """`chunk_filter`: the chaos runner's negative control only (multiraft/node/faults.py).
        `metadata`: where a resync of a partition the source truncated past is proposed."""
        self._registry = registry
        self.bounds = bounds or PIPELINE
        self._chunk_filter = chunk_filter
        self.local_host = local_host  # the source is read from this address (SourceClient)
        self._catalog = catalog
        self._logger = logger
        self._rng = rng or random.Random()
        self.truncated = TruncatedResyncs(catalog, metadata, logger, self._rng)
        self._tasks: dict[GroupId, asyncio.Task[None]] = {}
        self._promotions: dict[GroupId, asyncio.Task[None]] = {}
        self._clients: dict[str, tuple[MirrorLink, SourceClient]] = {}
        self._slots = ReadSlots(PULLS_MAX)
        self.status: dict[GroupId, PullStatus] = {}

    async def run(self) -> None:
        try:
            while True:
                await self.scan()
                await asyncio.sleep(SCAN_INTERVAL_S)
        finally:
            await self.stop()

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._promotions.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._promotions.clear()
        for _, client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def scan(self) -> None:
        """Start the pulls this node should run, stop the others, finish promotions."""
        catalog = self._catalog.catalog
        wanted: list[tuple[int, GroupId, MirrorLink, str, int]] = []
        promoting: list[GroupId] = []
        for topic in catalog.topics.values():
            if topic.mirror_link is None:
                continue
            link = catalog.mirror_links.get(topic.mirror_link)
            for p in topic.partitions:
                machine = self._registry.partitions.get(p.group_id)
                if self._registry.leading(p.group_id) is None or machine is None or not machine.state.mirror:
                    continue
                if not topic.is_mirror:
                    promoting.append(p.group_id)
                elif link is not None and link.state is LinkState.RUNNING:
                    wanted.append((link.priority.rank, p.group_id, link, topic.name, p.partition))
                elif link is not None:
                    self._status(p.group_id, link.name, topic.name, p.partition).state = "paused"
        # Every wanted partition is pulled (a pull holds a read slot only while it reads:
        # ReadSlots); a bound here would leave the partitions past it never copied.
        wanted.sort(key=lambda w: (w[0], w[1]))
        keep = {w[1]: w for w in wanted}
        stopping = [task for group_id, task in self._tasks.items() if group_id not in keep]
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        self._tasks = {g: t for g, t in self._tasks.items() if g in keep and not t.done()}
        for group_id, (rank, _, link, topic_name, partition) in keep.items():
            if group_id not in self._tasks:
                client = self._client(link)
                matcher = RecordMatcher.of(link.record_filter) if link.record_filter is not None else None
                task = asyncio.create_task(self._pull(group_id, link.name, client, topic_name, partition, rank,
                                                      matcher))
                self._tasks[group_id] = watch(task, f"mirror-pull-{group_id}", self._logger)
        for group_id in promoting:
            if group_id not in self._tasks and group_id not in self._promotions:
                task = asyncio.create_task(self._promote(group_id))
                task.add_done_callback(lambda _, g=group_id: self._promotions.pop(g, None))
                self._promotions[group_id] = watch(task, f"mirror-promote-{group_id}", self._logger)
        self._forget(catalog.mirror_links, set(keep))

    def _forget(self, links: dict[str, MirrorLink], kept: set[GroupId]) -> None:
        """Drop the status of partitions no longer pulled here (after a while: a paused one
        stays shown) and close the clients of links gone or reading their source otherwise
        (a link's state or policy changed keeps its client: its running pulls use it)."""
        for group_id in [g for g, s in self.status.items() if g not in kept and s.state != "paused"]:
            del self.status[group_id]
        for name in [n for n, (link, _) in self._clients.items() if n not in links or not links[n].reads_like(link)]:
            _, client = self._clients.pop(name)
            watch(asyncio.create_task(client.close()), "mirror-client-close", self._logger)

    def _client(self, link: MirrorLink) -> SourceClient:
        held = self._clients.get(link.name)
        if held is None or not held[0].reads_like(link):
            held = (link, source_client(link, self._rng, self.local_host))
            self._clients[link.name] = held
        return held[1]

    def _status(self, group_id: GroupId, link: str, topic: str, partition: int) -> PullStatus:
        status = self.status.get(group_id)
        if status is None or (status.link, status.topic) != (link, topic):
            status = self.status[group_id] = PullStatus(link, topic, partition, bounds=self.bounds)
        return status

    # ---- one partition ------------------------------------------------------------

    def _settled(self, runtime: GroupRuntime, group_id: GroupId) -> int | None:
        """The position to pull from, once this leader applied its whole log (its own
        term's NOOP included), else None."""
        core = runtime.core
        machine = self._registry.partitions.get(group_id)
        if self._registry.leading(group_id) is not runtime or machine is None or not machine.state.mirror:
            return None
        if core.log.term_or_none(core.commit_index) != core.term or core.applied_index < core.log.last_index():
            return None
        return int(machine.state.next_offset)

    async def _pull(self, group_id: GroupId, link: str, client: SourceClient, topic: str, partition: int,
                    rank: int = 1, matcher: RecordMatcher | None = None) -> None:
        """`matcher`: the link's record filter (fixed with the link), None: copy everything."""
        status = self._status(group_id, link, topic, partition)
        while True:
            runtime = self._registry.leading(group_id)
            if runtime is None:
                return
            position = self._settled(runtime, group_id)
            if position is None:
                status.state = "resyncing"
                await asyncio.sleep(SETTLE_POLL_S)
                continue
            status.position = position
            try:
                await self._copy(runtime, group_id, client, status, rank, matcher)
            except SourceError as error:
                status.failures += 1
                status.state = "diverged" if isinstance(error, Diverged) else "backing_off"
                status.last_error = client.scrub(str(error))
                await asyncio.sleep(backoff_s(status.failures, self._rng))
            except (_Resync, ClientError) as error:  # leadership moved, a proposal dropped: settle again
                status.state = "resyncing"
                if isinstance(error, ClientError):
                    status.last_error = client.scrub(f"{error.code}: {error.message}")
                status.resyncs += 1
                await asyncio.sleep(backoff_s(status.resyncs, self._rng, SETTLE_POLL_S, RESYNC_PAUSE_MAX_S))

    async def _copy(self, runtime: GroupRuntime, group_id: GroupId, client: SourceClient, status: PullStatus,
                    rank: int, matcher: RecordMatcher | None = None) -> None:
        """Copy chunks from `status.position` on, up to the window's bounds in flight (the next
        read overlapping the earlier chunks' commits), until a failure."""
        term = runtime.core.term
        self.truncated.forget_sighting(group_id)  # a truncation seen by an earlier run confirms nothing now
        window = status.window = self.bounds.window(status.position)
        tail = LogTail()
        proposals: deque[asyncio.Future[Any]] = deque()
        clock = asyncio.get_running_loop().time
        # A filtered chunk may outgrow what was read (mirror_filter.py): read a share of a chunk.
        read_bytes = window.chunk_bytes_max if matcher is None else max(1, window.chunk_bytes_max // READ_SHARE)
        try:
            while True:
                await self._take_applied(window, proposals, status, everything=False)
                if proposals and window.read_position >= (status.source_high_watermark or 0):
                    # Caught up with the source as last seen: let what is in flight apply
                    # (and the position show it) before a long poll holds this loop.
                    await self._take_applied(window, proposals, status, everything=True)
                position = window.read_position
                async with self._slots.held(rank):
                    asked = clock()
                    chunk = await client.read_log(status.topic, status.partition, position, read_bytes, LONG_POLL_MS)
                    answered_early = clock() - asked < LONG_POLL_MS / 2000
                status.source_high_watermark, status.source_log_start_offset = (chunk.high_watermark,
                                                                                chunk.log_start_offset)
                if chunk.log_start_offset > position:  # the link's on_source_truncated decides (mirror_truncated.py)
                    # Only while this node still leads in the pull's term: an answer that came back
                    # after leadership moved decides nothing (another leader may have copied past
                    # `position` meanwhile); a resync confirms it again just before it is proposed.
                    self._check_leading(runtime, group_id, term)
                    status.state = "source_truncated"
                    pause_s, status.last_error = await self.truncated.on_truncated(
                        Truncation(status.link, status.topic, status.partition, group_id, position,
                                   chunk.log_start_offset, term),
                        client, functools.partial(self._still_behind, runtime, group_id, term))
                    await asyncio.sleep(pause_s)
                    continue
                self.truncated.forget_sighting(group_id)
                # A filtered mirror's position may lie inside a source batch (mirror_runs.py).
                payloads, first, end = contiguous(chunk.batches, position, inside=matcher is not None)
                skipped = chunk.skipped
                if matcher is not None and payloads:  # the source's skipped batches become gaps too
                    outputs = await asyncio.to_thread(filter_from, matcher, payloads, first, position, skipped)
                    payloads, skipped = starting_at(outputs, position), ()
                elif any(is_gap(p) for p in payloads) and not supports(self._catalog.catalog,
                                                                       FeatureLevel.MIRROR_FILTER):
                    raise SourceError(GAPS_BELOW_LEVEL)
                if self._chunk_filter is not None:
                    payloads = self._chunk_filter(payloads)
                self._check_leading(runtime, group_id, term)
                status.state, status.failures = "running", 0
                if not payloads:
                    if answered_early:  # a source ignoring the long poll, or only batches before the position
                        status.empty_reads += 1
                        await asyncio.sleep(backoff_s(status.empty_reads, self._rng, IDLE_PAUSE_FIRST_S,
                                                      IDLE_PAUSE_MAX_S))
                    continue
                status.empty_reads = 0
                skips = tuple(r for r in skipped if position <= r[0] < end)
                # A filtered chunk goes as proposals of bounded entries and bytes (mirror_runs.py).
                parts = [(position, end, payloads)] if matcher is None else pieces(payloads, position,
                                                                                   window.chunk_bytes_max)
                for start, stop, part in parts:
                    if start != position:  # room in the window for it, and still leading
                        await self._take_applied(window, proposals, status, everything=False)
                        self._check_leading(runtime, group_id, term)
                    proposals.append(self._propose_chunk(runtime, group_id, term, tail, start, stop, part, skips))
                    window.add(InFlight(start, stop, sum(len(p) for p in part), len(part)))
        finally:
            status.window = None  # what it held is no longer this pull's: the caller settles first
            for proposal in proposals:  # their entries, if appended, still commit
                proposal.cancel()
            await asyncio.gather(*proposals, return_exceptions=True)

    def _propose_chunk(self, runtime: GroupRuntime, group_id: GroupId, term: int, tail: LogTail, start: int,
                       end: int, payloads: list[bytes], skips: tuple[tuple[int, int], ...]) -> asyncio.Future[Any]:
        """Propose a chunk (after the META entry of its skips, if any), each guarded to append
        only in `term` where the log ends at `start`; the future of their apply results. The
        proposals are queued to the group in the order made (tasks start first in, first
        out); were they not, the guard would refuse the one out of place."""
        def applied() -> LogPoint | None:
            return applied_point(self._registry.partitions.get(group_id))

        steps = []
        meta_guard = None
        if skips:
            meta_guard = MirrorAppend(applied, tail, term, start, 0)
            steps.append(asyncio.ensure_future(runtime.propose(
                [encode_mirror_meta(MirrorSkips(skips))], EntryKind.META, guard=meta_guard)))
        steps.append(asyncio.ensure_future(runtime.propose(
            payloads, EntryKind.DATA, guard=MirrorAppend(applied, tail, term, start, end - start, meta_guard))))
        return asyncio.gather(*steps)

    async def _take_applied(self, window: Window, proposals: deque[asyncio.Future[Any]], status: PullStatus, *,
                            everything: bool) -> None:
        """Take the outcomes of the oldest proposals: those done, then as many as the window
        needs for room (all, if `everything`). A failed one raises: the caller settles."""
        while proposals and (everything or proposals[0].done() or not window.has_room()):
            results = (await proposals[0])[-1]  # the DATA proposal's apply results
            proposals.popleft()
            chunk = window.applied()
            # The guard appended the chunk where the log ended at its start: its offsets are the source's.
            assert results[0].stored_base_offset == chunk.start, (results[0], chunk)
            status.resyncs = 0
            status.bytes_copied += chunk.size_bytes
            status.records_copied += chunk.end - chunk.start
            status.batches_copied += chunk.batches
            status.position = window.committed

    def _check_leading(self, runtime: GroupRuntime, group_id: GroupId, term: int) -> None:
        """Raise `_Resync` unless this node still leads the mirror partition in `term`
        (checked before each proposal; the guard checks again at the append)."""
        machine = self._registry.partitions.get(group_id)
        if (runtime.core.term != term or self._registry.leading(group_id) is not runtime
                or machine is None or not machine.state.mirror):
            raise _Resync()

    async def _still_behind(self, runtime: GroupRuntime, group_id: GroupId, term: int, start: int) -> int:
        """Just before a whole resync is proposed: confirm that this node still leads the
        partition in `term` (a ReadIndex on its group: a round of heartbeats, then its state
        applied that far) and that the partition's applied position is still below `start`, the
        source's log start; that position. Else `_Resync` (the pull settles again): the decision
        was taken on a stale view, and another leader may have copied past it."""
        self._check_leading(runtime, group_id, term)
        try:
            async with asyncio.timeout(READ_INDEX_WAIT_S):
                await runtime.read_index()
        except (TimeoutError, ClientError):
            raise _Resync() from None
        self._check_leading(runtime, group_id, term)
        position = int(self._registry.partitions[group_id].state.next_offset)
        if position >= start:
            raise _Resync()
        return position

    async def _promote(self, group_id: GroupId) -> None:
        """End a promoted topic's partition's mirror mode (the catalog says promoted)."""
        runtime = self._registry.leading(group_id)
        if runtime is None or self._settled(runtime, group_id) is None:
            return  # the next scan tries again
        try:
            await runtime.propose([encode_mirror_meta(MirrorPromote())], EntryKind.META)
        except ClientError as error:
            self._logger.info("mirror_promote_retry", group_id=group_id, error=error.code)
        self.status.pop(group_id, None)

