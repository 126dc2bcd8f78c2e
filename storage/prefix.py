"""A mirror partition's kept prefix: a new group's first log built from another group's files.

A mirror partition whose committed batches differ from its source's from offset X on is
replaced by a new incarnation (a new Raft group, docs/mirror.md "Repair"). Its batches
below X were identical; each host keeps them: the new group's log starts as the old
group's, from that host's own start point up to a cut entry named by the catalog (the last
one whose records all lie below X), and the real-time path refills from there.

Here, the disk side, pure reads and checks (multiraft/node/mirror_prefix.py runs them):

- `plan_prefix` reads a stopped replica of the old group and says which of its files
  keep which entries, or why it cannot keep them: the cut entry must be there with the
  catalog's term and next offset. Raft's log matching then says every entry up to it is
  the committed one every replica holds, byte for byte: a replica whose entry at that
  index has that term holds the same entries before it.
- The files are taken whole (a hard link: closed segments never change) or, for the one
  holding the cut entry, copied up to that entry's end, as `<segment>.incoming` next to
  the new log (storage/far_install.py's staging names), then `check_kept` reads each whole
  (every frame by CRC, indexes and offsets contiguous, ending where the plan says).
- `far_install.replace_log` installs them as the new group's log, as far-horizon catch-up
  installs a leader's files, with one difference: the commit stays at the start point.
  These entries are committed in the old group, not yet in this one; a leader of the new
  group commits them with its first entry. So a host that could not keep them (and
  started as a new replica would: at the old group's first start point, or empty) can
  never find entries it lacks already counted committed, and may even lead: then the
  kept entries go as any uncommitted ones, and the refill is a full copy, as a resync
  without a prefix. For that, such a host starts at the cut's term, not the bootstrap
  term (multiraft/node/mirror_bootstrap.py): a leader's entries then conflict with kept
  ones at the same index, never pass for them.
- Only a log that still starts at the old group's **first start point** keeps its
  prefix (none compacted by retention yet). A start point is committed state: a replica
  starting later would count committed entries that a replica which kept nothing (and
  starts at the first start point) does not hold, and if that one led, Raft's
  invariants would not hold. So every replica of the new group holds a prefix of one
  log, the first start point followed by the old group's committed entries, with its
  commit at that first start point.

Crash safety: a marker file (`PREFIX_MARKER`) sits in the new group's directory from
before the first file until the install's last write; a directory with the marker is an
unfinished build, which the next open forgets whole (`forget_group_state` and the files)
before it starts the group afresh. The group never ran before that: nothing was sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.types import GroupId, Index, Offset, Term
from storage.errors import CorruptionError
from storage.far_install import StagedSegment
from storage.files import OsFiles
from storage.node_state import StartPoint
from storage.segment import scan_segment
from storage.segments import SegmentStore
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
from storage.transfer import SegmentDescriptor

PREFIX_MARKER = "prefix-building"  # in a new group's directory while its prefix is built


@dataclass(frozen=True, slots=True)
class KeptFile:
    """One segment file of the old group and what the new one keeps of it."""

    source: str  # the old group's file
    first_index: Index
    last_index: Index  # the last entry kept from it
    size_bytes: int  # bytes kept: the whole file, or up to the end of `last_index`
    whole: bool  # a closed segment kept whole (linked), else copied up to the cut
    first_offset: Offset
    next_offset: Offset  # after `last_index`


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    start: StartPoint  # the old replica's own start point
    upto: Index
    term: Term
    next_offset: Offset
    files: tuple[KeptFile, ...]

    @property
    def kept_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def plan_prefix(store: SegmentStore, upto: Index, term: Term, next_offset: Offset,
                first_start: tuple[Index, Term]) -> PrefixPlan | str:
    """What `store` (a replica of the old group, stopped) keeps up to entry `upto`; or why
    it keeps nothing. Reads only the store's tables and the cut entry's position.
    `first_start`: (index, term) of the old group's first start point, the one its log
    must still start at (module docstring: every replica's commit stays there)."""
    meta = store.snapshot().meta
    start = meta.index
    if store.repair_reason is not None:
        return f"this replica is in repair ({store.repair_reason})"
    if (meta.index, meta.term) != first_start:
        return f"its log starts at {start + 1} (term {meta.term}), not at its first start point {first_start}"
    if upto <= start:
        return f"its log starts at {start + 1}, past the cut {upto}"
    if upto > store.last_index():
        return f"its log ends at {store.last_index()}, before the cut {upto}"
    if store.term(upto) != term:
        return f"its entry {upto} has term {store.term(upto)}, not {term}"
    if store.offset_after(upto) != next_offset:
        return f"its entry {upto} ends at offset {store.offset_after(upto)}, not {next_offset}"
    segments = [s for s in store.segments if s.first_index <= upto]
    if not segments or segments[0].first_index != start + 1:
        return "its first segment does not start right after its start point"
    files = []
    for segment in segments:
        if segment.closed and segment.last_index <= upto:
            files.append(KeptFile(segment.path, segment.first_index, segment.last_index, segment.size, True,
                                  segment.first_offset, segment.next_offset))
            continue
        holder, end = store.frame_end(upto)
        assert holder is segment, "only the last file kept is cut"
        files.append(KeptFile(segment.path, segment.first_index, upto, end, False, segment.first_offset,
                              next_offset))
    assert files[-1].last_index == upto and files[-1].next_offset == next_offset
    return PrefixPlan(StartPoint(store.snapshot(), store.log_start_offset), upto, term, next_offset, tuple(files))


def check_kept(path: str, kept: KeptFile) -> StagedSegment:
    """Read a staged kept file whole and check it against the plan (any thread: its own
    `OsFiles`, no store state): every frame by CRC, contiguous from its first index, its
    size, its last entry and offsets. Returns it as far_install stages a received file."""
    files = OsFiles()
    handle = files.open(path)
    try:
        result = scan_segment(files, handle, kept.first_index)
    finally:
        files.close(handle)
    frames, problem = result.frames, None
    if result.error is not None:
        problem = result.error
    elif result.valid_bytes != kept.size_bytes:
        problem = f"it holds {result.valid_bytes} valid bytes of {kept.size_bytes}"
    elif not frames or frames[-1].index != kept.last_index:
        problem = f"it does not end at entry {kept.last_index}"
    elif frames[0].base_offset != kept.first_offset or frames[-1].next_offset != kept.next_offset:
        problem = "its offsets differ from the old log's"
    if problem is not None:
        raise CorruptionError(f"kept segment {kept.first_index}: {problem}")
    descriptor = SegmentDescriptor(kept.first_index, kept.last_index, kept.size_bytes, result.crc,
                                   kept.first_offset, kept.next_offset)
    return StagedSegment(descriptor, path, tuple(frames), result.crc)


def forget_group_state(db: StateDatabase, group: GroupId) -> None:
    """Delete every database record of `group` (an unfinished build), in one synced write."""
    batch = db.batch()
    for kind in (HARD_STATE, APPLIED, SNAPSHOT, REPAIR, CHECK_ALL, CHECKPOINT):
        batch.delete(group_key(kind, group))
    batch.delete(int_key(NEWEST_SEGMENT, group, 0))
    for kind in (CLOSED_SEGMENT, INDEX, OFFSET, TERM_RUN):
        delete_int_range(batch, kind, group, 0)
    db.write(batch, sync=True)
