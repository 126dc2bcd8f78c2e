"""An in-memory `RaftStorage` that knows what a crash would lose.

Used by the simulator, the benchmarks and the storage contract suite. Every write
lands in memory at once (reads see it), but only `sync()` makes it durable;
`crash()` throws away everything written since the last sync, exactly as a power
failure would, optionally keeping a prefix of the unsynced appends (the OS had
flushed part of them: a torn tail, already cut back to whole entries by CRC).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from raftlog.messages import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    HardState,
    Membership,
    Snapshot,
    SnapshotMeta,
)
from raftlog.storage import CompactedError, InitialState, UnavailableError
from raftlog.types import Index, Term


@dataclass(slots=True)
class _Durable:
    snapshot: Snapshot
    entries: list[Entry]
    hard_state: HardState


class MemoryStorage:
    def __init__(self, membership: Membership | None = None) -> None:
        meta = SnapshotMeta(index=Index(0), term=Term(0), membership=membership or Membership())
        self._snapshot = Snapshot(meta=meta)
        # _entries[i] has index snapshot.index + 1 + i.
        self._entries: list[Entry] = []
        self._hard_state = HardState()
        self._durable = _Durable(self._snapshot, [], self._hard_state)
        # Lowest list position changed since the last sync (None: nothing changed).
        self._dirty_from: int | None = None
        self.sync_count = 0
        # Set by `mark_for_repair` (as recovery marks a damaged log); kept across crashes.
        self._needs_repair = False

    # -- read side (LogStorage) ------------------------------------------------

    def initial_state(self) -> InitialState:
        return InitialState(
            hard_state=self._hard_state, membership=self._snapshot.meta.membership,
            needs_repair=self._needs_repair,
        )

    def first_index(self) -> Index:
        return Index(self._snapshot.meta.index + 1)

    def last_index(self) -> Index:
        return Index(self._snapshot.meta.index + len(self._entries))

    def term(self, index: Index) -> Term:
        offset = self._snapshot.meta.index
        if index == offset:
            return self._snapshot.meta.term
        if index < offset:
            raise CompactedError(f"index {index} is below the first index {offset + 1}")
        if index > offset + len(self._entries):
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        return self._entries[index - offset - 1].term

    def entries(self, lo: Index, hi: Index, max_bytes: int) -> list[Entry]:
        offset = self._snapshot.meta.index
        if lo <= offset:
            raise CompactedError(f"index {lo} is below the first index {offset + 1}")
        if hi > offset + len(self._entries) + 1:
            raise UnavailableError(f"index {hi - 1} is beyond the last index {self.last_index()}")
        assert lo <= hi
        selected = self._entries[lo - offset - 1 : hi - offset - 1]
        total = 0
        for count, entry in enumerate(selected):
            total += len(entry.payload) + ENTRY_OVERHEAD_BYTES
            if total > max_bytes and count > 0:
                return selected[:count]
        return selected

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- write side (RaftStorage) ----------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        if not entries:
            return
        offset = self._snapshot.meta.index
        first = entries[0].index
        assert first > offset, "cannot append at or below the snapshot"
        assert first <= offset + len(self._entries) + 1, "appends must be contiguous"
        position = first - offset - 1
        del self._entries[position:]
        self._entries.extend(entries)
        self._mark_dirty(position)

    def set_hard_state(self, hard_state: HardState) -> None:
        self._hard_state = hard_state

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the log by a snapshot (a follower installing one from its leader)."""
        assert snapshot.meta.index >= self._snapshot.meta.index, "snapshots never go back"
        self._snapshot = snapshot
        self._entries = []
        self._mark_dirty(0)

    def compact(self, index: Index) -> None:
        """Forget entries up to `index`, keeping its term as the new snapshot point.

        The membership and data of the previous snapshot carry over: a caller whose
        state changed since records the snapshot of `index` with `set_snapshot`.
        """
        offset = self._snapshot.meta.index
        if index <= offset:
            return
        assert index <= self.last_index(), "cannot compact beyond the log"
        term = self.term(index)
        meta = SnapshotMeta(index=index, term=term, membership=self._snapshot.meta.membership)
        self._snapshot = Snapshot(meta=meta, data=self._snapshot.data)
        del self._entries[: index - offset]
        self._mark_dirty(0)

    def set_snapshot(self, snapshot: Snapshot) -> None:
        """Record a newer snapshot of the applied state (data and membership at its index)."""
        assert snapshot.meta.index == self._snapshot.meta.index
        self._snapshot = snapshot
        self._mark_dirty(0)

    def sync(self) -> None:
        self.sync_count += 1
        durable = self._durable
        if self._dirty_from is not None:
            if durable.snapshot is not self._snapshot:
                durable.snapshot = self._snapshot
                durable.entries = list(self._entries)
            else:
                del durable.entries[self._dirty_from :]
                durable.entries.extend(self._entries[self._dirty_from :])
            self._dirty_from = None
        durable.hard_state = self._hard_state

    def durable_term(self, index: Index) -> Term | None:
        """The term a crash now would keep at `index`; None when absent (simulator checks).

        Indexes at or below the durable snapshot answer the snapshot's term only for the
        snapshot index itself; below it the entry is compacted (committed state).
        """
        durable = self._durable
        offset = durable.snapshot.meta.index
        if index == offset:
            return durable.snapshot.meta.term
        position = index - offset - 1
        if 0 <= position < len(durable.entries):
            return durable.entries[position].term
        return None

    def durable_first_index(self) -> Index:
        return Index(self._durable.snapshot.meta.index + 1)

    def durable_last(self) -> tuple[Index, Term]:
        """(index, term) of the last entry a crash now would keep (simulator checks)."""
        durable = self._durable
        if durable.entries:
            last = durable.entries[-1]
            return last.index, last.term
        return durable.snapshot.meta.index, durable.snapshot.meta.term

    # -- faults ----------------------------------------------------------------

    def lose_tail(self, count: int) -> None:
        """A restart that found the log damaged (tests): a crash, then recovery cuts the
        last `count` durable entries (never into the snapshot), clamps the commit index
        to what is left and marks the log for repair, as `storage/recovery.py` does."""
        self.crash()
        durable = self._durable
        assert 0 <= count <= len(durable.entries), "the cut stays above the snapshot"
        del durable.entries[len(durable.entries) - count :]
        last = Index(durable.snapshot.meta.index + len(durable.entries))
        hard = durable.hard_state
        durable.hard_state = HardState(term=hard.term, vote=hard.vote, commit=min(hard.commit, last))
        self.crash()
        self.mark_for_repair()

    def mark_for_repair(self) -> None:
        """As recovery does for a log it cut at damage: a core opened over this storage
        starts in repair (it neither votes nor leads, and asks its leader for the rest)."""
        self._needs_repair = True

    def mark_repaired(self) -> None:
        self._needs_repair = False

    def crash(self, rng: random.Random | None = None, torn_tail: bool = False) -> None:
        """Lose what was not synced; with `torn_tail`, keep a random prefix of it."""
        durable = self._durable
        kept: list[Entry] = []
        if torn_tail and rng is not None and self._dirty_from is not None:
            if durable.snapshot is self._snapshot:
                unsynced = self._entries[self._dirty_from :]
                if unsynced:
                    kept = unsynced[: rng.randrange(len(unsynced) + 1)]
                    entries = durable.entries[: self._dirty_from] + kept
                    durable.entries = entries
        self._snapshot = durable.snapshot
        self._entries = list(durable.entries)
        self._hard_state = durable.hard_state
        self._dirty_from = None

    def _mark_dirty(self, position: int) -> None:
        if self._dirty_from is None or position < self._dirty_from:
            self._dirty_from = position
