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
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raftlog.messages import ENTRY_OVERHEAD_BYTES, Entry, HardState, Membership, Snapshot
from raftlog.storage import CompactedError, InitialState, UnavailableError
from raftlog.types import GroupId, Index, Offset, Term
from storage import catalog
from storage.config import FlushMode, StoreConfig
from storage.errors import CorruptionError, DiskFullError, SyncFailedError
from storage.files import Files
from storage.frames import FRAME_HEADER_BYTES, FrameInfo, encode_frame, parse_frame, record_count_of
from storage.node_state import StartPoint, encode_applied, encode_hard_state, encode_start
from storage.recovery import RecoveryReport, recover
from storage.segment import Segment, segment_name
from storage.state_db import (
    APPLIED,
    CHECK_ALL,
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


# The newest entries appended, kept in memory until this many or this many bytes:
# a write is applied (leader) or learned committed (follower) moments after it was
# appended, and reading it back from the file (a read, a frame parse, a CRC) sat on
# every write's critical path. Small, as a node holds thousands of logs; an entry
# larger than the whole budget is not kept (large batches are read from the file).
RECENT_ENTRIES_MAX = 64
RECENT_BYTES_MAX = 64 * 1024


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SegmentStore:
    """One group's log. Not thread-safe: the node's event loop owns it."""

    def __init__(
        self,
        group: GroupId,
        directory: str,
        db: StateDatabase,
        files: Files,
        config: StoreConfig | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.group, self.directory, self._db, self._files = group, directory, db, files
        self.closed = False  # set by close(); the flusher skips a closed store
        self.config = config or StoreConfig()
        self._clock_ms = clock_ms
        recovered = recover(group, directory, db, files, clock_ms(), self.config.verify_crc)
        self.recovery: RecoveryReport = recovered.report
        self.repair_reason: str | None = recovered.repair_reason
        self._start: StartPoint = recovered.start
        self._segments: list[Segment] = recovered.segments
        self._term_starts, self._terms = recovered.term_starts, recovered.terms
        self._hard_state = self._durable_hard_state = recovered.hard_state
        self._opened_hard_state = recovered.hard_state  # what persist_vote=False keeps writing
        self._applied = recovered.applied
        self._dirty: dict[int, Segment] = {}
        # The log's newest entries (contiguous, ending at last_index()), or nothing.
        self._recent: deque[Entry] = deque()
        self._recent_bytes = 0
        self._state_changed = False
        self._durable_index = self.last_index()
        self._truncations = 0
        self._unsynced_bytes = 0
        # Syncs begun and not yet finished, in the order they began: one that finishes
        # early (a small one, on the loop) must not report entries that an earlier one
        # (on the fsync thread) is still making durable.
        self._syncs: deque[list[Any]] = deque()
        self._sync_failure: str | None = None
        self._last_fsync_ms = clock_ms()
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

    # -- read side (LogStorage) ------------------------------------------------

    def initial_state(self) -> InitialState:
        membership = self._start.snapshot.meta.membership
        if self._applied is not None:
            membership = self._applied[1]
        return InitialState(
            hard_state=self._hard_state,
            membership=membership,
            needs_repair=self.repair_reason is not None,
        )

    def first_index(self) -> Index:
        return Index(self._start.snapshot.meta.index + 1)

    def last_index(self) -> Index:
        if self._segments and self._segments[-1].last_index > self._start.snapshot.meta.index:
            return self._segments[-1].last_index
        return self._start.snapshot.meta.index

    def term(self, index: Index) -> Term:
        start = self._start.snapshot.meta
        if index == start.index:
            return start.term
        if index < start.index:
            raise CompactedError(f"index {index} is below the first index {start.index + 1}")
        if index > self.last_index():
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        run = bisect_right(self._term_starts, index) - 1
        assert run >= 0, "every retained entry lies in a term run"
        return Term(self._terms[run])

    def entries(self, lo: Index, hi: Index, max_bytes: int) -> list[Entry]:
        self._check_range(lo, hi)
        selected: list[Entry] = []
        total = 0
        recent = self._recent
        if recent and lo >= recent[0].index:
            assert recent[-1].index == self.last_index(), "the recent entries end the log"
            for position in range(lo - recent[0].index, hi - recent[0].index):
                entry = recent[position]
                total += len(entry.payload) + ENTRY_OVERHEAD_BYTES
                if total > max_bytes and selected:
                    break
                selected.append(entry)
            return selected
        for info, payload in self._frames(lo, hi):
            total += len(payload) + ENTRY_OVERHEAD_BYTES
            if total > max_bytes and selected:
                break
            selected.append(Entry(info.index, info.term, info.kind, payload.tobytes()))
        return selected

    def snapshot(self) -> Snapshot:
        return self._start.snapshot

    def _check_range(self, lo: Index, hi: Index) -> None:
        if lo <= self._start.snapshot.meta.index:
            raise CompactedError(f"index {lo} is below the first index {self.first_index()}")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} is beyond the last index {self.last_index()}")
        assert lo <= hi, "ranges are half-open [lo, hi)"

    # -- positions -------------------------------------------------------------

    def _segment_of(self, index: Index) -> Segment:
        slot = bisect_right([s.first_index for s in self._segments], index) - 1
        assert slot >= 0, f"index {index} precedes every segment"
        return self._segments[slot]

    def _position(self, segment: Segment, index: Index) -> int:
        if index == segment.last_index + 1:
            return segment.size
        if not segment.closed:
            return segment.open_position(index)
        value = self._db.get(int_key(INDEX, self.group, index))
        if value is None:
            raise CorruptionError(f"index key of entry {index} is missing")
        first, position = catalog.INDEX_VALUE.unpack(value)
        assert first == segment.first_index
        return position

    def _frames(self, lo: Index, hi: Index) -> Iterator[tuple[FrameInfo, memoryview]]:
        """Frames of [lo, hi) in order, each checked by CRC (never served corrupt)."""
        index = lo
        while index < hi:
            segment = self._segment_of(index)
            segment_hi = min(hi, Index(segment.last_index + 1))
            position = self._position(segment, index)
            end = self._position(segment, segment_hi)
            yield from self._frames_in(segment, index, position, end)
            index = segment_hi

    def _frames_in(
        self, segment: Segment, index: Index, position: int, end: int
    ) -> Iterator[tuple[FrameInfo, memoryview]]:
        verify_crc = self.config.verify_crc
        while position < end:
            chunk = self._files.read(
                segment.handle, position, min(end - position, self.config.read_chunk_bytes)
            )
            buffer, offset = memoryview(chunk), 0
            while True:
                parsed = parse_frame(buffer, offset, verify_crc)
                if parsed is None:
                    break
                info, payload = parsed
                if info.index != index:
                    raise CorruptionError(f"entry {index} is stored as {info.index}")
                yield info, payload
                index, offset = Index(index + 1), info.end
            if offset == 0:  # one frame larger than the chunk
                declared = int.from_bytes(buffer[:4], "big") + 4
                if position + declared > end:
                    raise CorruptionError(f"frame of entry {index} runs past its segment")
                buffer = memoryview(self._files.read(segment.handle, position, declared))
                parsed = parse_frame(buffer, 0, verify_crc)
                assert parsed is not None
                yield parsed
                index, offset = Index(index + 1), declared
            position += offset

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
        self._remember(entries)

    def _remember(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Keep the newest entries in memory (RECENT_ENTRIES_MAX, RECENT_BYTES_MAX)."""
        recent = self._recent
        assert not recent or recent[-1].index == entries[0].index - 1, "append truncated first"
        for entry in entries:
            recent.append(entry)
            self._recent_bytes += len(entry.payload)
        while recent and (len(recent) > RECENT_ENTRIES_MAX or self._recent_bytes > RECENT_BYTES_MAX):
            self._recent_bytes -= len(recent.popleft().payload)

    def _forget_recent(self, from_index: Index | None = None) -> None:
        """Drop the remembered entries from `from_index` on (all of them by default)."""
        recent = self._recent
        while recent and (from_index is None or recent[-1].index >= from_index):
            self._recent_bytes -= len(recent.pop().payload)

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
        self._forget_recent()  # these frames have no Entry objects to remember
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
        self._unsynced_bytes += segment.size - size_before
        for info in infos:
            segment.add_frame(info)
            if not self._terms or self._terms[-1] != info.term:
                self._term_starts.append(info.index)
                self._terms.append(info.term)
        self._dirty[id(segment)] = segment

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
        return FlushResult(self._durable_index, fsyncs)

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
        return self._unsynced_bytes

    def interval_sync_due_ms(self) -> int | None:
        """Under the `interval_ms` policy, with appends not yet fsynced: in how many ms the
        interval is up (0: now). None otherwise. Without a later write nothing would ask
        for that fsync, and an idle log's last appends would wait for the OS."""
        policy = self.config.flush
        if policy.mode is not FlushMode.INTERVAL or self._unsynced_bytes == 0 or self.closed:
            return None
        return max(0, policy.interval_ms - (self._clock_ms() - self._last_fsync_ms))

    @property
    def sync_in_flight(self) -> bool:
        """A sync was started and its fsyncs have not all finished (they run on another thread)."""
        return bool(self._syncs)

    def start_sync(self, detached: bool = True) -> PendingSync | None:
        """Begin making what was appended durable: the returned fsyncs may run on another
        thread (the event loop goes on meanwhile); `finish_sync` then records them. None:
        the policy says it is not time. `detached=False`: the fsyncs run on this thread
        before anything else touches the store, so they use the open descriptors (no
        duplicate to make and close per segment, which a flush per write pays)."""
        if self._sync_failure is not None:
            raise SyncFailedError(f"an earlier fsync failed ({self._sync_failure}); reopen the log")
        policy, now = self.config.flush, self._clock_ms()
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
        ticket = [self.last_index(), self._truncations, False]
        self._syncs.append(ticket)
        return PendingSync(tuple(fsyncs), self.last_index(), count, appended, now, ticket)

    def finish_sync(self, pending: PendingSync) -> None:
        """The fsyncs of `pending` completed. Once every sync begun before it finished too,
        what was appended before it began is durable (unless the log was truncated since:
        then the truncation already said how far)."""
        pending.ticket[2] = True
        while self._syncs and self._syncs[0][2]:
            durable_index, truncations, _ = self._syncs.popleft()
            if truncations == self._truncations:
                self._durable_index = max(self._durable_index, durable_index)
        self._last_fsync_ms = pending.now_ms

    def abandon_sync(self, error: BaseException) -> None:
        """A sync's fsyncs failed: nothing more is reported durable, and every later
        `start_sync` raises `SyncFailedError` (the group fails and is reopened)."""
        self._sync_failure = repr(error)
        self._syncs.clear()

    def _fsync(self, segment: Segment) -> None:
        with _disk_full_typed(segment.path):
            self._files.fsync(segment.handle)

    def vote_unsaved(self) -> bool:
        """Would `stage_state` stage a new term or vote (a write that must be synced)?"""
        if not self._state_changed:
            return False
        stored, durable = self._hard_state_to_store(), self._durable_hard_state
        return (stored.term, stored.vote) != (durable.term, durable.vote)

    def _hard_state_to_store(self) -> HardState:
        hard = self._hard_state
        if self.config.persist_vote:
            return hard
        # The vote-without-persist control: a restart forgets term and vote.
        opened = self._opened_hard_state
        return HardState(term=opened.term, vote=opened.vote, commit=hard.commit)

    def stage_state(self, batch) -> bool:
        """Stage changed node state into `batch`; True when term or vote changed,
        which must be synced whatever the flush policy (a node never votes twice)."""
        if not self._state_changed:
            return False
        durable, stored = self._durable_hard_state, self._hard_state_to_store()
        if self.config.flush.mode is FlushMode.FSYNC and stored.commit > self._durable_index:
            # Entries may be appended while an fsync runs on another thread: the commit
            # index is stored only as far as the log is durable, so a crash never leaves
            # a log ending below its recorded commit (which would read as lost entries).
            stored = dataclasses.replace(stored, commit=self._durable_index)
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
        self._fsync(segment)
        self._dirty.pop(id(segment), None)
        # The file CRC is computed when a transfer first asks for it (transfer.py):
        # reading 64 MiB back here cost more per entry than the appends themselves.
        segment.crc = None
        batch = self._db.batch()
        catalog.stage_close(batch, self.group, segment, self._term_starts, self._terms)
        self._db.write(batch, sync=False)

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
        self._forget_recent(index)
        self._dirty[id(segment)] = segment
        self._durable_index = min(self._durable_index, Index(index - 1))
        self._truncations += 1

    def _offset_at(self, segment: Segment, index: Index) -> Offset:
        """The base offset stored in entry `index`'s frame header."""
        if index == segment.last_index + 1:
            return segment.next_offset
        position = self._position(segment, index)
        header = memoryview(self._files.read(segment.handle, position, FRAME_HEADER_BYTES))
        return Offset(int.from_bytes(header[26:34], "big"))

    def _reopen(self, segment: Segment, batch) -> None:
        """A closed segment becomes the open one again: rebuild its memory tables."""
        from storage.segment import scan_segment

        result = scan_segment(self._files, segment.handle, segment.first_index, self.config.verify_crc)
        if result.error is not None:
            raise CorruptionError(f"closed segment {segment.first_index}: {result.error}")
        segment.closed = False
        segment.last_index = Index(segment.first_index - 1)
        segment.next_offset = segment.first_offset
        for info in result.frames:
            segment.add_frame(info)
        batch.delete(int_key(CLOSED_SEGMENT, self.group, segment.first_index))

    def _drop_segment_file(self, segment: Segment, batch) -> None:
        self._files.close(segment.handle)
        self._files.unlink(segment.path)
        self._dirty.pop(id(segment), None)
        batch.delete(int_key(CLOSED_SEGMENT, self.group, segment.first_index))

    def close(self) -> None:
        for segment in self._segments:
            self._files.close(segment.handle)
        self._segments = []
        self._forget_recent()
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
        if next_offset is None:
            next_offset = Offset(getattr(snapshot.data, "next_offset", 0))
        batch = self._db.batch()
        for segment in self._segments:
            self._drop_segment_file(segment, batch)
        self._segments = []
        self._dirty.clear()
        delete_int_range(batch, INDEX, self.group, 0)
        delete_int_range(batch, OFFSET, self.group, 0)
        delete_int_range(batch, TERM_RUN, self.group, 0)
        batch.delete(int_key(NEWEST_SEGMENT, self.group, 0))
        self._db.write(batch, sync=False)
        self._files.sync_dir(self.directory)
        self._term_starts, self._terms = [], []
        self._forget_recent()
        self._set_start(StartPoint(snapshot, next_offset))
        self._durable_index = self.last_index()

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

    # -- offsets ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> Offset:
        return self._start.next_offset

    @property
    def log_end_offset(self) -> Offset:
        if self._segments:
            return self._segments[-1].next_offset
        return self._start.next_offset

    def offset_after(self, index: Index) -> Offset:
        """The offset of the first record after entry `index` (the high watermark
        when `index` is the commit index). One function converts Index to Offset."""
        if index == self._start.snapshot.meta.index:
            return self._start.next_offset
        self._check_range(index, Index(index + 1))
        segment = self._segment_of(index)
        return (
            self._offset_at(segment, Index(index + 1))
            if index < segment.last_index
            else (segment.next_offset)
        )

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def db(self) -> StateDatabase:
        return self._db

    @property
    def files(self) -> Files:
        return self._files

    def frames(self, lo: Index, hi: Index) -> Iterator[tuple[FrameInfo, memoryview]]:
        self._check_range(lo, hi)
        return self._frames(lo, hi)

    def segment_of(self, index: Index) -> Segment:
        return self._segment_of(index)


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
