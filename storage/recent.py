"""The newest entries of a log, kept in memory after `append` (`SegmentStore` holds them).

A write is applied (leader) or learned committed (follower) moments after it was
appended, and reading it back from the file (a read, a frame parse, a CRC) sat on
every write's critical path; storage.md ("Durability") describes the budget.
"""

from __future__ import annotations

from collections import deque

from raftlog.messages import ENTRY_OVERHEAD_BYTES, Entry
from raftlog.types import Index

# Kept until this many entries or this many bytes. Small, as a node holds thousands
# of logs; an entry larger than the whole budget is not kept (large batches are read
# from the file).
RECENT_ENTRIES_MAX = 64
RECENT_BYTES_MAX = 64 * 1024


class RecentEntries:
    """The log's newest entries (contiguous, ending at the log's last index), or nothing."""

    __slots__ = ("_bytes", "_entries")

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._bytes = 0

    def read(self, lo: Index, hi: Index, max_bytes: int, last_index: Index) -> list[Entry] | None:
        """Entries [lo, hi) under `max_bytes` (at least one), or None if not all are here."""
        recent = self._entries
        if not recent or lo < recent[0].index:
            return None
        assert recent[-1].index == last_index, "the recent entries end the log"
        selected: list[Entry] = []
        total = 0
        for position in range(lo - recent[0].index, hi - recent[0].index):
            entry = recent[position]
            total += len(entry.payload) + ENTRY_OVERHEAD_BYTES
            if total > max_bytes and selected:
                break
            selected.append(entry)
        return selected

    def remember(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Keep the newest entries in memory (RECENT_ENTRIES_MAX, RECENT_BYTES_MAX)."""
        recent = self._entries
        assert not recent or recent[-1].index == entries[0].index - 1, "append truncated first"
        for entry in entries:
            recent.append(entry)
            self._bytes += len(entry.payload)
        while recent and (len(recent) > RECENT_ENTRIES_MAX or self._bytes > RECENT_BYTES_MAX):
            self._bytes -= len(recent.popleft().payload)

    def forget(self, from_index: Index | None = None) -> None:
        """Drop the remembered entries from `from_index` on (all of them by default)."""
        recent = self._entries
        while recent and (from_index is None or recent[-1].index >= from_index):
            self._bytes -= len(recent.pop().payload)
