"""The segment store: a group's Raft log on disk, readable by index and by offset.

Implements `raftlog.storage.RaftStorage` (the core reads through it, the driver
writes through it) plus what the partition needs: reads by logical offset,
retention and segment transfer (`storage.transfer`).

Durability: `append` writes frames to the open segment through `Files` (the OS
page cache, or the write-behind double's memory); `sync` applies the flush
policy — fsync every touched segment once, then one database write holding the
hard state — and returns how far the log is now durable. Database records about
the log (catalog, index keys) are derived from the segments and are never the
only copy of anything; node state (hard state, start point, applied index) is
written only in `sync`, so the database never runs ahead of synced segments.

The reads live in `SegmentLog` (storage/segment_log.py), the base class; the fsync
bookkeeping in `SyncLedger` (storage/sync_ledger.py); the newest entries kept in
memory in `EntryCache` (storage/entry_cache.py), which every write below keeps true
to the files (an append remembers, a cut, snapshot, compaction or close drops).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from bisect import bisect_right
from collections.abc import Callable

from raftlog.messages import Entry, HardState, Membership, Snapshot
from raftlog.storage import InitialState
from raftlog.types import GroupId, Index, Offset
from storage import catalog
from storage.config import FlushMode, StoreConfig
from storage.entry_cache import STORE_CACHE_BYTES_DEFAULT, EntryCacheBudget
from storage.errors import CorruptionError, DiskFullError
from storage.files import Files
from storage.frames import FrameCheck, FrameInfo, crc_matches, encode_frame, record_count_of
from storage.node_state import StartPoint, encode_applied, encode_hard_state, encode_start
from storage.recovery import RecoveryReport, recover
from storage.segment import Segment, next_generation, segment_name
from storage.segment_log import SegmentLog
from storage.state_db import (
    APPLIED,
    CHECK_ALL,
    CHECKPOINT,
    CLOSED_SEGMENT,
    HARD_STATE,
    INDEX,
    NEWEST_SEGMENT,
    OFFSET,
    REPAIR,
    SNAPSHOT,
    TERM_RUN,
    StateDatabase,
    delete_int_range,
    group_key,
    int_key,
)
from storage.sync_ledger import FlushResult, PendingSync, SyncLedger
from storage.tree_sidecar import forget_sidecar

__all__ = ["FlushResult", "PendingSync", "SegmentStore"]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SegmentStore(SegmentLog):
    """One group's log: the reads of `SegmentLog` and every write. Not thread-safe: the
    node's event loop owns it."""

    def __init__(
        self, group: GroupId, directory: str, db: StateDatabase, files: Files,
        config: StoreConfig | None = None, clock_ms: Callable[[], int] = wall_clock_ms,
        *,
        frame_check: FrameCheck = crc_matches,
        on_segments_changed: Callable[[SegmentStore], None] | None = None,
        cache_budget: EntryCacheBudget | None = None,
    ) -> None:
        """`frame_check` judges the CRC of every frame recovery scans and reads return.
        `cache_budget`: the node's, shared by its stores; by default one of this store's own."""
        config = config or StoreConfig()
        recovered = recover(group, directory, db, files, clock_ms(), frame_check)
        super().__init__(group, directory, db, files, config, recovered, frame_check,
                         EntryCacheBudget(STORE_CACHE_BYTES_DEFAULT) if cache_budget is None else cache_budget)
        self.closed = False  # set by close(); the flusher skips a closed store
        # Told of each segment closed, reopened or dropped (and here, of a log holding closed ones): the
        # tree sidecar warmer looks at the stores named, not at every store (multiraft/node/tree_sidecars.py).
        self._on_segments_changed = on_segments_changed
        self._clock_ms = clock_ms
        self.recovery: RecoveryReport = recovered.report
        self.repair_reason: str | None = recovered.repair_reason
        self._hard_state = self._durable_hard_state = recovered.hard_state
        self._applied = recovered.applied
        self.starts_from: StartPoint | None = None  # set by storage/checkpoints.py `start_from`
        self._state_changed = False
        self._ledger = SyncLedger(files, clock_ms, durable_index=self.last_index())
        # The commit index is stored only after the entries it covers were fsynced, so a
        # log that now ends below it lost durable entries (a damaged disk): this replica
        # must not vote or lead until its leader has given them back (`repair_until`).
        self.repair_until = Index(0)
        recorded_commit = self._hard_state.commit
        if self.repair_reason is not None or recorded_commit > self.last_index():
            self.repair_until = Index(max(recorded_commit, self.last_index()))
            if self.repair_reason is None:
                self.repair_reason = (f"the log ends at {self.last_index()}, below the recorded commit "
                                      f"{recorded_commit}: durable entries were lost")
            if recorded_commit > self.last_index():
                self._hard_state = self._durable_hard_state = dataclasses.replace(
                    self._hard_state, commit=self.last_index())
        if any(segment.closed for segment in self._segments):
            self._segments_changed()

    def _segments_changed(self) -> None:
        if self._on_segments_changed is not None:
            self._on_segments_changed(self)

    def initial_state(self) -> InitialState:
        membership = self._start.snapshot.meta.membership
        if self._applied is not None:
            membership = self._applied[1]
        if self.starts_from is not None:  # the state machine starts at a checkpoint, not the log start
            membership = self.starts_from.snapshot.meta.membership
        return InitialState(
            hard_state=self._hard_state,
            membership=membership,
            needs_repair=self.repair_reason is not None,
        )

    # -- write side (RaftStorage) ----------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        if not entries:
            return
        first = entries[0].index
        assert first > self._start.snapshot.meta.index, "cannot append at or below the snapshot"
        assert first <= self.last_index() + 1, "appends must be contiguous"
        if first <= self.last_index():
            self.truncate_from(first)
        segment = self._writable_segment()
        buffers: list[bytes] = []
        infos: list[FrameInfo] = []
        position, next_offset = segment.size, segment.next_offset
        for expected, entry in enumerate(entries, start=first):
            assert entry.index == expected, "entries are contiguous"
            count = record_count_of(entry)
            header, payload = encode_frame(entry, next_offset, count)
            size = len(header) + len(payload)
            infos.append(FrameInfo(entry.index, entry.term, entry.kind, next_offset, count,
                                   position, size))  # fmt: skip
            buffers += (header, payload)
            position += size
            next_offset = Offset(next_offset + count)
        self._write(segment, buffers, infos)
        self._cache.remember(entries)

    def append_frames(self, data: bytes) -> list[FrameInfo]:
        """Store frames received from the leader byte for byte, after validating them."""
        from storage.frames import validate_frames

        first = Index(int.from_bytes(data[8:16], "big")) if len(data) >= 16 else self.last_index()
        assert first > self._start.snapshot.meta.index
        assert first <= self.last_index() + 1, "appends must be contiguous"
        if first <= self.last_index():
            self.truncate_from(first)
        segment = self._writable_segment()
        frames = validate_frames(data, first, segment.next_offset)
        self._cache.forget()  # these frames have no Entry objects to remember
        base = segment.size
        infos = [
            FrameInfo(f.index, f.term, f.kind, f.base_offset, f.record_count,
                      f.position + base, f.size_bytes)
            for f in frames
        ]  # fmt: skip
        self._write(segment, [data], infos)
        return infos

    def _write(self, segment: Segment, buffers: list[bytes], infos: list[FrameInfo]) -> None:
        """Write frames, all or nothing: a failed write is cut back before it is reported."""
        size_before = segment.size
        try:
            self._files.append(segment.handle, buffers)
        except OSError as error:
            self._files.truncate(segment.handle, size_before)
            if error.errno == errno.ENOSPC:
                raise DiskFullError(f"no space left appending to {segment.path}") from error
            raise
        appended_bytes = segment.size - size_before
        for info in infos:
            segment.add_frame(info)
            if not self._terms or self._terms[-1] != info.term:
                self._term_starts.append(info.index)
                self._terms.append(info.term)
        self._ledger.wrote(segment, appended_bytes)

    def set_hard_state(self, hard_state: HardState) -> None:
        assert hard_state.term >= self._hard_state.term, "terms never decrease"
        assert hard_state.commit >= self._hard_state.commit, "commit never decreases"
        if hard_state != self._hard_state:
            self._hard_state = hard_state
            self._state_changed = True

    def set_applied(self, applied: Index, membership: Membership) -> None:
        """Record the applied index and the membership in force there (made durable by sync)."""
        assert applied <= self._hard_state.commit, "applied <= committed"
        self._applied = (applied, membership)
        self._state_changed = True

    def sync(self) -> FlushResult:
        """Apply the flush policy; report what is now durable (group commit)."""
        fsyncs = self.sync_files()
        batch = self._db.batch()
        vote_changed = self.stage_state(batch)
        # A synced rocksdict write holds the GIL for about a millisecond, so sync it only
        # when it must be: a term or vote change (never vote twice). Under the fsync
        # policy the segments were just fsynced, so a lazily persisted commit index can
        # never point past durable entries; under the others, sync it with the files.
        fsync_policy = self.config.flush.mode is FlushMode.FSYNC
        self._db.write(batch, sync=vote_changed or (fsyncs > 0 and not fsync_policy))
        return FlushResult(self._ledger.durable_index, fsyncs)

    def sync_files(self) -> int:
        """Fsync each touched segment once, if the policy says it is time (on this thread)."""
        pending = self.start_sync()
        if pending is None:
            return 0
        try:
            for fsync in pending.fsyncs:
                fsync()
        except Exception as error:
            self.abandon_sync(error)
            raise
        self.finish_sync(pending)
        return pending.segments

    @property
    def unsynced_bytes(self) -> int:
        """Appended since the last `start_sync` (what the next one would make durable)."""
        return self._ledger.unsynced_bytes

    def interval_sync_due_ms(self) -> int | None:
        """Under the `interval_ms` policy, with appends not yet fsynced: in how many ms the
        interval is up (0: now). None otherwise. Without a later write nothing would ask
        for that fsync, and an idle log's last appends would wait for the OS."""
        return None if self.closed else self._ledger.interval_due_ms(self.config.flush)

    @property
    def sync_in_flight(self) -> bool:
        """A sync was started and its fsyncs have not all finished (they run on another thread)."""
        return self._ledger.in_flight

    def start_sync(self, detached: bool = True) -> PendingSync | None:
        """Begin making what was appended durable: the returned fsyncs may run on another
        thread (the event loop goes on meanwhile); `finish_sync` then records them. None:
        the policy says it is not time. `detached=False`: the fsyncs run on this thread
        before anything else touches the store, so they use the open descriptors (no
        duplicate to make and close per segment, which a flush per write pays)."""
        return self._ledger.start(self.config.flush, self.last_index(), detached)

    def finish_sync(self, pending: PendingSync) -> None:
        """The fsyncs of `pending` completed. Once every sync begun before it finished too,
        what was appended before it began is durable (unless the log was truncated since:
        then the truncation already said how far)."""
        self._ledger.finish(pending)

    def abandon_sync(self, error: BaseException) -> None:
        """A sync's fsyncs failed: nothing more is reported durable, and every later
        `start_sync` raises `SyncFailedError` (the group fails and is reopened)."""
        self._ledger.abandon(error)

    def vote_unsaved(self) -> bool:
        """Would `stage_state` stage a new term or vote (a write that must be synced)?"""
        if not self._state_changed:
            return False
        stored, durable = self.hard_state_to_store(), self._durable_hard_state
        return (stored.term, stored.vote) != (durable.term, durable.vote)

    def hard_state_to_store(self) -> HardState:
        """The hard state `stage_state` writes: the one last set. (A subclass may write
        another; `vote_unsaved` and the sync decision follow what it returns.)"""
        return self._hard_state

    def stage_state(self, batch) -> bool:
        """Stage changed node state into `batch`; True when term or vote changed,
        which must be synced whatever the flush policy (a node never votes twice)."""
        if not self._state_changed:
            return False
        durable, stored = self._durable_hard_state, self.hard_state_to_store()
        durable_index = self._ledger.durable_index
        if self.config.flush.mode is FlushMode.FSYNC and stored.commit > durable_index:
            # Entries may be appended while an fsync runs on another thread: the commit
            # index is stored only as far as the log is durable, so a crash never leaves
            # a log ending below its recorded commit (which would read as lost entries).
            stored = dataclasses.replace(stored, commit=durable_index)
        batch.put(group_key(HARD_STATE, self.group), encode_hard_state(stored))
        if self._applied is not None:
            batch.put(group_key(APPLIED, self.group), encode_applied(*self._applied))
        self._state_changed = False
        self._durable_hard_state = stored
        return (stored.term, stored.vote) != (durable.term, durable.vote)

    # -- segments --------------------------------------------------------------

    def _writable_segment(self) -> Segment:
        if not self._segments:
            return self._create_segment()
        segment = self._segments[-1]
        age_ms = self._clock_ms() - segment.created_ms
        full = segment.size >= self.config.segment_bytes_max
        if segment.entry_count > 0 and (full or age_ms >= self.config.segment_ms_max):
            self._close(segment)
            return self._create_segment()
        return segment

    def _close(self, segment: Segment) -> None:
        """Roll: the segment becomes immutable, durable and catalogued."""
        self._ledger.roll(segment)
        # The file CRC is computed when a transfer first asks for it (transfer.py):
        # reading 64 MiB back here cost more per entry than the appends themselves.
        segment.crc = None
        batch = self._db.batch()
        catalog.stage_close(batch, self.group, segment, self._term_starts, self._terms)
        self._db.write(batch, sync=False)
        self._segments_changed()

    def _create_segment(self) -> Segment:
        first = Index(self.last_index() + 1)
        path = os.path.join(self.directory, segment_name(first))
        handle = self._files.create(path)
        self._files.sync_dir(self.directory)  # the new name is durable before entries land in it
        next_offset = self._segments[-1].next_offset if self._segments else self._start.next_offset
        segment = Segment(
            first_index=first, path=path, handle=handle, first_offset=next_offset,
            created_ms=self._clock_ms(), last_index=Index(first - 1), next_offset=next_offset,
        )  # fmt: skip
        self._segments.append(segment)
        batch = self._db.batch()
        batch.put(int_key(NEWEST_SEGMENT, self.group, 0), first.to_bytes(8, "big"))
        self._db.write(batch, sync=False)
        return segment

    def truncate_from(self, index: Index) -> None:
        """Drop entries from `index` on (a Raft conflict). Never below the commit."""
        assert index > self._hard_state.commit, "committed entries are never truncated"
        assert self._start.snapshot.meta.index < index <= self.last_index()
        # First: a step below that raises (a corrupt closed segment on reopen, an unlink)
        # must not leave cached entries the files may no longer hold.
        self._cache.forget(index)
        segment = self._segment_of(index)
        batch = self._db.batch()
        for later in self._segments[self._segments.index(segment) + 1 :]:
            self._drop_segment_file(later, batch)
        del self._segments[self._segments.index(segment) + 1 :]
        if segment.closed:
            self._reopen(segment, batch)
        next_offset = self._offset_at(segment, index)
        segment.cut(self._files, index, next_offset)
        delete_int_range(batch, INDEX, self.group, index)
        delete_int_range(batch, OFFSET, self.group, next_offset)
        delete_int_range(batch, TERM_RUN, self.group, index)
        batch.put(int_key(NEWEST_SEGMENT, self.group, 0), segment.first_index.to_bytes(8, "big"))
        self._db.write(batch, sync=False)
        self._files.sync_dir(self.directory)
        run = bisect_right(self._term_starts, index - 1)
        del self._term_starts[run:], self._terms[run:]
        self._ledger.truncated(segment, index)

    def _reopen(self, segment: Segment, batch) -> None:
        """A closed segment becomes the open one again: rebuild its memory tables."""
        from storage.segment import scan_segment

        result = scan_segment(self._files, segment.handle, segment.first_index, self.frame_check)
        if result.error is not None:
            raise CorruptionError(f"closed segment {segment.first_index}: {result.error}")
        forget_sidecar(self._files, segment.path)  # it will hold other entries: its tree sidecar goes
        segment.generation = next_generation()
        self._segments_changed()
        segment.closed = False
        segment.last_index = Index(segment.first_index - 1)
        segment.next_offset = segment.first_offset
        for info in result.frames:
            segment.add_frame(info)
        batch.delete(int_key(CLOSED_SEGMENT, self.group, segment.first_index))

    def _drop_segment_file(self, segment: Segment, batch) -> None:
        self._files.close(segment.handle)
        self._files.unlink(segment.path)
        forget_sidecar(self._files, segment.path)
        segment.generation = next_generation()
        self._segments_changed()
        self._ledger.forget(segment)
        batch.delete(int_key(CLOSED_SEGMENT, self.group, segment.first_index))

    def close(self) -> None:
        self._cache.forget()  # first, as in truncate_from: a close that raises holds nothing
        for segment in self._segments:
            self._files.close(segment.handle)
        self._segments = []
        self.closed = True

    # -- snapshots and compaction ----------------------------------------------

    def compact(self, index: Index, data: object = None, membership: Membership | None = None) -> None:
        """Forget entries up to `index`; delete the closed segments wholly below it.

        `data`: the state machine's state as of `index`, stored in the same write as
        the new start point (a start without its state would restore the wrong one);
        None keeps the old start's data. `membership`: the configuration in force at
        `index` (the CONFIG entries before it are dropped); None keeps the old start's.
        The new start point is made durable before any file is deleted, so a crash
        in between leaves segments that recovery recognizes as compacted.
        """
        if index <= self._start.snapshot.meta.index:
            return
        assert index <= self.last_index(), "cannot compact beyond the log"
        meta = self._start.snapshot.meta
        if membership is None:
            membership = self._applied[1] if self._applied is not None else meta.membership
        snapshot = Snapshot(
            meta=type(meta)(index=index, term=self.term(index), membership=membership),
            data=self._start.snapshot.data if data is None else data,
        )
        self._set_start(StartPoint(snapshot, self.offset_after(index)))
        self._cache.release(index)  # below the log's start now: never read again
        self._delete_segments_below(Index(index + 1))

    def set_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the data (and membership) of the current start point."""
        assert snapshot.meta.index == self._start.snapshot.meta.index
        self._set_start(StartPoint(snapshot, self._start.next_offset))

    def apply_snapshot(self, snapshot: Snapshot, next_offset: Offset | None = None) -> None:
        """Replace the whole log by a snapshot received from the leader.

        `next_offset` is the offset of the first record after the snapshot (the
        protocol's Snapshot has no field for it; a `next_offset` attribute of
        `snapshot.data` is used when given, else 0).
        """
        assert snapshot.meta.index >= self._start.snapshot.meta.index, "snapshots never go back"
        self._cache.forget()  # first, as in truncate_from: a step below may raise
        if next_offset is None:
            next_offset = Offset(getattr(snapshot.data, "next_offset", 0))
        batch = self._db.batch()
        for segment in self._segments:
            self._drop_segment_file(segment, batch)
        self._segments = []
        self._ledger.forget_all()
        delete_int_range(batch, INDEX, self.group, 0)
        delete_int_range(batch, OFFSET, self.group, 0)
        delete_int_range(batch, TERM_RUN, self.group, 0)
        batch.delete(int_key(NEWEST_SEGMENT, self.group, 0))
        batch.delete(group_key(CHECKPOINT, self.group))  # a state of the log replaced
        self._db.write(batch, sync=False)
        self._files.sync_dir(self.directory)
        self._term_starts, self._terms = [], []
        self._set_start(StartPoint(snapshot, next_offset))
        self._ledger.durable_index = self.last_index()

    def _set_start(self, start: StartPoint) -> None:
        batch = self._db.batch()
        batch.put(group_key(SNAPSHOT, self.group), encode_start(start))
        self._db.write(batch, sync=True)
        self._start = start

    def _delete_segments_below(self, index: Index) -> None:
        """Unlink closed segments whose entries all precede `index`."""
        batch = self._db.batch()
        keep = 0
        while keep < len(self._segments) - 1 and self._segments[keep + 1].first_index <= index:
            self._drop_segment_file(self._segments[keep], batch)
            keep += 1
        if keep == 0:
            return
        first_kept = self._segments[keep].first_index
        del self._segments[:keep]
        batch.delete_range(int_key(INDEX, self.group, 0), int_key(INDEX, self.group, first_kept))
        first_offset = self._segments[0].first_offset
        batch.delete_range(
            int_key(OFFSET, self.group, 0), int_key(OFFSET, self.group, first_offset)
        )
        self._db.write(batch, sync=False)
        self._files.sync_dir(self.directory)

    def request_full_check(self) -> None:
        """A read met a frame that fails its checksum: have the next open of this log
        scan every segment (closed ones are otherwise trusted by their catalog entry),
        so recovery cuts the log at the bad frame and marks it for repair."""
        batch = self._db.batch()
        batch.put(group_key(CHECK_ALL, self.group), b"1")
        self._db.write(batch, sync=True)

    def mark_repaired(self) -> None:
        """The node caught up from its leader: clear the needs-repair marker."""
        batch = self._db.batch()
        batch.delete(group_key(REPAIR, self.group))
        self._db.write(batch, sync=True)
        self.repair_reason = None
        self.repair_until = Index(0)
