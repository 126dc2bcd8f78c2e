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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from raftlog.messages import Membership
from raftlog.types import Index
from storage.transfer import retention_index

if TYPE_CHECKING:
    from multiraft.node import Node
    from storage.segments import SegmentStore

CAPTURES_MAX = 32  # per group: segment ends awaiting retention
COMPACTION_INTERVAL_S = 2.0


class Boundaries:
    """Segment ends of one group and the state captured at each (oldest first)."""

    def __init__(self) -> None:
        self.pending: set[Index] = set()  # closed-segment ends not yet applied
        self.captured: OrderedDict[Index, bytes] = OrderedDict()
        self._seen_up_to = Index(0)

    def note_segments(self, store: SegmentStore, applied: Index, machine: Any) -> None:
        """After an append: segments that closed since the last look end where? (Rolls
        happen at the tail, so the newest few segments are all there is to look at.)"""
        for segment in store.segments[-4:]:
            if not segment.closed or segment.last_index <= self._seen_up_to:
                continue
            self._seen_up_to = segment.last_index
            if segment.last_index == applied:
                self._capture(segment.last_index, machine)  # already applied: state is at its end
            elif segment.last_index > applied:
                self.pending.add(segment.last_index)

    def applied(self, index: Index, machine: Any) -> None:
        if index in self.pending:
            self.pending.discard(index)
            self._capture(index, machine)

    def _capture(self, index: Index, machine: Any) -> None:
        self.captured[index] = machine.snapshot()
        while len(self.captured) > CAPTURES_MAX:
            self.captured.popitem(last=False)

    def best_at_or_below(self, index: Index) -> tuple[Index, bytes] | None:
        found = None
        for boundary, data in self.captured.items():
            if boundary <= index:
                found = (boundary, data)
        return found

    def forget_through(self, index: Index) -> None:
        for boundary in [b for b in self.captured if b <= index]:
            del self.captured[boundary]

    def clear(self) -> None:
        self.pending.clear()
        self.captured.clear()


def compact_group(store: SegmentStore, boundaries: Boundaries, applied: Index, now_ms: int,
                  membership: Membership) -> Index:
    """Move the log start as far as retention allows and a captured state exists; returns it.
    `membership`: the group's configuration now; partition groups do not change
    membership yet (no reassignment), so it is the one in force at the boundary too.
    When they do, a capture must record the configuration along with the state."""
    target = retention_index(store, now_ms, applied)
    if target < store.first_index():
        return store.first_index()
    choice = boundaries.best_at_or_below(target)
    if choice is None or choice[0] < store.first_index():
        return store.first_index()
    boundary, data = choice
    store.compact(boundary, data=data, membership=membership)
    boundaries.forget_through(boundary)
    return store.first_index()


async def compaction_loop(node: Node, interval_s: float = COMPACTION_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval_s)
        now_ms = int(time.time() * 1000)
        for group_id, runtime in list(node.groups.items()):
            boundaries = runtime.boundaries
            store = node.stores.get(group_id)
            if boundaries is None or store is None or not boundaries.captured or runtime.failed:
                continue
            before = store.first_index()
            with contextlib.suppress(OSError):  # a full disk: the next round tries again
                after = compact_group(store, boundaries, runtime.core.applied_index, now_ms,
                                      runtime.core.membership)
                if after > before:
                    node.logger.info("log_compacted", group_id=group_id, first_index=after,
                                     log_start_offset=int(store.log_start_offset))
