"""Reopen a group's log after any stop, clean or not.

What a crash can leave, and what happens to it:
- a torn tail of the last segment (a frame cut short, or a bad frame with nothing
  valid after it, above the commit index): truncated; a power failure loses only
  unsynced bytes, and unsynced entries were never acknowledged;
- a bad frame that is followed by a valid one, or sits at or below the commit
  index, or a closed segment whose size no longer matches its catalog entry, or a
  missing segment: corruption. The log is cut before it (never served), and a
  durable needs-repair marker is set so the node stays out of elections until
  it has caught up from the leader (`mark_repaired`);
- segments wholly below the start point (an unfinished compaction): deleted;
- closed segments without a catalog entry (the catalog write was lost): scanned
  and catalogued again; the open segment is always scanned, which rebuilds its
  in-memory index. A closed segment whose size matches its entry is trusted
  without reading it, unless a running replica met a bad frame since
  (`SegmentStore.request_full_check`): then every segment is scanned once, and the
  bad frame is handled as above.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass, field

from raftlog.messages import HardState, Membership, Snapshot, SnapshotMeta
from raftlog.types import GroupId, Index, Offset, Term
from storage.catalog import CatalogEntry, load_catalog, load_term_runs, stage_close
from storage.files import Files
from storage.frames import FrameCheck, crc_matches
from storage.node_state import (
    StartPoint,
    decode_applied,
    decode_hard_state,
    decode_start,
)
from storage.segment import (
    PARTIAL_SUFFIX,
    Segment,
    parse_segment_name,
    scan_segment,
)
from storage.state_db import (
    APPLIED,
    CHECK_ALL,
    CLOSED_SEGMENT,
    HARD_STATE,
    NEWEST_SEGMENT,
    REPAIR,
    SNAPSHOT,
    TERM_RUN,
    StateDatabase,
    group_key,
    int_key,
)
from storage.tree_sidecar import discard, forget_sidecar, is_sidecar, segment_of_sidecar


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    truncated_tail_bytes: int = 0
    rescanned_segments: int = 0
    removed_segments: int = 0
    corruption: tuple[str, ...] = ()

    @property
    def needs_repair(self) -> bool:
        return bool(self.corruption)


@dataclass(slots=True)
class Recovered:
    start: StartPoint
    hard_state: HardState
    applied: tuple[Index, Membership] | None
    segments: list[Segment]
    term_starts: list[int]
    terms: list[int]
    repair_reason: str | None
    report: RecoveryReport
    corruption: list[str] = field(default_factory=list)


def load_state(db: StateDatabase, group: GroupId) -> tuple[StartPoint, HardState, tuple | None]:
    raw_start = db.get(group_key(SNAPSHOT, group))
    if raw_start is None:
        meta = SnapshotMeta(index=Index(0), term=Term(0), membership=Membership())
        start = StartPoint(snapshot=Snapshot(meta=meta), next_offset=Offset(0))
    else:
        start = decode_start(raw_start)
    raw_hard = db.get(group_key(HARD_STATE, group))
    hard_state = HardState() if raw_hard is None else decode_hard_state(raw_hard)
    raw_applied = db.get(group_key(APPLIED, group))
    applied = None if raw_applied is None else decode_applied(raw_applied)
    return start, hard_state, applied


class _Walk:
    """The recovery of one group, step by step (state shared by the steps)."""

    def __init__(
        self, group: GroupId, directory: str, db: StateDatabase, files: Files, now_ms: int,
        frame_check: FrameCheck = crc_matches,
    ) -> None:
        self.group, self.directory, self.db, self.files, self.now_ms = (
            group, directory, db, files, now_ms,
        )  # fmt: skip
        self.frame_check = frame_check
        self.start, self.hard_state, self.applied = load_state(db, group)
        self.catalog = load_catalog(db, group)
        self.batch = db.batch()
        self.segments: list[Segment] = []
        self.corruption: list[str] = []
        self.truncated_bytes = 0
        self.rescanned = 0
        self.removed = 0
        self.directory_changed = False
        self.term_starts: list[int] = []
        self.stored_term_starts: list[int] = []
        self.terms: list[int] = []
        self.check_all = db.get(group_key(CHECK_ALL, group)) is not None

    def _remove(self, path: str, first: Index) -> None:
        self.files.unlink(path)
        forget_sidecar(self.files, path)
        self.batch.delete(int_key(CLOSED_SEGMENT, self.group, first))
        self.removed += 1
        self.directory_changed = True

    def segment_files(self) -> list[tuple[Index, str]]:
        found = []
        names = self.files.list_dir(self.directory)
        present = set(names)
        for name in names:
            path = os.path.join(self.directory, name)
            described = segment_of_sidecar(name)
            # An unfinished segment install or sidecar write, or a tree sidecar whose segment
            # is gone (a drop the crash interrupted): a sidecar is only ever a cache of its segment.
            if is_sidecar(name) and (described is None or described not in present):
                self.directory_changed |= discard(self.files, path)  # an OSError logged: a cache
                continue
            if name.endswith(PARTIAL_SUFFIX):
                self.files.unlink(path)
                self.directory_changed = True
                continue
            first = parse_segment_name(name)
            if first is not None:
                found.append((first, path))
        return sorted(found)

    def drop_compacted(self, found: list[tuple[Index, str]]) -> list[tuple[Index, str]]:
        """Finish a compaction a crash interrupted: drop segments wholly below the start."""
        start_next = self.start.snapshot.meta.index + 1
        while len(found) > 1 and found[1][0] <= start_next:
            self._remove(found[0][1], found[0][0])
            found = found[1:]
        if found and found[0][0] > start_next:
            self.corruption.append(f"segment {found[0][0]} leaves a gap after start {start_next}")
        return found

    def run(self) -> None:
        found = self.drop_compacted(self.segment_files())
        self.term_starts, self.terms = load_term_runs(self.db, self.group, Index(2**63))
        self.stored_term_starts = list(self.term_starts)  # what the database holds (see _scan)
        expected_offset: Offset | None = None
        for position, (first, path) in enumerate(found):
            last = position == len(found) - 1
            if self.corruption or (self.segments and first != self.segments[-1].last_index + 1):
                if not self.corruption:
                    self.corruption.append(f"segment {first} does not follow its predecessor")
                self._remove(path, first)
                continue
            self._load(first, path, last, expected_offset)
            if self.segments:
                expected_offset = self.segments[-1].next_offset
        self._check_witnesses()

    def _load(self, first: Index, path: str, last: bool, expected_offset: Offset | None) -> None:
        handle = self.files.open(path)
        entry = self.catalog.get(first)
        if entry is not None and not last and not self.check_all:
            if self._catalog_matches(entry, handle.size, expected_offset):
                self.segments.append(_closed_segment(path, handle, entry))
                return
            self.corruption.append(f"closed segment {first} does not match its catalog entry")
        self._scan(first, path, handle, last, expected_offset)

    @staticmethod
    def _catalog_matches(entry: CatalogEntry, size: int, expected_offset: Offset | None) -> bool:
        return size == entry.size and expected_offset in (None, entry.first_offset)

    def _scan(self, first: Index, path, handle, last: bool, expected_offset) -> None:
        self.rescanned += 1
        result = scan_segment(self.files, handle, first, self.frame_check)
        if result.frames:
            first_offset = result.frames[0].base_offset
        else:
            first_offset = self.start.next_offset if expected_offset is None else expected_offset
        # Term runs from this segment on are rebuilt from its frames.
        keep = bisect_left(self.term_starts, first)
        del self.term_starts[keep:], self.terms[keep:]
        # Only the stored ones are deleted, key by key: the range delete used before
        # (`delete_int_range`) also wrote a tombstone at the range's top on every open,
        # nearly always for nothing, and seeks then stepped over thousands of them.
        stored = bisect_left(self.stored_term_starts, first)
        for start in self.stored_term_starts[stored:]:
            self.batch.delete(int_key(TERM_RUN, self.group, start))
        del self.stored_term_starts[stored:]
        segment = Segment(
            first_index=first, path=path, handle=handle, first_offset=Offset(first_offset),
            created_ms=self.now_ms, last_index=Index(first - 1),
            next_offset=Offset(first_offset), crc=result.crc,
        )  # fmt: skip
        for info in result.frames:
            segment.add_frame(info)
            if not self.terms or self.terms[-1] != info.term:
                self.term_starts.append(info.index)
                self.terms.append(info.term)
        if result.error is not None:
            self._handle_bad_tail(segment, result.error, result.frame_after_error, last)
            if result.valid_bytes < handle.size:
                self.truncated_bytes += handle.size - result.valid_bytes
                self.files.truncate(handle, result.valid_bytes)
                self.files.fsync(handle)
        self.segments.append(segment)
        if not last and not self.corruption:
            stage_close(self.batch, self.group, segment, self.term_starts, self.terms)

    def _handle_bad_tail(self, segment: Segment, error: str, followed: bool, last: bool) -> None:
        bad_index = segment.last_index + 1
        if not last or followed or bad_index <= self.hard_state.commit:
            self.corruption.append(f"segment {segment.first_index}, entry {bad_index}: {error}")

    def _check_witnesses(self) -> None:
        """Durable facts the log must still satisfy: the newest segment and the commit."""
        raw_newest = self.db.get(int_key(NEWEST_SEGMENT, self.group, 0))
        if raw_newest is not None:
            newest = int.from_bytes(raw_newest, "big")
            if not self.segments or self.segments[-1].first_index < newest:
                self.corruption.append(f"newest segment {newest} is missing")
        last = self.segments[-1].last_index if self.segments else self.start.snapshot.meta.index
        if self.hard_state.commit > last:
            self.corruption.append(f"log ends at {last}, below the commit {self.hard_state.commit}")

    def finish(self) -> Recovered:
        repair = self.db.get(group_key(REPAIR, self.group))
        reason = repair.decode() if repair is not None else None
        if self.corruption:
            reason = "; ".join(self.corruption)
            self.batch.put(group_key(REPAIR, self.group), reason.encode())
        if self.check_all:
            self.batch.delete(group_key(CHECK_ALL, self.group))
        # Synced only when this recovery changed the disk or found damage. A clean walk
        # writes only what the next walk would write again (the open segment's term runs
        # cleared, rescanned segments' catalog entries), and RocksDB's log keeps writes in
        # order, so any later synced write makes it durable too; meanwhile a crash loses
        # nothing the next recovery does not redo. A synced write holds the interpreter
        # for its fsync (DEPS.md), and a node restarting with thousands of replicas made
        # one per replica in its open pass.
        changed = bool(self.corruption or self.truncated_bytes or self.directory_changed or self.check_all)
        self.db.write(self.batch, sync=changed)
        if self.directory_changed:
            self.files.sync_dir(self.directory)
        last = self.segments[-1].last_index if self.segments else self.start.snapshot.meta.index
        while self.term_starts and self.term_starts[-1] > last:
            self.term_starts.pop()
            self.terms.pop()
        report = RecoveryReport(
            self.truncated_bytes, self.rescanned, self.removed, tuple(self.corruption)
        )
        return Recovered(
            self.start, self.hard_state, self.applied, self.segments,
            self.term_starts, self.terms, reason, report,
        )  # fmt: skip


def _closed_segment(path: str, handle, entry: CatalogEntry) -> Segment:
    return Segment(
        first_index=entry.first_index, path=path, handle=handle, first_offset=entry.first_offset,
        created_ms=entry.created_ms, closed=True, last_index=entry.last_index,
        next_offset=entry.next_offset, crc=entry.crc or None,
    )  # fmt: skip


def recover(
    group: GroupId, directory: str, db: StateDatabase, files: Files, now_ms: int,
    frame_check: FrameCheck = crc_matches,
) -> Recovered:
    """The group's log and state as the disk holds them; `frame_check` judges each scanned
    frame's CRC (the store's, so a check that lets bad frames through keeps them)."""
    files.make_dirs(directory)
    walk = _Walk(group, directory, db, files, now_ms, frame_check)
    walk.run()
    return walk.finish()
