"""The group runtime's side of the Ready processor: the steps, carried out.

`GroupHost` is the `ReadyHost` a group runtime hands `process_ready`: it appends
to the group's store, sends through the node (holding commit-only appends a
moment, see COMMIT_HOLD_S), installs snapshots, applies committed entries to the
state machine and resolves the waiters they answer. Which steps run, in which
order, and how the write is made durable is the processor's business, not this
one's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from multiraft.runtime.group_types import SegmentBoundaries, StateMachine
from multiraft.runtime.histograms import NodeLatencies
from multiraft.runtime.waiters import Waiters
from raftlog.core.progress import ProgressState
from raftlog.core.raft import RaftCore
from raftlog.messages import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    ReadState,
    Role,
    Snapshot,
)
from raftlog.storage import RaftStorage
from raftlog.types import GroupId, Index
from storage.errors import InvalidBatchError

# A leader holds an append that only carries a new commit index this long: the next
# append to that follower (which carries the commit too) usually replaces it. For
# sequential writes that halves the messages per write; followers learn the commit
# at most this much later (their reads and applies lag by it, Kafka's followers lag by
# a fetch round). Delay is always safe in Raft: the network may delay anything.
COMMIT_HOLD_S = 0.005


class GroupHost:
    def __init__(
        self,
        group_id: GroupId,
        core: RaftCore,
        store: RaftStorage,
        state_machine: StateMachine,
        send: Callable[[GroupId, Message], None],
        waiters: Waiters,
        boundaries: SegmentBoundaries | None,
        latencies: NodeLatencies | None,
    ) -> None:
        self.group_id = group_id
        self.core = core
        self.store = store
        self.state_machine = state_machine
        self.send = send  # the node's (a test may record what passes)
        self.waiters = waiters
        self.boundaries = boundaries
        self.latencies = latencies
        self.appends_refused = 0  # appends holding a batch that is not valid (see batches_valid)
        self._held_commits: dict[int, Message] = {}
        self._held_timer: asyncio.TimerHandle | None = None
        # A segment store keeps its newest entries in memory until told they may go
        # (storage/entry_cache.py); other stores (tests' MemoryStorage) have no such cache.
        self._release_cached: Callable[[Index], None] | None = getattr(store, "release_cached", None)

    def close(self) -> None:
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        self._held_commits.clear()

    def send_message(self, message: Message) -> None:
        """Send, except a leader's commit-only append to a replicating follower, which
        waits up to COMMIT_HOLD_S for a later append to the same follower to replace it."""
        target = message.target
        if message.type is MessageType.APPEND:
            core = self.core
            progress = core.progress(target) if core.role is Role.LEADER else None
            if (
                not message.entries
                and progress is not None
                and progress.state is ProgressState.REPLICATE
            ):
                self._held_commits[target] = message  # a newer commit replaces an older one
                if self._held_timer is None:
                    self._held_timer = asyncio.get_running_loop().call_later(
                        COMMIT_HOLD_S, self._release_held_commits
                    )
                return
            # This append carries the commit index too: the held one is redundant.
            if self._held_commits.pop(target, None) is not None and not self._held_commits:
                assert self._held_timer is not None
                self._held_timer.cancel()  # the next hold gets its own full delay
                self._held_timer = None
        self.send(self.group_id, message)

    def _release_held_commits(self) -> None:
        self._held_timer = None
        held, self._held_commits = self._held_commits, {}
        if self.core.role is not Role.LEADER:
            return  # a deposed leader's commit news is stale; dropping is safe
        for message in held.values():
            self.send(self.group_id, message)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """The leader's log starts past ours: take its state, and its offsets with it."""
        next_offset_of = getattr(self.state_machine, "next_offset_of", None)
        if next_offset_of is not None and snapshot.data is not None:
            self.store.apply_snapshot(snapshot, next_offset_of(snapshot.data))  # type: ignore[call-arg]
        else:
            self.store.apply_snapshot(snapshot)
        self.state_machine.restore(snapshot.data, snapshot.meta.index)
        if self.boundaries is not None:
            self.boundaries.clear()

    def append_entries(self, entries: tuple[Entry, ...]) -> None:
        self.store.append(entries)
        if self.boundaries is not None:
            core = self.core
            self.boundaries.note_segments(self.store, core.applied_index, self.state_machine, core.membership)

    def store_hard_state(self, hard_state: HardState) -> None:
        self.store.set_hard_state(hard_state)

    def entries_durable(self, index: Index) -> None:
        if self.waiters.persisted:
            self.waiters.release_persisted(index)

    def apply_committed(self, entries: Iterator[tuple[Entry, Membership]]) -> None:
        began = time.perf_counter()
        for entry, membership in entries:
            self._apply(entry, membership)
        if self.latencies is not None:
            self.latencies.apply.observe(time.perf_counter() - began)

    def _apply(self, entry: Entry, membership: Membership) -> None:
        result = self.state_machine.apply(entry)
        if self.boundaries is not None:
            self.boundaries.applied(entry.index, self.state_machine, membership)
        proposal = self.waiters.resolve(entry, result)
        if proposal is not None and self.latencies is not None and proposal.began:
            self.latencies.replicate.observe(time.perf_counter() - proposal.began)

    def hand_over_reads(self, read_states: tuple[ReadState, ...]) -> None:
        for read_state in read_states:
            self.waiters.read_ready(read_state)

    # Around the steps: what the runtime asks of its host between Readys.

    def release_cached(self) -> None:
        """After a round of the group: the entries no replica needs leave the store's cache."""
        if self._release_cached is not None:
            self._release_cached(cache_release_index(self.core))

    def batches_valid(self, message: Message, check_data: Callable[[bytes], object], logger: Any) -> bool:
        """A follower checks every batch it is sent before storing it, as the leader did
        before proposing it: a leader with a bug (or a corrupting path between them)
        must not plant a batch that every later read of this replica trips over. A bad
        append is dropped whole; the leader retries it, and the error says which."""
        for entry in message.entries:
            if entry.kind is EntryKind.DATA:
                try:
                    check_data(entry.payload)
                except InvalidBatchError as error:
                    self.appends_refused += 1
                    logger.error("append_refused_invalid_batch", leader=message.source, index=entry.index,
                                      error=str(error))
                    return False
        return True

    def check_repaired(self, logger: Any) -> None:
        """A replica that lost durable entries may vote and lead again once its leader has
        given back everything up to what it had recorded as committed, and committed it."""
        target = getattr(self.store, "repair_until", 0)
        core = self.core
        if core.leader and core.commit_index >= target and core.log.last_index() >= target:
            core.mark_repaired()
            mark = getattr(self.store, "mark_repaired", None)
            if mark is not None:
                mark()
            logger.warning("replica_repaired", commit=core.commit_index)


def cache_release_index(core: RaftCore) -> Index:
    """Through which index this replica's store may drop its cached entries: what is
    applied here and, on a leader, held by every follower it replicates to.

    A follower being sent a snapshot or a far install (INSTALL) is left out: it will
    not read these entries, and waiting for it would pin them until the node's budget
    evicts them. A follower that is down stays in (PROBE): it is usually back within
    the budget's span, and its catch-up then reads from memory. Only the hit rate
    depends on this answer, never what a read returns (see storage/entry_cache.py)."""
    index = core.applied_index
    if core.role is not Role.LEADER:
        return index
    for node in core.membership.members:
        progress = core.progress(node) if node != core.id else None
        if progress is not None and progress.state is not ProgressState.INSTALL and progress.match < index:
            index = progress.match
    return index
