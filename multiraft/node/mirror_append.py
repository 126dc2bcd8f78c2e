"""A mirror's compare-and-append: a chunk enters the sink's log only where its offsets are the source's.

Why at the append and not at the apply. Storage gives a DATA entry its offsets when the
entry is written to the log, from the entries before it (storage/frames.py: every frame's
base offset is the previous frame's next offset), on every replica, before the entry is
committed; an apply that refused a DATA entry could not give its offsets back (a refused
produce batch keeps its offsets and is only skipped on reads). So the one place a chunk
can be refused without taking offsets is before it enters the log: the leader's group
task, right before the core appends it (`GroupRuntime.propose(guard=...)`), with nothing
in between. There the guard computes the offset the log ends at, its applied state's
next offset plus the records of the DATA entries past it, and refuses unless that is the
chunk's first offset (the source's base offset of its first batch).

Deterministic and replicated: an entry that passes sits at that log position, and the
offsets of a log position are a function of the entries before it, which every replica
holding the entry holds the same (Raft's log matching). So on every replica each mirror
DATA entry has the source's offsets, whatever the pull pipelined: if proposal k is
dropped, k+1 does not start where the log ends and is refused in turn, appending
nothing; if the leader changes, entries of the old term survive only as a prefix of
what it appended, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from raftlog.core.raft import RaftCore
from raftlog.errors import ProposalDropped
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index
from storage.frames import record_count_of

# Entries read a step when the guard must count a log's unapplied tail (rare: after a
# refusal, or with consumer offset commits between chunks); any bound works, at least
# one entry comes back.
SCAN_BYTES_MAX = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogPoint:
    """A log position and the offset after it: entries up to `index` (of `term`) end at `next_offset`."""

    index: int
    term: int
    next_offset: int


def offset_after(start: LogPoint, entries: Iterable[Entry]) -> int:
    """The offset after `entries`, the log's entries following `start`, in order (pure)."""
    offset, index = start.next_offset, start.index
    for entry in entries:
        assert entry.index == index + 1, "the entries follow the start without a gap"
        index = entry.index
        if entry.kind is EntryKind.DATA:
            offset += record_count_of(entry)
    return offset


def log_end_offset(core: RaftCore, applied: LogPoint, known: LogPoint | None) -> int:
    """The offset the next DATA entry appended to this log would take: from the latest
    point known to be in the log (`known`, the end of this pull's last append, if the
    log still holds it past the applied state; else the applied state), counting the
    entries after it."""
    start = applied
    if known is not None and known.index >= applied.index and core.log.term_or_none(Index(known.index)) == known.term:
        start = known  # the same index and term: the same entry and the same prefix (log matching)
    last = core.log.last_index()
    offset = start.next_offset
    while start.index < last:
        entries = core.log.slice(Index(start.index + 1), Index(last + 1), SCAN_BYTES_MAX)
        offset = offset_after(start, entries)
        start = LogPoint(entries[-1].index, entries[-1].term, offset)
    return offset


@dataclass(slots=True)
class LogTail:
    """Where this pull's last append ended (None before its first): lets the next check
    skip the scan when nothing came between."""

    known: LogPoint | None = None


class MirrorAppend:
    """The guard of one proposal of a mirror partition (`AppendGuard`): appended only in
    `term` and only where the log ends at `first_offset`; `records` is what it adds (0 for
    a META entry). With `after` (the guard of the chunk's skips META entry), only right
    after that entry: the two are separate proposals, both starting where the log ends at
    `first_offset`, so a refused META (a membership change applying, a transfer under way,
    both over by the next proposal) would otherwise let its chunk in without the skipped
    ranges, and the sink would serve batches the source hides, for good."""

    def __init__(self, applied: Callable[[], LogPoint | None], tail: LogTail, term: int, first_offset: int,
                 records: int, after: MirrorAppend | None = None) -> None:
        assert first_offset >= 0 and records >= 0
        self._applied = applied
        self._tail = tail
        self._term = term
        self.first_offset = first_offset
        self._records = records
        self._after = after
        self.landed: LogPoint | None = None  # where its entries ended, once appended

    def check(self, core: RaftCore) -> None:
        if core.term != self._term:
            raise ProposalDropped(f"the mirror's pull began in term {self._term}; this is term {core.term}")
        applied = self._applied()
        if applied is None:
            raise ProposalDropped("the partition is no longer a mirror here")
        if self._after is not None:
            meta = self._after.landed
            if meta is None or core.log.last_index() != meta.index or \
                    core.log.term_or_none(Index(meta.index)) != meta.term:
                raise ProposalDropped("the chunk's skipped ranges were not appended right before it")
        end = log_end_offset(core, applied, self._tail.known)
        if end != self.first_offset:
            raise ProposalDropped(f"the mirror's log ends at offset {end}, not at the chunk's first offset "
                                  f"{self.first_offset}")

    def appended(self, core: RaftCore) -> None:
        last = core.log.last_index()
        self.landed = self._tail.known = LogPoint(int(last), int(core.term), self.first_offset + self._records)


def applied_point(machine: Any) -> LogPoint | None:
    """The applied state of a mirror partition's machine as a `LogPoint` (None if not a mirror)."""
    if machine is None or not machine.state.mirror:
        return None
    state = machine.state
    return LogPoint(int(state.applied_index), -1, int(state.next_offset))
