"""`Ready`: everything a core asks its driver to do, and the order it must be done in.

Why an order at all? A Raft replica promises things in its messages that are only
true once its disk says so. A vote says "I will not vote for anyone else in this
term"; an append response says "I hold these entries". If the message left before
the write was durable and the node then crashed, it could come back having
forgotten the promise: vote twice, or let the leader count an entry it lost. So a
Ready splits its messages in two:

1. `messages` may go out at once. They promise nothing about this node's disk: a
   leader's appends to its followers (the leader counts *itself* toward the quorum
   only after its own write, via `advance`), heartbeats, pre-votes, vote requests.
2. Persist: append `entries` (truncating any conflicting suffix), install `snapshot`
   if one came, store `hard_state`; fsync when `must_sync`.
3. `persisted_messages` go out only after step 2 is durable: votes granted, append
   and snapshot acknowledgements.
4. Apply `committed_entries` to the state machine, hand `read_states` to waiting readers.
5. Call `advance(ready)`. Only one Ready is outstanding at a time (its `number` is
   checked), and the core is not stepped or ticked between `ready()` and `advance()`:
   the driver queues what arrives meanwhile.

A leader asks for a snapshot / segment install by a SNAPSHOT message in
`messages`: the driver moves the data named by `Snapshot.data` to the target
before the message, and reports failures with `report_snapshot`.

Committed entries may include entries persisted in step 2 of this very Ready (a
follower learns an entry and its commit together); the order above makes that safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.messages import Entry, HardState, Message, ReadState, Snapshot, SoftState


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    number: int
    hard_state: HardState | None
    soft_state: SoftState | None
    entries: tuple[Entry, ...]
    snapshot: Snapshot | None
    messages: tuple[Message, ...]
    persisted_messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]
    read_states: tuple[ReadState, ...]
    must_sync: bool

    def __post_init__(self) -> None:
        if self.must_sync:
            assert self.entries or self.hard_state is not None or self.snapshot is not None
