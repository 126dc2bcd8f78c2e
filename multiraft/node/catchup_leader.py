"""Far-horizon catch-up, the leader's side (Rama's far horizon; DESIGN.md sections 4, 15).

A follower far behind (a restart after a long outage, a wiped disk, a new copy after a
move) used to catch up one append at a time: every entry read, framed, sent, checked,
written and acknowledged through both Raft loops. Closed segments are immutable and
byte-identical on every replica that holds them, so they can travel whole instead:

- Every ROUND_S this node looks at the partitions it leads that are awake (a quiet
  group's followers are caught up) for a follower that replicates normally and is at
  least `far_catchup_lag_entries` entries behind, or lacks at least
  `far_catchup_lag_bytes` of closed segments. `far_target` picks the end of the newest
  closed segment the leader has committed: the install's end.
- The core holds that follower (`RaftCore.hold_for_install`: no appends meanwhile) and
  the follower is offered the start point and the closed segments up to that end
  (catchup_wire.py). It fetches the files it lacks (multiraft/node/catchup_follower.py),
  each chunk a `catchup.chunk` call that keeps the hold alive, installs them and says
  `catchup.done`; the core then probes it past the install, and what is left (the
  entries after the last closed segment) is replayed: near horizon. A follower still
  far behind then (a busy leader rolled more segments meanwhile) gets another round,
  with only the files written since.
- Chunks to a learner (a copy being made by a move) take the move throttle's bytes
  (move_throttle.py), as its appends do; chunks to a voter do not, as its appends do
  not: they are the quorum's own.
- Bounded: TRANSFERS_MAX at once from this node; a transfer whose follower asks for
  nothing for IDLE_S ends as failed (the follower probes as usual); an offer the follower
  cannot take yet (its replica not open yet, installs under way) is made again,
  OFFER_ATTEMPTS times at most.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest
from multiraft.node.catchup_wire import CHUNK_BYTES_MAX, Offer, encode_offer, natural, request
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, RpcError, answer
from raftlog.core.progress import Progress, ProgressState
from raftlog.errors import NotLeader
from raftlog.types import GroupId, Index, NodeId
from storage import checkpoints
from storage.node_state import StartPoint, encode_start
from storage.transfer import list_closed_segments, read_segment_chunk

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

ROUND_S = 0.25
TRANSFERS_MAX = 4
IDLE_S = 30.0
OFFER_ATTEMPTS = 20
OFFER_RETRY_S = 0.5


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


class CatchUpLeader:
    def __init__(self, registry: GroupRegistry, rpc: Rpc, lag: tuple[int, int], acquire: Callable[[int], Awaitable[None]],
                 is_live: Callable[[int], bool], start_task: Callable[[Any, str], None], logger: Any) -> None:
        """`lag`: far behind in entries, in bytes (far_target); `acquire(size)`: wait for `size` bytes of the move throttle (chunks to learners);
        `is_live(node)`: the node is heard from (an offer to a silent one would only fail);
        `start_task(coroutine, name)`: the node's, which owns and watches what it starts."""
        self._registry = registry
        self._is_live = is_live
        self._start_task = start_task
        self._rpc = rpc
        self._lag = lag
        self._acquire = acquire
        self._logger = logger
        self._active: dict[tuple[GroupId, NodeId], Transfer] = {}
        self.counts = {"started": 0, "installed": 0, "failed": 0, "bytes_sent": 0}

    def serve(self, rpc: Rpc) -> None:
        async def chunk(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._chunk(NodeId(source), body), bytes)

        async def done(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._done(NodeId(source), body), lambda value: b"{}")

        rpc.register("catchup.chunk", chunk)
        rpc.register("catchup.done", done)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ROUND_S)
            self.round()

    def round(self) -> None:
        """Start a transfer for each follower far behind (at most TRANSFERS_MAX at once)."""
        if not any(self._lag):
            return
        registry = self._registry
        for group_id in [g for g in registry.awake if g in registry.led and g in registry.partitions]:
            runtime, store = registry.groups[group_id], registry.stores[group_id]
            core = runtime.core
            for node in sorted(core.membership.voters | core.membership.learners):
                if len(self._active) >= TRANSFERS_MAX:
                    return
                progress = core.progress(node)
                if node == core.id or progress is None or (group_id, node) in self._active or not self._is_live(node):
                    continue
                closed = [(s.first_index, s.last_index, s.size) for s in store.segments if s.closed]
                upto = far_target(progress, core.log.last_index(), core.commit_index,
                                  Index(store.first_index() - 1), closed, *self._lag)
                if upto is not None and core.hold_for_install(node, upto):
                    learner = node in core.membership.learners
                    self._active[(group_id, node)] = Transfer(upto, learner, time.monotonic() + IDLE_S)
                    self._start_task(self._offer(group_id, node, upto, store), "far-catchup-offer")

    async def _offer(self, group_id: GroupId, node: NodeId, upto: Index, store: SegmentStore) -> None:
        key = (group_id, node)
        start = StartPoint(store.snapshot(), store.offset_after(store.snapshot().meta.index))
        segments = tuple(d for d in list_closed_segments(store) if d.last_index <= upto)
        runtime = self._registry.leading(group_id)
        captured = runtime.boundaries.captured.get(upto) if runtime is not None and runtime.boundaries else None
        checkpoint = b"" if captured is None or not isinstance(captured.data, bytes) else \
            encode_start(checkpoints.at(store, upto, captured.data, captured.membership))
        offer = Offer(group_id, runtime.core.term if runtime else 0, upto, store.term(upto),
                      encode_start(start), segments, checkpoint)
        log = self._logger.bind(group_id=group_id, follower=node, upto=upto)
        for attempt in range(OFFER_ATTEMPTS):
            # A node back from a restart is heard before it opens its replicas: asked too
            # early it says "try again", and the hold keeps the appends from racing the files.
            if attempt:
                await asyncio.sleep(OFFER_RETRY_S)
            try:
                reply = json.loads(await self._rpc.call(node, "catchup.offer", encode_offer(offer), RPC_TIMEOUT_S))
            except (RpcError, ValueError) as error:
                reply = {"accepted": False, "retry": True, "reason": repr(error)}
            if not isinstance(reply, dict) or reply.get("accepted") is True or reply.get("retry") is not True:
                break
            if key not in self._active or self._registry.leading(group_id) is not runtime:
                return  # ended meanwhile (finished, or no longer leading)
            runtime.core.install_progressing(node)
        if not isinstance(reply, dict) or reply.get("accepted") is not True:
            log.info("far_catchup_refused", reason=str(reply.get("reason") if isinstance(reply, dict) else reply))
            self._finish(key, ok=False)
            return
        self.counts["started"] += 1
        log.info("far_catchup_started", files=len(segments), bytes=sum(d.size_bytes for d in segments))
        while (transfer := self._active.get(key)) is not None:
            if time.monotonic() > transfer.deadline:
                log.warning("far_catchup_idle", idle_s=IDLE_S)
                self._finish(key, ok=False)
                return
            await asyncio.sleep(ROUND_S)

    async def _chunk(self, source: NodeId, body: bytes) -> bytes:
        fields = request(body)
        group_id = GroupId(natural(fields, "group_id"))
        size = natural(fields, "size")
        if not 0 < size <= CHUNK_BYTES_MAX:
            raise InvalidRequest(f"size: 1 to {CHUNK_BYTES_MAX}")
        transfer = self._active.get((group_id, source))
        runtime = self._registry.leading(group_id)
        if transfer is None or runtime is None:
            raise NotLeader(0, "no far-horizon transfer of this group to that node here")
        transfer.deadline = time.monotonic() + IDLE_S
        if transfer.learner:
            await self._acquire(size)
        store = self._registry.stores.get(group_id)
        try:
            data = read_segment_chunk(store, Index(natural(fields, "first_index")), natural(fields, "position"), size)
        except (KeyError, AttributeError) as error:  # compacted meanwhile, or the group closed
            raise InvalidRequest(f"no such closed segment here: {error}") from None
        runtime.core.install_progressing(source)
        self.counts["bytes_sent"] += len(data)
        return data

    async def _done(self, source: NodeId, body: bytes) -> None:
        fields = request(body)
        key = (GroupId(natural(fields, "group_id")), source)
        transfer = self._active.get(key)
        if transfer is not None and transfer.upto == natural(fields, "upto"):
            ok = fields.get("ok") is True
            self._logger.info("far_catchup_done", group_id=key[0], follower=source, upto=transfer.upto, ok=ok)
            self._finish(key, ok)

    def _finish(self, key: tuple[GroupId, NodeId], ok: bool) -> None:
        if self._active.pop(key, None) is None:
            return
        self.counts["installed" if ok else "failed"] += 1
        runtime = self._registry.groups.get(key[0])
        if runtime is not None:
            node = key[1]
            runtime.call_core(lambda core: core.finish_install(node, ok))
