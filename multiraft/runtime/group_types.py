"""What a group runtime is given (`GroupDeps`, `StateMachine`, `SegmentBoundaries`) and
what it shows the edge (`GroupStatus`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from multiraft.runtime.failover import CampaignPacer
from multiraft.runtime.histograms import NodeLatencies
from multiraft.runtime.ready_processor import Persistence
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, Membership, Message, Role
from raftlog.types import GroupId, Index


class StateMachine(Protocol):
    """What a group applies its committed entries to (partition state, metadata catalog)."""

    def apply(self, entry: Entry) -> Any: ...

    def restore(self, data: object, index: Index) -> None: ...


class AppendGuard(Protocol):
    """A compare-and-append: decides on the group's task, right before the core appends
    a proposal, whether it may be appended, seeing the log exactly as the new entries
    would extend it (a mirror's chunk appends only where its offsets are the source's,
    multiraft/node/mirror_append.py). Nothing else runs between `check` and the append."""

    def check(self, core: RaftCore) -> None:
        """Raise a `ClientError` to refuse: nothing is appended and the proposal fails with it."""

    def appended(self, core: RaftCore) -> None:
        """The entries are in the log (its last ones), in `core.term`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStatus:
    """A group as the edge may see it: a read-only snapshot, taken on the loop.

    HTTP, /metrics and the cluster page read these, never the runtime's core: what
    they show is named here, and nothing they do can reach into a running group.
    The leader-only fields are None on any other replica.
    """

    group_id: GroupId
    role: Role
    term: int
    leader: int  # 0: none known
    commit_index: int
    applied_index: int
    last_index: int
    voters: frozenset[int]
    in_sync: frozenset[int] | None  # leader only: the replicas it counts as in sync
    follower_lag_entries: int | None  # leader only: entries the furthest-behind member lacks
    follower_lag_ticks: int | None  # leader only: ticks since that member was caught up
    messages_shed: int
    appends_refused: int
    elections: int
    leader_changes: int
    quiesced: bool


class SegmentBoundaries(Protocol):
    """Partition state at closed-segment ends, for retention (multiraft/node/compaction.py)."""

    def note_segments(self, store: Any, applied: Index, machine: Any, membership: Membership) -> None: ...
    def applied(self, index: Index, machine: Any, membership: Membership) -> None: ...
    def clear(self) -> None: ...


def _always_live(node: int) -> bool:
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDeps:
    """Everything a group runtime is given by its node, once, when it is built.

    One frozen value instead of attributes assigned after construction: what a
    runtime may call is written in one place, and no caller can rewire a running
    group. Every field but `send` and `logger` has the default of a group that runs
    alone (the tests' groups): no flusher, every peer live, no retention bookkeeping.
    """

    send: Callable[[GroupId, Message], None]
    logger: Any
    on_role_change: Callable[[GroupId, Role, int], None] | None = None
    # What a follower runs over every DATA payload it is sent before storing it (a
    # partition's record batches: `check_stored_batch`); it raises InvalidBatchError.
    check_data: Callable[[bytes], object] | None = None
    on_quiesce: Callable[[GroupId, int, int], None] | None = None
    on_failure: Callable[[GroupId], None] | None = None
    # Node-level liveness of a peer: a leader may go quiet past members whose nodes are
    # not live (quiescence.py), and credits live ones for CheckQuorum (pacing.py).
    is_live: Callable[[int], bool] = _always_live
    # The node's tick count (the ticker's): how long a leader was quiet, passed to its
    # ISR when it wakes (`RaftCore.pass_quiet_time`). None: quiet time is not passed.
    node_ticks: Callable[[], int] | None = None
    # Wake this runtime after that many node ticks if it is still quiet in the same spell
    # (a leader quiet past an absent member still in its ISR: it leaves it then).
    wake_after_ticks: Callable[[int, Any], None] | None = None
    # Cross-group group commit (multiraft/runtime/flusher.py); None: the store syncs alone.
    sync: Callable[[Any], Awaitable[None]] | None = None
    store_lazily: Callable[[Any], None] | None = None
    write_states: Callable[[], None] | None = None  # see Flusher.write_states
    # A leader's own appends: made durable without waiting (persistence.BackgroundWrites);
    # None: the leader waits for them like any replica.
    sync_in_background: Callable[[Any], asyncio.Future[None]] | None = None
    # The node's pacer of successor campaigns after a leader's node is gone (failover.py);
    # None: a pacer of this group's own (it campaigns at once).
    campaign_pacer: CampaignPacer | None = None
    latencies: NodeLatencies | None = None  # node-wide histograms (/metrics)
    # Partition state at closed-segment ends, for retention; None: no retention here.
    boundaries: SegmentBoundaries | None = None
    # Reads wait until the replica re-applied what it had committed before it (re)opened,
    # so no reader sees its high watermark go back after a restart.
    replay_until: Index = Index(0)
    # A chaos control's faulty strategy around the real one (persistence.AckBeforeFsync,
    # multiraft/node/unsafe.py); None, always, outside the chaos runner's negative controls.
    persistence_fault: PersistenceFault | None = None


# What the node may inject around a group's real persistence strategy (the chaos
# controls, persistence.AckBeforeFsync): given the real one and the replica's (term,
# vote) when the group opens, the one the group uses.
PersistenceFault = Callable[[Persistence, tuple[int, int]], Persistence]


def status_of(
    group_id: GroupId, core: RaftCore, *, messages_shed: int, appends_refused: int, elections: int,
    leader_changes: int, quiesced: bool,
) -> GroupStatus:
    """A group's `GroupStatus`, read from its core and its runtime's counters."""
    leading = core.role is Role.LEADER
    last = core.log.last_index()
    lag_entries = lag_ticks = None
    if leading:
        matches = [p.match for n in core.membership.members if n != core.id
                   and (p := core.progress(n)) is not None]
        lag_entries = max((last - m for m in matches), default=0)
        lag_ticks = max(core.follower_lag_ticks().values(), default=0)
    return GroupStatus(
        group_id=group_id, role=core.role, term=core.term, leader=core.leader,
        commit_index=core.commit_index, applied_index=core.applied_index, last_index=last,
        voters=frozenset(core.membership.voters), in_sync=frozenset(core.in_sync_replicas()) if leading else None,
        follower_lag_entries=lag_entries, follower_lag_ticks=lag_ticks, messages_shed=messages_shed,
        appends_refused=appends_refused, elections=elections, leader_changes=leader_changes,
        quiesced=quiesced,
    )
