"""The replica's view of its log: durable entries in storage plus an unstable tail.

New entries (proposed by a leader, or received by a follower) sit in the
*unstable* tail until the driver reports them durable (`advance`, or `persisted`
for a leader that does not wait for its own fsync); only then are they read from
storage. `in_progress` is the last unstable entry already handed to the driver in
a Ready: written, its fsync under way. Invariants (checked by assertions):

    first_index - 1 <= applied <= committed <= last_index
    unstable_offset == index of unstable[0]   (== stable last index + 1 if empty)
    unstable_offset - 1 <= in_progress <= last_index

A pending snapshot (received by a follower) replaces the whole log at once; it is
durable after the driver installs it.
"""

from __future__ import annotations

from raftlog.messages import ENTRY_OVERHEAD_BYTES, Entry, Snapshot
from raftlog.storage import CompactedError, LogStorage, UnavailableError
from raftlog.types import Index, Term


class RaftLog:
    def __init__(self, storage: LogStorage, applied: Index) -> None:
        self.storage = storage
        self.unstable: list[Entry] = []
        self.unstable_offset = Index(storage.last_index() + 1)
        self.in_progress = Index(self.unstable_offset - 1)
        self.pending_snapshot: Snapshot | None = None
        first = storage.first_index()
        self.committed = Index(first - 1)
        self.applied = Index(max(first - 1, applied))

    # -- positions ---------------------------------------------------------------

    def first_index(self) -> Index:
        if self.pending_snapshot is not None:
            return Index(self.pending_snapshot.meta.index + 1)
        return self.storage.first_index()

    def last_index(self) -> Index:
        if self.unstable:
            return Index(self.unstable_offset + len(self.unstable) - 1)
        if self.pending_snapshot is not None:
            return self.pending_snapshot.meta.index
        return self.storage.last_index()

    def last_term(self) -> Term:
        term = self.term_or_none(self.last_index())
        assert term is not None, "the last entry's term is always known"
        return term

    def term_or_none(self, index: Index) -> Term | None:
        """The term of `index`, or None when it was compacted away or is beyond the log."""
        offset = self.unstable_offset
        if index >= offset:
            position = index - offset
            if position < len(self.unstable):
                return self.unstable[position].term
            return None
        snapshot = self.pending_snapshot
        if snapshot is not None:
            if index == snapshot.meta.index:
                return snapshot.meta.term
            return None
        try:
            return self.storage.term(index)
        except (CompactedError, UnavailableError):
            return None

    def match_term(self, index: Index, term: Term) -> bool:
        return self.term_or_none(index) == term

    def is_up_to_date(self, last_index: Index, last_term: Term) -> bool:
        """Raft section 5.4.1: is a candidate's log at least as complete as ours?"""
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index())

    # -- reads ---------------------------------------------------------------------

    def slice(self, lo: Index, hi: Index, bytes_max: int) -> list[Entry]:
        """Entries `[lo, hi)`, at least one, at most `bytes_max` (raises CompactedError)."""
        assert lo <= hi <= self.last_index() + 1, (lo, hi, self.last_index())
        if lo == hi:
            return []
        if lo < self.first_index():
            raise CompactedError(f"index {lo} was compacted")
        offset = self.unstable_offset
        result: list[Entry] = []
        if lo < offset:
            result = self.storage.entries(lo, Index(min(hi, offset)), bytes_max)
            if len(result) < min(hi, offset) - lo:
                return result  # the byte limit stopped the storage read
        if hi > offset:
            start = max(lo, offset) - offset
            tail = self.unstable[start : hi - offset]
            if not result:
                result = _limit(tail, bytes_max)
            else:
                used = sum(len(e.payload) + ENTRY_OVERHEAD_BYTES for e in result)
                for entry in tail:
                    used += len(entry.payload) + ENTRY_OVERHEAD_BYTES
                    if used > bytes_max:
                        break
                    result.append(entry)
        return result

    def find_conflict_by_term(self, index: Index, term: Term) -> tuple[Index, Term]:
        """The largest index <= `index` whose term is <= `term` (fast backtracking)."""
        while index > 0:
            our_term = self.term_or_none(index)
            if our_term is None or our_term <= term:
                return index, (our_term or Term(0))
            index = Index(index - 1)
        return Index(0), Term(0)

    # -- writes --------------------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        """Append entries that may overlap the tail (the overlap is a Raft conflict)."""
        if not entries:
            return
        first = entries[0].index
        assert first > self.committed, "committed entries are never overwritten"
        assert first <= self.last_index() + 1, "appends are contiguous"
        offset = self.unstable_offset
        if first == offset + len(self.unstable):
            self.unstable.extend(entries)
        elif first <= offset:
            # The new entries replace part of the stable log: storage truncates on write.
            self.unstable = list(entries)
            self.unstable_offset = first
        else:
            del self.unstable[first - offset :]
            self.unstable.extend(entries)
        # Replaced entries handed out earlier are not what the driver writes now.
        self.in_progress = Index(min(self.in_progress, first - 1))

    def maybe_append(
        self, index: Index, log_term: Term, commit: Index, entries: tuple[Entry, ...]
    ) -> Index | None:
        """A follower's append: the new last index, or None if `index`/`log_term` mismatch."""
        if not self.match_term(index, log_term):
            return None
        last_new = Index(index + len(entries))
        conflict = self._find_conflict(entries)
        if conflict:
            assert conflict > self.committed, "a leader never conflicts with committed entries"
            self.append(list(entries[conflict - index - 1 :]))
        self.commit_to(Index(min(commit, last_new)))
        return last_new

    def _find_conflict(self, entries: tuple[Entry, ...]) -> Index:
        """The first new entry that is missing or differs in term; 0 when all are present."""
        for entry in entries:
            if not self.match_term(entry.index, entry.term):
                return entry.index
        return Index(0)

    def commit_to(self, index: Index) -> None:
        if index > self.committed:
            assert index <= self.last_index(), "cannot commit beyond the log"
            self.committed = index

    def maybe_commit(self, index: Index, term: Term) -> bool:
        """Commit `index` if it is newer and of `term` (Raft section 5.4.2)."""
        if index > self.committed and self.term_or_none(index) == term:
            self.commit_to(index)
            return True
        return False

    def restore(self, snapshot: Snapshot) -> None:
        self.pending_snapshot = snapshot
        self.unstable = []
        self.unstable_offset = Index(snapshot.meta.index + 1)
        self.in_progress = snapshot.meta.index
        self.committed = snapshot.meta.index

    # -- acknowledgements from the driver ------------------------------------------

    def unwritten(self) -> list[Entry]:
        """The unstable entries not yet handed to the driver; they are handed now."""
        start = self.in_progress + 1 - self.unstable_offset
        assert start >= 0, (self.in_progress, self.unstable_offset)
        entries = self.unstable[start:]
        if entries:
            self.in_progress = entries[-1].index
        return entries

    def has_unwritten(self) -> bool:
        return self.in_progress < self.unstable_offset + len(self.unstable) - 1

    def has_in_progress(self) -> bool:
        """Some entries were handed out and are not yet reported durable."""
        return self.in_progress >= self.unstable_offset

    def stable_to_in_progress(self) -> None:
        """The driver synced its storage: everything it was handed is durable."""
        self.stable_to(self.in_progress, None)

    def stable_to(self, index: Index, term: Term | None) -> bool:
        """Entries through `index` are durable (when `index` still holds `term`: a report
        about entries replaced since is stale and changes nothing). True if it did."""
        if index < self.unstable_offset or index > self.in_progress:
            return False
        if term is not None and self.term_or_none(index) != term:
            return False
        del self.unstable[: index + 1 - self.unstable_offset]
        self.unstable_offset = Index(index + 1)
        return True

    def snapshot_installed(self, snapshot: Snapshot) -> None:
        assert self.pending_snapshot is snapshot
        self.pending_snapshot = None
        if self.applied < snapshot.meta.index:
            self.applied = snapshot.meta.index

    def applied_to(self, index: Index) -> None:
        assert self.applied <= index <= self.committed, (self.applied, index, self.committed)
        self.applied = index

    def stable_last_index(self) -> Index:
        """The last index durable in storage (or installed with a snapshot)."""
        return Index(self.unstable_offset - 1)


def _limit(entries: list[Entry], bytes_max: int) -> list[Entry]:
    total = 0
    for count, entry in enumerate(entries):
        total += len(entry.payload) + ENTRY_OVERHEAD_BYTES
        if total > bytes_max and count > 0:
            return entries[:count]
    return entries
