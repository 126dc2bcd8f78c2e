"""The Ready processor: one Ready's steps, in the order the core requires, with no I/O.

Both drivers of a core run this: the group runtime (`group.py`, asyncio) and the
deterministic simulator (`tests/sim/simulator.py`, virtual time). What a Ready's
steps are, their order, and how its write is made durable are decided here, once;
the drivers only carry them out. TigerBeetle's simulator runs the production
replica for the same reason: a simulator with a driver of its own tests that
driver, not the one that ships.

The steps (`raftlog/core/ready.py` explains why this order):

    send `messages`; install the snapshot; append the entries; store the hard state
    make the write durable, by one of the `Durability` modes (`choose_durability`)
    [acks=leader: the entries are durable here] send `persisted_messages`
    apply the committed entries (each with the membership in force at it); hand the
    read states over; `advance`

Sans-I/O as h11 is: the processor does nothing itself. Each step is a call on the
driver's `ReadyHost` (the runtime stores and sends; the simulator records and
schedules) or on the group's `Persistence` (how writes become durable, chosen
once when the group is built: `persistence.py`). The one step that takes time,
waiting for the disk, is yielded: `process_ready` is a generator that yields what
`Persistence.persist_now` returned, and the driver resumes it once that is done
(the runtime awaits the shared flush; the simulator keeps the suspended generator
until its simulated disk event fires). A Ready whose write needs no wait runs
through without yielding.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterator
from typing import Any, Protocol

from raftlog.core.raft import RaftCore
from raftlog.core.ready import Ready
from raftlog.messages import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    ReadState,
    Snapshot,
    decode_conf_change,
)
from raftlog.types import Index


class Durability(enum.Enum):
    """How a Ready's write is made durable before the steps after it."""

    NONE = "none"  # nothing was written
    # Only the commit index moved: Raft needs no fsync for it (recovery takes it as a
    # lower bound), so it is stored with some later flush and nobody waits.
    LAZY = "lazy"
    # A leader's own appends (`RaftCore.may_persist_later`): their fsync runs in the
    # background, the Ready goes on at once and is advanced with persisted=False; the
    # driver reports them with `RaftCore.persisted` when the fsync is done.
    LATER = "later"
    # Durable before the answers go out: the processor yields until it is.
    NOW = "now"


class ReadyHost(Protocol):
    """The driver's side of the steps: what it does with what a Ready holds."""

    def send_message(self, message: Message) -> None: ...

    def install_snapshot(self, snapshot: Snapshot) -> None: ...

    def append_entries(self, entries: tuple[Entry, ...]) -> None: ...

    def store_hard_state(self, hard_state: HardState) -> None: ...

    def entries_durable(self, index: Index) -> None:
        """This node's log is durable through `index` (acks=leader writes may answer)."""

    def apply_committed(self, entries: Iterator[tuple[Entry, Membership]]) -> None:
        """Apply each entry, in order; each comes with the membership in force at it."""

    def hand_over_reads(self, read_states: tuple[ReadState, ...]) -> None: ...


class Persistence(Protocol):
    """How one group's writes become durable; `persistence.py` holds the production ones.

    `lazy_commit` and `may_persist_later` say which modes this group may use;
    `choose_durability` picks among them. The others carry a mode out."""

    lazy_commit: bool  # a write that only moves the commit index may be stored lazily

    def may_persist_later(self, ready: Ready) -> bool:
        """Room for one more background write (asked only where the core allows one)."""

    def persist_lazily(self) -> None: ...

    def persist_later(self, ready: Ready) -> None:
        """Start the background write; its outcome reaches the driver, not the processor."""

    def persist_now(self, ready: Ready) -> Any:
        """Make everything written durable: None when it is already, else what the driver
        waits for (a future, a coroutine, a simulated disk event) before going on."""

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        """After the answers, before the apply of a Ready with committed entries."""


def choose_durability(core: RaftCore, ready: Ready, persistence: Persistence) -> Durability:
    """The one place that decides how a Ready's write is made durable."""
    if not (ready.must_sync or ready.entries or ready.hard_state is not None):
        return Durability.NONE
    if not ready.must_sync and not ready.entries and persistence.lazy_commit:
        return Durability.LAZY
    if core.may_persist_later(ready) and persistence.may_persist_later(ready):
        return Durability.LATER
    return Durability.NOW


def memberships_in_force(membership: Membership, entries: tuple[Entry, ...]) -> Iterator[tuple[Entry, Membership]]:
    """Each committed entry with the configuration in force once it is applied.

    `membership` is the core's before this Ready (it takes the Ready's configuration
    changes in at `advance`); a CONFIG entry changes it from that entry on."""
    for entry in entries:
        if entry.kind is EntryKind.CONFIG:
            membership = membership.apply(decode_conf_change(entry.payload))
        yield entry, membership


def process_ready(
    core: RaftCore, ready: Ready, host: ReadyHost, persistence: Persistence
) -> Generator[Any, None, None]:
    """Carry `ready` (just taken from `core`) through every step, ending with `advance`.

    Yields at most once: what the driver must wait for before the write counts as
    durable (see the module docstring). Nothing may step, tick or propose to `core`
    while this runs or is suspended (the core asserts it)."""
    for message in ready.messages:
        host.send_message(message)
    if ready.snapshot is not None:
        host.install_snapshot(ready.snapshot)
    if ready.entries:
        host.append_entries(ready.entries)
    if ready.hard_state is not None:
        host.store_hard_state(ready.hard_state)
    mode = choose_durability(core, ready, persistence)
    if mode is Durability.NOW:
        wait = persistence.persist_now(ready)
        if wait is not None:
            yield wait
    elif mode is Durability.LATER:
        persistence.persist_later(ready)
    elif mode is Durability.LAZY:
        persistence.persist_lazily()
    if ready.entries and mode is not Durability.LATER:
        host.entries_durable(ready.entries[-1].index)
    for message in ready.persisted_messages:
        host.send_message(message)
    if ready.committed_entries:
        persistence.before_apply(ready, mode)
        host.apply_committed(memberships_in_force(core.membership, ready.committed_entries))
    if ready.read_states:
        host.hand_over_reads(ready.read_states)
    core.advance(ready, persisted=mode is not Durability.LATER)
