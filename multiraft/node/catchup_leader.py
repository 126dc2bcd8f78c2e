"""Far-horizon catch-up, the leader's side (Rama's far horizon; DESIGN.md sections 4, 15).

A follower far behind (a restart after a long outage, a wiped disk, a new copy after a
move) used to catch up one append at a time: every entry read, framed, sent, checked,
written and acknowledged through both Raft loops. Closed segments are immutable and
byte-identical on every replica that holds them, so they can travel whole instead:

- Every ROUND_S (PROBING_ROUND_S while a follower is probed) this node looks at the
  partitions it leads that are awake (a quiet group's followers are caught up) for a
  follower that replicates normally and is at
  least `far_catchup_lag_entries` entries behind, or lacks at least
  `far_catchup_lag_bytes` of closed segments. `far_target` picks the end of the newest
  closed segment the leader has committed: the install's end.
- The core holds that follower (`RaftCore.hold_for_install`: no appends meanwhile) and
  the follower is offered the start point and the closed segments up to that end
  (catchup_wire.py). It fetches the files it lacks (multiraft/node/catchup_follower.py),
  by the stream or by chunks (below), each part keeping the hold alive, installs them and says
  `catchup.done`; the core then probes it past the install, and what is left (the
  entries after the last closed segment) is replayed: near horizon. A follower still
  far behind then (a busy leader rolled more segments meanwhile) gets another round,
  with only the files written since.
- Chunks to a learner (a copy being made by a move) take the move throttle's bytes
  (move_throttle.py), as its appends do; chunks to a voter do not, as its appends do
  not: they are the quorum's own.
- The files go by a side connection of their own (catchup_stream.py: os.sendfile, the
  follower checking frames as they arrive) when the transport offers one (no TLS between
  peers) and it has not failed to that follower lately (NO_STREAM_S); else, or when the
  follower cannot take one, by `catchup.chunk` calls as before. A stream offer does not
  wait for the files' CRCs: each is computed while its file goes and sent after it.
- Bounded: TRANSFERS_MAX at once from this node; a transfer whose follower asks for
  nothing for IDLE_S ends as failed (the follower probes as usual); an offer the follower
  cannot take yet (its replica not open yet, installs under way) is made again,
  OFFER_ATTEMPTS times at most. A transfer ends at once when the core no longer holds
  the follower (the hold timed out, leadership moved): no chunk is served past that,
  as appends may be on their way to it again. After a refused, idle or failed transfer
  that follower is left to replay for BACKOFF_S.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest
from multiraft.node.catchup_stream import ACCEPT_S, StreamSender, StreamThreads, settle
from multiraft.node.catchup_wire import CHUNK_BYTES_MAX, Offer, encode_offer, natural, request
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, RpcError, answer
from multiraft.transport.side_channel import SideChannel
from raftlog.core.progress import Progress, ProgressState
from raftlog.errors import NotLeader
from raftlog.types import GroupId, Index, NodeId
from storage import checkpoints
from storage.far_receive import CRC_UNKNOWN
from storage.node_state import StartPoint, encode_start
from storage.transfer import (
    SegmentDescriptor,
    descriptor_crc,
    file_crc,
    list_closed_segments,
    read_segment_chunk,
)

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

ROUND_S = 0.25
# While a follower that answers is probed (a node back from a restart: its probe may find
# it far behind), rounds come this often: files start up to 0.25 s sooner, and replay is
# held meanwhile by the core's far wait only (three ROUND_S). A full round walks every
# awake group this node leads (thousands: milliseconds); a fast round between two full
# ones visits only the groups the last full round found probing a follower.
PROBING_ROUND_S = 0.05
TRANSFERS_MAX = 4
IDLE_S = 30.0
OFFER_RETRY_S = 0.2
# Past a failed stream's follower giving up its listener (ACCEPT_S: "installs under way"
# until then), with 2 s to spare: 12 s.
OFFER_ATTEMPTS = int((ACCEPT_S + 2.0) / OFFER_RETRY_S)
FINISH_WAIT_S = 1.0  # at most this long a round waits for the core to end the last hold (below)
BACKOFF_S = 10.0  # after a refused, idle or failed transfer, that follower replays for a while
NO_STREAM_S = 300.0  # after a stream to a follower failed, its files go by chunks this long


def far_target(progress: Progress, last: Index, committed: Index, start_index: Index,
               closed: list[tuple[Index, Index, int]], lag_entries: int, lag_bytes: int) -> Index | None:
    """Where a far-horizon install for this follower would end, or None for replay.

    `closed`: the leader's closed segments (first, last index, bytes), oldest first. Only
    a follower that replicates normally (its match known, answering), and only files the
    leader committed that start right after its start point (files a follower can take
    as they are). Far means at least `lag_entries` entries behind, or at least
    `lag_bytes` in the whole files it would take (a log of large batches is far in bytes
    long before it is in entries); 0 turns either off.
    """
    if progress.state is not ProgressState.REPLICATE or not progress.recent_active:
        return None
    if not closed or closed[0][0] != start_index + 1:
        return None
    taken = [(first, end, size) for first, end, size in closed if end <= committed and first > progress.match]
    if not taken:
        return None
    far_in_entries = 0 < lag_entries <= last - progress.match and taken[-1][1] - progress.match >= lag_entries // 2
    far_in_bytes = 0 < lag_bytes <= sum(size for _, _, size in taken)
    return taken[-1][1] if far_in_entries or far_in_bytes else None


@dataclass(slots=True)
class Transfer:
    upto: Index
    learner: bool
    deadline: float
    number: int  # names it in the follower's chunks and done (catchup_wire.py)
    stream: bool = False  # its files go by a side connection (catchup_stream.py)
    dialled: bool = False  # its stream began (counted in "streams"; only then in "streams_failed")


class CatchUpLeader:
    def __init__(self, registry: GroupRegistry, rpc: Rpc, lag: tuple[int, int], acquire: Callable[[int], Awaitable[None]],
                 is_live: Callable[[int], bool], start_task: Callable[[Any, str], None], logger: Any,
                 side: SideChannel | None = None) -> None:
        """`lag`: far behind in entries, in bytes (far_target); `acquire(size)`: wait for `size` bytes of the move throttle (chunks to learners);
        `is_live(node)`: the node is heard from (an offer to a silent one would only fail);
        `start_task(coroutine, name)`: the node's, which owns and watches what it starts;
        `side`: the transport's side connections (None: files by chunks only)."""
        self._registry = registry
        self._is_live = is_live
        self._start_task = start_task
        self._rpc = rpc
        self._lag = lag
        self._acquire = acquire
        self._logger = logger
        self._active: dict[tuple[GroupId, NodeId], Transfer] = {}
        self._backoff: dict[tuple[GroupId, NodeId], float] = {}  # -> when it may be held again
        # A transfer's end reaches the core through its inbox (call_core), later than this
        # task sees it; a hold made meanwhile would be the one that end releases. Until the
        # core ran it (or FINISH_WAIT_S, should the inbox have shed it), no new hold.
        self._finishing: dict[tuple[GroupId, NodeId], tuple[Any, float]] = {}  # -> (runtime, until)
        self._numbers = itertools.count(1)
        self._side = side
        self._no_stream: dict[NodeId, float] = {}  # -> until when its files go by chunks
        self._threads = StreamThreads(2 * TRANSFERS_MAX, "far-stream-send")  # sendfile and a CRC each
        self._probing: list[GroupId] = []  # the groups the last full round found probing a live follower
        self.counts = {"started": 0, "installed": 0, "failed": 0, "bytes_sent": 0, "streams": 0,
                       "streams_failed": 0}

    def close(self) -> None:
        self._threads.close()

    def serve(self, rpc: Rpc) -> None:
        async def chunk(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._chunk(NodeId(source), body), bytes)

        async def done(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._done(NodeId(source), body), lambda value: b"{}")

        rpc.register("catchup.chunk", chunk)
        rpc.register("catchup.done", done)

    async def run(self) -> None:
        soon, full_at = False, 0.0
        while True:
            await asyncio.sleep(min(PROBING_ROUND_S, ROUND_S) if soon else ROUND_S)
            full = not soon or time.monotonic() - full_at >= ROUND_S
            if full:
                full_at = time.monotonic()
            soon = self.round(full)

    def round(self, full: bool = True) -> bool:
        """Start a transfer for each follower far behind (at most TRANSFERS_MAX at once).
        True when a follower that answers is being probed: it may be far behind once the
        probe succeeds (a node back from a restart), and the next round comes sooner.
        Not `full`: only the groups the last full round found probing."""
        if not any(self._lag):
            return False
        registry = self._registry
        groups = registry.awake if full else self._probing
        probing: list[GroupId] = []
        for group_id in [g for g in groups if g in registry.led and g in registry.partitions and g in registry.awake]:
            if self._round_group(group_id):
                probing.append(group_id)
            if len(self._active) >= TRANSFERS_MAX:
                break
        if full:
            self._probing = probing
        return bool(probing)

    def _round_group(self, group_id: GroupId) -> bool:
        """One group's followers (round); True when one that answers is probed."""
        registry = self._registry
        soon = False
        runtime, store = registry.groups[group_id], registry.stores[group_id]
        core = runtime.core
        closed: list[tuple[Index, Index, int]] | None = None  # listed once a follower needs it
        for node in sorted(core.membership.voters | core.membership.learners):
            if len(self._active) >= TRANSFERS_MAX:
                break
            progress = core.progress(node)
            if node == core.id or progress is None or not self._is_live(node):
                continue
            if self._ending((group_id, node), runtime):
                continue
            if (group_id, node) in self._active:
                if self._holding((group_id, node), runtime):
                    continue
                self._finish((group_id, node), ok=False, backoff=False)  # ended by a probe: anew
                continue  # held again only once the core ran that end (_ending), in a later round
            if progress.state is not ProgressState.REPLICATE:
                soon = soon or (progress.state is ProgressState.PROBE and progress.recent_active)
                continue  # far_target's first test, before the segments are listed
            upto = None
            if self._backoff.get((group_id, node), 0.0) <= time.monotonic():
                if closed is None:
                    closed = [(s.first_index, s.last_index, s.size) for s in store.segments if s.closed]
                upto = far_target(progress, core.log.last_index(), core.commit_index,
                                  Index(store.first_index() - 1), closed, *self._lag)
            if upto is not None and core.hold_for_install(node, upto):
                learner = node in core.membership.learners
                transfer = Transfer(upto, learner, time.monotonic() + IDLE_S, next(self._numbers))
                self._active[(group_id, node)] = transfer
                self._start_task(self._offer(group_id, node, upto, store, transfer.number), "far-catchup-offer")
            elif progress.far_wait and node in core.membership.learners:  # Config.far_wait_learners:
                runtime.call_core(lambda raft, node=node: raft.end_far_wait(node))  # no install, replay now
        return soon

    async def _offer(self, group_id: GroupId, node: NodeId, upto: Index, store: SegmentStore, number: int) -> None:
        key = (group_id, node)
        try:
            await self._transfer(key, upto, store, number)
        finally:  # whatever ended it (an answer, a timeout, an error, leadership lost); the
            transfer = self._active.get(key)  # follower's refusals set their backoff
            if transfer is not None and transfer.number == number:
                self._finish(key, ok=False, backoff=False)

    async def _transfer(self, key: tuple[GroupId, NodeId], upto: Index, store: SegmentStore, number: int) -> None:
        group_id, node = key
        runtime = self._registry.leading(group_id)
        transfer = self._active.get(key)
        if runtime is None or transfer is None or transfer.number != number:
            return
        transfer.stream = self._side is not None and self._no_stream.get(node, 0.0) <= time.monotonic()
        log = self._logger.bind(group_id=group_id, follower=node, upto=upto)
        reply, segments = await self._make_offer(key, runtime, store, transfer)
        if isinstance(reply, dict) and reply.get("stream_refused") is True and transfer.stream:
            log.info("far_stream_fallback", reason=str(reply.get("reason")))  # offered again, by chunks
            self._no_stream[node] = time.monotonic() + NO_STREAM_S
            transfer.stream = False
            reply, segments = await self._make_offer(key, runtime, store, transfer)
        if not isinstance(reply, dict) or reply.get("accepted") is not True:
            if reply is not None:
                log.info("far_catchup_refused", reason=str(reply.get("reason") if isinstance(reply, dict) else reply))
                self._backoff[key] = time.monotonic() + BACKOFF_S  # replay meanwhile
            return
        self.counts["started"] += 1
        log.info("far_catchup_started", files=len(segments), bytes=sum(d.size_bytes for d in segments),
                 stream=transfer.stream)
        sender = asyncio.ensure_future(self._stream(key, runtime, store, transfer, reply.get("stream_port"))) \
            if transfer.stream else None
        try:
            await self._watch(key, runtime, transfer, sender, log)
        finally:
            if sender is not None:
                sender.cancel()
                await settle(sender)

    async def _make_offer(self, key: tuple[GroupId, NodeId], runtime: Any, store: SegmentStore,
                          transfer: Transfer) -> tuple[dict[str, Any] | None, tuple[SegmentDescriptor, ...]]:
        """Offer the install to the follower (again while it says "try again" and the hold
        lasts); its answer (None: the hold or leadership ended meanwhile) and the files."""
        group_id, node = key
        upto = transfer.upto
        if not transfer.stream and not await self._compute_crcs(group_id, runtime, store, upto):
            return None, ()
        start = StartPoint(store.snapshot(), store.offset_after(store.snapshot().meta.index))
        segments = tuple(SegmentDescriptor(s.first_index, s.last_index, s.size,
                                           CRC_UNKNOWN if s.crc is None else s.crc, s.first_offset, s.next_offset)
                         for s in store.segments if s.closed and store.first_index() <= s.first_index
                         and s.last_index <= upto) if transfer.stream else \
            tuple(d for d in list_closed_segments(store) if d.last_index <= upto)
        captured = runtime.boundaries.captured.get(upto) if runtime.boundaries else None
        checkpoint = b"" if captured is None or not isinstance(captured.data, bytes) else \
            encode_start(checkpoints.at(store, upto, captured.data, captured.membership))
        if not self._holding(key, runtime, transfer.number):
            return None, ()
        offer = encode_offer(Offer(group_id, runtime.core.term, upto, store.term(upto), encode_start(start),
                                   segments, checkpoint, transfer.number, transfer.stream))
        for attempt in range(OFFER_ATTEMPTS):
            # A node back from a restart is heard before it opens its replicas: asked too
            # early it says "try again" (a short while: the hold keeps its appends back).
            if attempt:
                await asyncio.sleep(OFFER_RETRY_S)
                if not self._holding(key, runtime, transfer.number):
                    return None, ()
                runtime.core.install_progressing(node)
            try:
                reply = json.loads(await self._rpc.call(node, "catchup.offer", offer, RPC_TIMEOUT_S))
            except (RpcError, ValueError) as error:
                reply = {"accepted": False, "retry": True, "reason": repr(error)}
            if not isinstance(reply, dict) or reply.get("accepted") is True or reply.get("retry") is not True:
                break
            self._logger.info("far_catchup_offer_again", group_id=group_id, follower=node, reason=str(reply.get("reason")))
        return reply, segments

    async def _compute_crcs(self, group_id: GroupId, runtime: Any, store: SegmentStore, upto: Index) -> bool:
        """The files' CRCs for an offer by chunks, computed once (storage/transfer.py): on a
        thread, not on the loop (a gigabyte is a second of reading). False: leadership moved."""
        unknown = [s for s in store.segments if s.closed and s.crc is None and s.last_index <= upto]
        if unknown:  # (a file not under its name yet, as the chaos double keeps some: on the loop later)
            crcs = await asyncio.gather(*(asyncio.to_thread(file_crc, s.path) for s in unknown),
                                        return_exceptions=True)
            for segment, crc in zip(unknown, crcs, strict=True):
                if isinstance(crc, int) and segment.crc is None and not store.closed:
                    segment.crc = crc
        return self._registry.leading(group_id) is runtime

    async def _watch(self, key: tuple[GroupId, NodeId], runtime: Any, transfer: Transfer,
                     sender: asyncio.Future[None] | None, log: Any) -> None:
        """Keep the hold alive while the follower fetches, copies and checks, until its done
        (or idleness, the hold's end, a failed stream) ends the transfer."""
        node, number = key[1], transfer.number
        while (current := self._active.get(key)) is not None and current.number == number:
            if sender is not None and sender.done():
                error = None if sender.cancelled() else sender.exception()
                if isinstance(error, NotLeader):  # the hold ended, the files went: not the stream's fault
                    log.info("far_catchup_abandoned", reason=str(error))
                    return
                if error is not None:  # by chunks next time; no backoff (the follower's done may not come)
                    log.warning("far_stream_failed", error=repr(error))
                    self._stream_failed(transfer, node)
                    return
                sender = None  # all sent: the follower installs and says done
            if time.monotonic() > transfer.deadline:
                log.warning("far_catchup_idle", idle_s=IDLE_S)
                self._backoff[key] = time.monotonic() + BACKOFF_S
                return
            if not self._holding(key, runtime, number):  # not the follower's doing: no backoff
                log.info("far_catchup_abandoned", reason="the hold ended (leadership lost, timed out, a probe)")
                return
            runtime.core.install_progressing(node)  # the follower copies or checks: its hold lasts
            if sender is None:
                await asyncio.sleep(ROUND_S)
            else:
                await asyncio.wait({sender}, timeout=ROUND_S)

    async def _stream(self, key: tuple[GroupId, NodeId], runtime: Any, store: SegmentStore, transfer: Transfer,
                      port: Any) -> None:
        """Dial the follower's side listener and send the files it asks for (catchup_stream.py)."""
        group_id, node = key
        transfer.dialled = True
        self.counts["streams"] += 1
        if not isinstance(port, int) or not 0 < port < 65536 or self._side is None:
            raise InvalidRequest(f"a stream offer accepted without a port: {port!r}")
        sender = StreamSender(await self._side.dial(node, port), self._threads)
        try:
            asked_group, asked_transfer, files = await sender.asked(IDLE_S)
            if (asked_group, asked_transfer) != (group_id, transfer.number):
                raise InvalidRequest(f"a stream for transfer {asked_transfer} of group {asked_group}")
            for first_index, send in files:
                await self._stream_file(key, runtime, store, transfer, sender, Index(first_index), send)
        finally:
            await sender.close()

    async def _stream_file(self, key: tuple[GroupId, NodeId], runtime: Any, store: SegmentStore, transfer: Transfer,
                           sender: StreamSender, first_index: Index, send: bool) -> None:
        segment = next((s for s in store.segments if s.closed and s.first_index == first_index
                        and s.last_index <= transfer.upto), None)
        if segment is None or store.closed or not self._holding(key, runtime, transfer.number):
            # Compacted or closed here, or the hold ended: the transfer's end, not the stream's fault.
            raise NotLeader(0, f"no closed segment {first_index} of this transfer here any more")
        fd, size = sender.open_fd(segment.handle.fd), segment.size
        crc: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if segment.crc is not None:
            crc.set_result(segment.crc)
        else:
            crc = sender.crc_of(fd, size, descriptor_crc)  # read meanwhile: the page cache's
            crc.add_done_callback(lambda done: self._keep_crc(store, segment, done))

        async def before(part: int) -> int:
            if transfer.learner:  # a copy being made: the move throttle's bytes, as its appends
                part = min(part, CHUNK_BYTES_MAX)
                await self._acquire(part)
            if not self._holding(key, runtime, transfer.number):  # appends may go to it again
                raise NotLeader(0, "the far-horizon hold ended")
            transfer.deadline = time.monotonic() + IDLE_S
            runtime.core.install_progressing(key[1])
            self.counts["bytes_sent"] += part
            return part

        await sender.send(first_index, fd, size, send, crc, before)
        sender.close_fd(fd)  # (on a failure, the sender's close closes it once its calls ended)

    @staticmethod
    def _keep_crc(store: SegmentStore, segment: Any, done: asyncio.Future[int]) -> None:
        if not done.cancelled() and done.exception() is None and segment.crc is None and not store.closed:
            segment.crc = done.result()

    def _holding(self, key: tuple[GroupId, NodeId], runtime: Any, number: int | None = None) -> bool:
        """Whether this node still leads the group with that runtime and its core still holds
        the follower for the install of the transfer under way (the one numbered `number`,
        if given): not timed out, not ended by a probe."""
        transfer = self._active.get(key)
        if transfer is None or self._registry.leading(key[0]) is not runtime:
            return False
        if number is not None and transfer.number != number:
            return False
        progress = runtime.core.progress(key[1])
        return progress is not None and progress.state is ProgressState.INSTALL \
            and progress.install_index == transfer.upto

    async def _chunk(self, source: NodeId, body: bytes) -> bytes:
        fields = request(body)
        group_id = GroupId(natural(fields, "group_id"))
        size = natural(fields, "size")
        if not 0 < size <= CHUNK_BYTES_MAX:
            raise InvalidRequest(f"size: 1 to {CHUNK_BYTES_MAX}")
        transfer = self._active.get((group_id, source))
        runtime = self._registry.leading(group_id)
        if transfer is None or transfer.number != natural(fields, "transfer") or runtime is None \
                or not self._holding((group_id, source), runtime):
            # Appends may be on their way to it again: files past them must not follow.
            raise NotLeader(0, "no far-horizon transfer of this group to that node here")
        transfer.deadline = time.monotonic() + IDLE_S
        if transfer.learner:
            await self._acquire(size)
        store = self._registry.stores.get(group_id)
        try:
            data = read_segment_chunk(store, Index(natural(fields, "first_index")), natural(fields, "position"), size)
        except (KeyError, AttributeError) as error:  # compacted meanwhile, or the group closed
            raise InvalidRequest(f"no such closed segment here: {error}") from None
        if not self._holding((group_id, source), runtime):  # ended while the throttle waited
            raise NotLeader(0, "no far-horizon transfer of this group to that node here")
        runtime.core.install_progressing(source)
        self.counts["bytes_sent"] += len(data)
        return data

    async def _done(self, source: NodeId, body: bytes) -> None:
        fields = request(body)
        key = (GroupId(natural(fields, "group_id")), source)
        transfer = self._active.get(key)
        if transfer is not None and transfer.number == natural(fields, "transfer"):
            ok = fields.get("ok") is True
            # Whether the stream itself broke; a follower of an earlier version does not
            # say: then any failure of a stream counts, as it did.
            broke = fields.get("stream_failed", True) is True
            self._logger.info("far_catchup_done", group_id=key[0], follower=source, upto=transfer.upto, ok=ok,
                              stream_failed=not ok and transfer.stream and broke)
            if not ok and transfer.stream and broke:  # by chunks next, at once
                self._stream_failed(transfer, source)
                self._finish(key, ok, backoff=False)
                return
            self._finish(key, ok)  # a failure backs off: the follower could not take it

    def _stream_failed(self, transfer: Transfer, node: NodeId) -> None:
        """The follower's files go by chunks for a while (the next offer: at the next round)."""
        if transfer.stream:
            transfer.stream = False
            if transfer.dialled:
                self.counts["streams_failed"] += 1
            self._no_stream[node] = time.monotonic() + NO_STREAM_S

    def _finish(self, key: tuple[GroupId, NodeId], ok: bool, backoff: bool = True) -> None:
        if self._active.pop(key, None) is None:
            return
        self.counts["installed" if ok else "failed"] += 1
        if not ok and backoff:
            self._backoff[key] = max(self._backoff.get(key, 0.0), time.monotonic() + BACKOFF_S)
        now = time.monotonic()
        for stale in [k for k, until in self._backoff.items() if until < now]:  # bounded by use
            del self._backoff[stale]
        for stale in [k for k, (_, until) in self._finishing.items() if until < now]:
            del self._finishing[stale]
        runtime = self._registry.groups.get(key[0])
        if runtime is not None:
            node = key[1]
            self._finishing[key] = (runtime, now + FINISH_WAIT_S)

            def finish(core: Any) -> None:
                core.finish_install(node, ok)
                if self._finishing.get(key, (None, 0.0))[0] is runtime:
                    del self._finishing[key]
            runtime.call_core(finish)

    def _ending(self, key: tuple[GroupId, NodeId], runtime: Any) -> bool:
        """Whether the core of `runtime` has yet to run the end of this follower's last
        transfer (_finish): holding it again now would be undone by that end."""
        pending = self._finishing.get(key)
        if pending is None:
            return False
        if pending[0] is runtime and time.monotonic() < pending[1]:
            return True
        del self._finishing[key]
        return False
