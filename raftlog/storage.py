"""The storage contract: what the Raft core reads, and what its driver writes.

The core only *reads* its log through `LogStorage` (and its starting point through
`initial_state`). Writing is the driver's job: it appends the entries and hard
state of a `Ready`, makes them durable, and only then calls `advance`. Two
implementations satisfy this protocol and run one contract suite:
`storage.memory.MemoryStorage` (tests, simulator, benchmarks) and the segment store
of `storage/` (the node).

Contracts shared by every implementation:
- Indexes are Raft indexes. `first_index()` is the first entry still held;
  `term(first_index() - 1)` stays answerable (it is the snapshot's term), so the
  leader can always build the "previous entry" of an append.
- `entries(lo, hi, max_bytes)` reads `[lo, hi)`; it returns at least one entry when
  `lo < hi` even if that one exceeds `max_bytes` (else a large entry could never
  be sent), and stops before the entry that would exceed `max_bytes`.
- Reading below `first_index()` raises `CompactedError`; above `last_index()`
  raises `UnavailableError`. Any other exception is fatal for the group.
- `append(entries)` truncates any existing suffix starting at `entries[0].index`
  first (a Raft conflict). Appending must be contiguous with what is kept.
- Nothing written is durable until `sync()` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from raftlog.messages import Entry, HardState, Membership, Snapshot
from raftlog.types import Index, Term


class StorageError(Exception):
    """Base of the expected storage conditions the core handles."""


class CompactedError(StorageError):
    """The requested index is below the first index still held (retention or snapshot)."""


class UnavailableError(StorageError):
    """The requested index is beyond the last index held."""


@dataclass(frozen=True, slots=True)
class InitialState:
    """Where a restarted core begins: its durable hard state and membership.

    `membership` is the one in force at `applied` (the index the driver's state
    machine has applied, which the driver passes to the core's config).
    """

    hard_state: HardState
    membership: Membership
    # Recovery found corruption before the tail: this replica's log is suspect, so it
    # must neither vote nor lead until the driver repaired it from the leader.
    needs_repair: bool = False


@runtime_checkable
class LogStorage(Protocol):
    """The read side the core uses."""

    def initial_state(self) -> InitialState: ...

    def first_index(self) -> Index: ...

    def last_index(self) -> Index: ...

    def term(self, index: Index) -> Term: ...

    def entries(self, lo: Index, hi: Index, max_bytes: int) -> list[Entry]: ...

    def snapshot(self) -> Snapshot: ...


@runtime_checkable
class RaftStorage(LogStorage, Protocol):
    """The read side plus the writes a driver performs for each Ready."""

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None: ...

    def set_hard_state(self, hard_state: HardState) -> None: ...

    def apply_snapshot(self, snapshot: Snapshot) -> None: ...

    def compact(self, index: Index) -> None:
        """Forget entries up to and including `index` (already applied and snapshotted)."""
        ...

    def sync(self) -> None: ...
