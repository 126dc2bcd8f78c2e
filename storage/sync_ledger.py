"""What a segment store owes the disk: the segments written since their last fsync,
how far the log is durable, and the syncs begun and not yet finished.

`SegmentStore` (storage/segments.py) holds one `SyncLedger` and answers the sync
calls (`start_sync`, `finish_sync`, `abandon_sync`) through it; storage.md
("Durability") describes the policy. The flush policy is passed on each call,
because the node may replace a store's config while it is open.
"""

from __future__ import annotations

import contextlib
import errno
import functools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raftlog.types import Index
from storage.config import FlushMode, FlushPolicy
from storage.errors import DiskFullError, SyncFailedError
from storage.files import Files
from storage.segment import Segment


@dataclass(frozen=True, slots=True)
class PendingSync:
    """Fsyncs handed out by `start_sync` (safe on any thread) and what they make durable
    once `finish_sync` records them, on the store's own thread."""

    fsyncs: tuple[Callable[[], None], ...]
    durable_index: Index
    segments: int  # segment files it covers (inline ones included)
    bytes: int  # appended since the previous sync
    now_ms: int
    ticket: list[Any]  # [durable_index, truncations, finished]: its place among the syncs


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What `sync` made durable: acknowledge only entries up to `durable_index`."""

    durable_index: Index
    fsync_count: int


class SyncLedger:
    """One store's fsync bookkeeping. Not thread-safe: only the fsyncs it hands out
    (`PendingSync.fsyncs`) may run on another thread."""

    def __init__(self, files: Files, clock_ms: Callable[[], int], durable_index: Index) -> None:
        self._files = files
        self._clock_ms = clock_ms
        self._dirty: dict[int, Segment] = {}
        # Entries up to here are durable; it only goes down when the log is truncated.
        self.durable_index = durable_index
        self._truncations = 0
        self._unsynced_bytes = 0
        # Syncs begun and not yet finished, in the order they began: one that finishes
        # early (a small one, on the loop) must not report entries that an earlier one
        # (on the fsync thread) is still making durable.
        self._syncs: deque[list[Any]] = deque()
        self._sync_failure: str | None = None
        self._last_fsync_ms = clock_ms()

    @property
    def unsynced_bytes(self) -> int:
        return self._unsynced_bytes

    @property
    def in_flight(self) -> bool:
        return bool(self._syncs)

    def wrote(self, segment: Segment, appended_bytes: int) -> None:
        self._unsynced_bytes += appended_bytes
        self._dirty[id(segment)] = segment

    def roll(self, segment: Segment) -> None:
        """The segment is being closed: fsync it now; no later sync needs to."""
        with _disk_full_typed(segment.path):
            self._files.fsync(segment.handle)
        self._dirty.pop(id(segment), None)

    def forget(self, segment: Segment) -> None:
        """The segment's file is gone."""
        self._dirty.pop(id(segment), None)

    def forget_all(self) -> None:
        self._dirty.clear()

    def truncated(self, segment: Segment, index: Index) -> None:
        """Entries from `index` on were cut from `segment`: syncs begun before do not count."""
        self._dirty[id(segment)] = segment
        self.durable_index = min(self.durable_index, Index(index - 1))
        self._truncations += 1

    def interval_due_ms(self, policy: FlushPolicy) -> int | None:
        if policy.mode is not FlushMode.INTERVAL or self._unsynced_bytes == 0:
            return None
        return max(0, policy.interval_ms - (self._clock_ms() - self._last_fsync_ms))

    def start(self, policy: FlushPolicy, last_index: Index, detached: bool) -> PendingSync | None:
        """`SegmentStore.start_sync`, for a log ending at `last_index`."""
        if self._sync_failure is not None:
            raise SyncFailedError(f"an earlier fsync failed ({self._sync_failure}); reopen the log")
        now = self._clock_ms()
        if policy.mode is FlushMode.NONE:
            return None
        if policy.mode is FlushMode.INTERVAL and now - self._last_fsync_ms < policy.interval_ms:
            return None
        fsyncs = []
        for segment in self._dirty.values():
            # The write-behind double writes here, so a failed write refuses this store
            # alone (its groups reopen) rather than the whole flush.
            with _disk_full_typed(segment.path):
                if detached:
                    fsync = self._files.detached_fsync(segment.handle)
                else:
                    self._files.to_os(segment.handle)
                    fsync = functools.partial(self._files.fsync, segment.handle)
            fsyncs.append(_disk_full_as_typed(fsync, segment.path))
        count, appended = len(self._dirty), self._unsynced_bytes
        self._dirty.clear()
        self._unsynced_bytes = 0
        ticket = [last_index, self._truncations, False]
        self._syncs.append(ticket)
        return PendingSync(tuple(fsyncs), last_index, count, appended, now, ticket)

    def finish(self, pending: PendingSync) -> None:
        """`SegmentStore.finish_sync`."""
        pending.ticket[2] = True
        while self._syncs and self._syncs[0][2]:
            durable_index, truncations, _ = self._syncs.popleft()
            if truncations == self._truncations:
                self.durable_index = max(self.durable_index, durable_index)
        self._last_fsync_ms = pending.now_ms

    def abandon(self, error: BaseException) -> None:
        """`SegmentStore.abandon_sync`."""
        self._sync_failure = repr(error)
        self._syncs.clear()


@contextlib.contextmanager
def _disk_full_typed(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise DiskFullError(f"no space left syncing {path}") from error
        raise


def _disk_full_as_typed(fsync: Callable[[], None], path: str) -> Callable[[], None]:
    def run() -> None:
        try:  # not `with _disk_full_typed`: this runs once per flush, and a plain try is cheaper
            fsync()
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise DiskFullError(f"no space left syncing {path}") from error
            raise

    return run
