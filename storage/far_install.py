"""Far-horizon catch-up, the follower's disk side: check received segments, then put
them in place of the log.

A follower far behind its leader receives the leader's closed segment files (whole,
byte for byte: storage/transfer.py lists and reads them) instead of their entries one
append at a time (multiraft/node/catchup_follower.py fetches them). Here:

- `check_staged` reads a received file once, off the event loop (its own `OsFiles`,
  no store state): every frame by CRC, contiguous indexes and offsets, the announced
  size, CRC, first and last index and offsets. The frames it found are what the
  install catalogues, so the reopen that follows trusts the files without reading
  them again (only the last one, which becomes the open segment, is scanned).
- `replace_log` swaps the group's log, the group closed: the leader's start point,
  its files, and a commit at the end of the last file. It is a snapshot install
  whose snapshot keeps the retained entries: the follower ends with the leader's
  whole retained log, not just its state. With the leader's state machine at the
  last entry (its checkpoint), the reopen starts there and replays nothing; without
  one it replays the log as after a restart. The caller installs only entries the leader committed
  and only where the follower does not hold the last of them (a follower holding it
  could hold committed entries after it, which must never go).

Crash safety, step by step: (1) the old catalog and index go and the next open is
told to scan every segment (one synced write); (2) the old files go; (3) the new ones
(staged next to the log as `<segment>.incoming`, so a rename stays in its directory)
are renamed in; (4) one synced write puts the new start point, hard state, catalog and
index. A crash before (4) leaves files the old start point does not lead to, or
none: recovery finds the gap or the missing log, marks the replica for repair (no
vote until caught up) and the leader refills it, as after any damage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from raftlog.messages import HardState
from raftlog.types import GroupId, Index, NodeId, Term
from storage.catalog import stage_close
from storage.errors import CorruptionError
from storage.far_receive import CRC_UNKNOWN
from storage.files import Files, OsFiles
from storage.frames import FrameInfo
from storage.node_state import StartPoint, encode_hard_state, encode_start
from storage.recovery import load_state
from storage.segment import PARTIAL_SUFFIX, Segment, parse_segment_name, scan_segment, segment_name
from storage.state_db import (
    APPLIED,
    CHECK_ALL,
    CHECKPOINT,
    CLOSED_SEGMENT,
    HARD_STATE,
    INDEX,
    NEWEST_SEGMENT,
    OFFSET,
    SNAPSHOT,
    TERM_RUN,
    StateDatabase,
    delete_int_range,
    group_key,
    int_key,
)
from storage.transfer import SegmentDescriptor
from storage.tree_sidecar import is_sidecar

STAGED_SUFFIX = ".incoming"  # a received segment next to the log, not part of it yet


def staged_name(first_index: Index) -> str:
    return segment_name(first_index) + STAGED_SUFFIX


def is_staged(name: str) -> bool:
    return name.removesuffix(PARTIAL_SUFFIX).endswith(STAGED_SUFFIX)


@dataclass(frozen=True, slots=True)
class StagedSegment:
    """A received segment, checked, waiting in the staging directory."""

    descriptor: SegmentDescriptor
    path: str
    frames: tuple[FrameInfo, ...]
    crc: int  # of the whole file, as checked (the descriptor's may be CRC_UNKNOWN)


def check_staged(path: str, descriptor: SegmentDescriptor) -> StagedSegment:
    """Read a received segment whole and check it against its descriptor (any thread).
    A descriptor whose CRC is CRC_UNKNOWN (a stream's offer) leaves the CRC to its caller,
    which compares the one returned with the leader's (sent after the file)."""
    files = OsFiles()
    handle = files.open(path)
    try:
        result = scan_segment(files, handle, descriptor.first_index)
    finally:
        files.close(handle)
    frames = result.frames
    problem = None
    if result.error is not None:
        problem = result.error
    elif result.valid_bytes != descriptor.size_bytes or descriptor.crc not in (CRC_UNKNOWN, result.crc):
        problem = "its size or CRC differs from the leader's"
    elif not frames or frames[-1].index != descriptor.last_index:
        problem = f"it does not end at entry {descriptor.last_index}"
    elif frames[0].base_offset != descriptor.first_offset or frames[-1].next_offset != descriptor.next_offset:
        problem = "its offsets differ from the leader's"
    if problem is not None:
        raise CorruptionError(f"received segment {descriptor.first_index}: {problem}")
    return StagedSegment(descriptor, path, tuple(frames), result.crc)


def replace_log(
    group: GroupId, directory: str, db: StateDatabase, files: Files, staged: list[StagedSegment],
    start: StartPoint, leader_term: Term, now_ms: int, checkpoint: StartPoint | None = None,
    commit: Index | None = None,
) -> HardState:
    """Put `staged` (contiguous, from the entry after `start`) in place of the group's log,
    the group closed; returns the hard state written (commit: `commit`, by default the
    last staged entry, or the follower's own if higher).
    `checkpoint`: the leader's state machine at the last staged entry (storage/
    checkpoints.py), so the reopen replays nothing; without one, the group's own goes.
    `commit`: a log installed without a leader's word that its entries are committed in
    this group (a mirror's kept prefix, storage/prefix.py) claims only its start point."""
    assert staged, "an install brings at least one segment"
    expected = Index(start.snapshot.meta.index + 1)
    for segment in staged:
        assert segment.descriptor.first_index == expected, "staged segments are contiguous"
        expected = Index(segment.descriptor.last_index + 1)
    upto = staged[-1].descriptor.last_index
    _, own, _ = load_state(db, group)
    term = Term(max(own.term, leader_term))
    # A replica in repair recorded a commit past the install's end: kept, the reopen finds
    # the log ending below it and keeps the replica in repair (no vote, no lead) until
    # its leader gave those entries back (storage/recovery.py, SegmentStore.repair_until).
    commit = Index(max(own.commit, upto if commit is None else commit))
    hard_state = HardState(term=term, vote=own.vote if term == own.term else NodeId(0), commit=commit)

    batch = db.batch()  # (1)
    batch.put(group_key(CHECK_ALL, group), b"1")
    for kind in (CLOSED_SEGMENT, INDEX, OFFSET, TERM_RUN):
        delete_int_range(batch, kind, group, 0)
    db.write(batch, sync=True)
    staged_paths = {segment.path for segment in staged}
    for name in files.list_dir(directory):  # (2)
        path = os.path.join(directory, name)
        if (parse_segment_name(name) is not None or name.endswith(PARTIAL_SUFFIX) or is_staged(name)
                or is_sidecar(name)) and path not in staged_paths:
            files.unlink(path)
    files.sync_dir(directory)
    for segment in staged:  # (3)
        files.rename(segment.path, os.path.join(directory, segment_name(segment.descriptor.first_index)))
    files.sync_dir(directory)

    batch = db.batch()  # (4)
    batch.delete(int_key(NEWEST_SEGMENT, group, 0))
    batch.delete(group_key(APPLIED, group))
    if checkpoint is not None:
        assert checkpoint.snapshot.meta.index == upto, "the checkpoint stands at the install's end"
        batch.put(group_key(CHECKPOINT, group), encode_start(checkpoint))
    else:
        batch.delete(group_key(CHECKPOINT, group))
    batch.put(group_key(SNAPSHOT, group), encode_start(start))
    batch.put(group_key(HARD_STATE, group), encode_hard_state(hard_state))
    term_starts, terms = _term_runs(staged)
    for segment in staged[:-1]:  # the last one is the open segment: scanned on open
        stage_close(batch, group, _as_open_segment(segment, now_ms), term_starts, terms)
    batch.delete(group_key(CHECK_ALL, group))
    db.write(batch, sync=True)
    return hard_state


def _term_runs(staged: list[StagedSegment]) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    terms: list[int] = []
    for segment in staged:
        for frame in segment.frames:
            if not terms or terms[-1] != frame.term:
                starts.append(frame.index)
                terms.append(frame.term)
    return starts, terms


class _NoHandle:
    """`stage_close` reads a segment's size only; the file is not open here."""

    def __init__(self, size: int) -> None:
        self.size = size


def _as_open_segment(staged: StagedSegment, now_ms: int) -> Segment:
    descriptor = staged.descriptor
    segment = Segment(
        first_index=descriptor.first_index, path="", handle=_NoHandle(descriptor.size_bytes),  # type: ignore[arg-type]
        first_offset=descriptor.first_offset, created_ms=now_ms, last_index=Index(descriptor.first_index - 1),
        next_offset=descriptor.first_offset, crc=staged.crc,
    )  # fmt: skip
    for frame in staged.frames:
        segment.add_frame(frame)
    return segment
