"""Retention: whole closed segments go, and the partition state goes with the log start.

Our message log *is* the Raft log, so deleting old records is Raft log compaction:
the log's new start point must carry the partition's state as of the entry just
before it (producer table, consumer offsets, offset mapping), the snapshot a
lagging follower installs and a restarting node restores. Retention deletes whole
closed segments only, so the state is needed exactly at segment ends: it is
captured as the group applies the last entry of a closed segment (or when the
segment closes, if that entry was already applied), kept in memory, a bounded
number per group, and written into the start point in the same database write
that moves the start. A capture lost to a restart only delays retention to a
later segment end; it never moves the start without the matching state.

The metadata group is compacted the same way (its state: the catalog), so its log
stays bounded however long the cluster runs. Its membership changes (nodes join
as learners), so a capture also records the configuration in force at its index:
the start point must name the members as of that entry, not as of today.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftlog.messages import Membership
from raftlog.types import Index
from storage import checkpoints
from storage.transfer import retention_index

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

CAPTURES_MAX = 32  # per group: segment ends awaiting retention
COMPACTION_INTERVAL_S = 2.0
COMPACTION_CHUNK_GROUPS = 64  # groups compacted per loop turn in a pass


@dataclass(frozen=True, slots=True)
class Capture:
    """A group's state machine and configuration as of one applied index."""

    data: bytes
    membership: Membership


class Boundaries:
    """Segment ends of one group and the state captured at each (oldest first)."""

    def __init__(self, group_id: int = 0, with_captures: set[Any] | None = None,
                 store: SegmentStore | None = None) -> None:
        """`with_captures`: the node's set of groups holding captures (the registry's), which
        this one joins at its first capture, so a compaction pass looks at those only.
        `store`: the group's, where each capture is also written as its checkpoint (an
        open then replays only what follows: storage/checkpoints.py)."""
        self._group_id = group_id
        self._with_captures = with_captures
        self._store = store
        self.pending: set[Index] = set()  # closed-segment ends not yet applied
        self.captured: OrderedDict[Index, Capture] = OrderedDict()
        self._seen_up_to = Index(0)

    def note_segments(self, store: SegmentStore, applied: Index, machine: Any, membership: Membership) -> None:
        """After an append: segments that closed since the last look end where? (Rolls
        happen at the tail, so the newest few segments are all there is to look at.)
        `membership`: the configuration in force at `applied`."""
        for segment in store.segments[-4:]:
            if not segment.closed or segment.last_index <= self._seen_up_to:
                continue
            self._seen_up_to = segment.last_index
            if segment.last_index == applied:
                # Already applied: the state is at its end.
                self._capture(segment.last_index, machine, membership)
            elif segment.last_index > applied:
                self.pending.add(segment.last_index)

    def applied(self, index: Index, machine: Any, membership: Membership) -> None:
        """Entry `index` was just applied; `membership`: the configuration in force there."""
        if index in self.pending:
            self.pending.discard(index)
            self._capture(index, machine, membership)

    def _capture(self, index: Index, machine: Any, membership: Membership) -> None:
        capture = self.captured[index] = Capture(machine.snapshot(), membership)
        if self._store is not None and isinstance(capture.data, bytes) and not self._store.closed:
            checkpoints.save(self._store, checkpoints.at(self._store, index, capture.data, membership))
        if self._with_captures is not None:
            self._with_captures.add(self._group_id)
        while len(self.captured) > CAPTURES_MAX:
            self.captured.popitem(last=False)

    def best_at_or_below(self, index: Index) -> tuple[Index, Capture] | None:
        found = None
        for boundary, capture in self.captured.items():
            if boundary <= index:
                found = (boundary, capture)
        return found

    def forget_through(self, index: Index) -> None:
        for boundary in [b for b in self.captured if b <= index]:
            del self.captured[boundary]

    def clear(self) -> None:
        self.pending.clear()
        self.captured.clear()


def restore_state(store: SegmentStore, machine: Any, use_checkpoint: bool) -> Index:
    """Restore `machine` as an open starts it: from the group's checkpoint when asked and
    usable (storage/checkpoints.py), else from the log's start point (the state the
    compacted log began from); returns the index it now stands at (the core's `applied`)."""
    point = checkpoints.start_from(store) if use_checkpoint else None
    start = point.snapshot if point is not None else store.snapshot()
    if start.meta.index > 0 and start.data is not None:
        machine.restore(start.data, start.meta.index)
    return start.meta.index


def compact_group(store: SegmentStore, boundaries: Boundaries, applied: Index, now_ms: int) -> Index:
    """Move the log start as far as retention allows and a captured state exists; returns it."""
    target = retention_index(store, now_ms, applied)
    if target < store.first_index():
        return store.first_index()
    choice = boundaries.best_at_or_below(target)
    if choice is None or choice[0] < store.first_index():
        return store.first_index()
    boundary, capture = choice
    store.compact(boundary, data=capture.data, membership=capture.membership)
    boundaries.forget_through(boundary)
    return store.first_index()


async def compaction_loop(registry: GroupRegistry, logger: Any, interval_s: float = COMPACTION_INTERVAL_S) -> None:
    """Every `interval_s`, compact the groups that hold captured states (the registry's
    `with_captures`: a quiet node's pass costs nothing), yielding between chunks."""
    while True:
        await asyncio.sleep(interval_s)
        now_ms = int(time.time() * 1000)
        candidates = sorted(registry.with_captures)
        for position, group_id in enumerate(candidates):
            if position and position % COMPACTION_CHUNK_GROUPS == 0:
                await asyncio.sleep(0)  # a store's compaction writes: let the loop breathe
            runtime = registry.groups.get(group_id)
            store = registry.stores.get(group_id)
            boundaries = runtime.boundaries if runtime is not None else None
            if runtime is None or store is None or boundaries is None or not boundaries.captured:
                registry.with_captures.discard(group_id)  # closed, or nothing left to compact with
                continue
            if runtime.failed:
                continue
            compact_one(group_id, runtime, store, boundaries, now_ms, logger)


def compact_one(group_id: int, runtime: Any, store: SegmentStore, boundaries: Boundaries, now_ms: int,
                logger: Any) -> None:
    before = store.first_index()
    with contextlib.suppress(OSError):  # a full disk: the next round tries again
        # Never past the local durable log: a leader applies entries its followers
        # made durable before its own fsync of them has finished.
        durable = runtime.core.log.stable_last_index()
        after = compact_group(store, boundaries, Index(min(runtime.core.applied_index, durable)), now_ms)
        if after > before:
            logger.info("log_compacted", group_id=group_id, first_index=after,
                        log_start_offset=int(store.log_start_offset))
