"""`RaftCore`: one replica of one Raft group, as a pure state machine.

Every state transition of the protocol lives in this module (like h11's
`_state.py`). The core never touches clocks, sockets, files or threads: time
arrives as `tick()`, the network as `step(message)`, clients as `propose(...)`,
and everything the core wants done leaves through `ready()` (see `ready.py` for
the order a driver must follow) and is acknowledged with `advance()`.

Roles and their step functions follow the Raft paper and etcd-io/raft:
PreVote (section 9.6 of Ongaro's thesis) keeps a partitioned node from raising
terms on rejoin; CheckQuorum makes a leader that cannot hear a quorum step down,
and gives followers a lease in which they ignore vote requests; a new leader
appends a NOOP so entries of earlier terms commit (section 5.4.2); leadership
transfer uses TimeoutNow; membership changes add or remove one server at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from raftlog.core.config import Config
from raftlog.core.insync import InSyncTracker
from raftlog.core.log import RaftLog
from raftlog.core.progress import Inflights, Progress, ProgressState
from raftlog.core.quorum import VoteResult, committed_index, has_quorum, vote_result
from raftlog.core.read_only import ReadOnlyQueue, ReadRequest
from raftlog.core.ready import Ready
from raftlog.errors import (
    InvalidMembershipChange,
    LeadershipTransferInProgress,
    MembershipChangeInProgress,
    NotEnoughReplicas,
    NotLeader,
    ProposalDropped,
)
from raftlog.messages import (
    ENTRY_OVERHEAD_BYTES,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    ReadState,
    Role,
    SoftState,
    decode_conf_change,
    encode_conf_change,
    entries_size_bytes,
)
from raftlog.storage import CompactedError, LogStorage
from raftlog.types import NO_NODE, Index, NodeId, Term


class RandomSource(Protocol):
    """What the core draws its election jitter from: a seeded `random.Random` in practice."""

    def randrange(self, stop: int, /) -> int: ...


MT = MessageType


class _NullLogger:
    def bind(self, **_: Any) -> _NullLogger:
        return self

    def debug(self, *_: Any, **__: Any) -> None:
        pass

    info = warning = debug


class RaftCore:
    def __init__(
        self, config: Config, storage: LogStorage, rng: RandomSource, logger: Any = None
    ) -> None:
        state = storage.initial_state()
        self.config = config
        self.id = config.node_id
        self._rng = rng
        self.log = RaftLog(storage, config.applied)
        hard = state.hard_state
        # The commit index is stored lazily (no fsync of its own), so it may trail what the
        # state machine applied; applied entries were committed, so take the larger.
        commit = max(hard.commit, self.log.applied)
        assert commit <= self.log.last_index(), "the commit index outlived its entries"
        self.log.commit_to(commit)
        self._commit_earlier_configs()
        self.term: Term = hard.term
        self.vote: NodeId = hard.vote
        self.membership: Membership = state.membership
        self.needs_repair = state.needs_repair
        self._repair_asked = False  # a replica opened in repair asks at its first tick (_tick_election)
        self.leader: NodeId = NO_NODE
        self.role = Role.FOLLOWER
        self.now_ticks = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = config.election_timeout_ticks
        self.lead_transferee: NodeId = NO_NODE
        self._votes: dict[NodeId, bool] = {}
        self._progress: dict[NodeId, Progress] = {}
        # The commit index last sent to each follower (saves redundant commit-only appends).
        self._commit_sent: dict[NodeId, Index] = {}
        self._pending_conf_index = Index(0)
        # The last REMOVE in a leader's log it has not applied (0: none); see `propose`.
        self._pending_removal_index = Index(0)
        self._uncommitted_bytes = 0
        self._read_only = ReadOnlyQueue(config.pending_reads_max)
        self._reads_before_commit: list[ReadRequest] = []
        self._in_sync = InSyncTracker(config.replica_lag_time_max_ticks)
        self._messages: list[Message] = []
        self._persisted_messages: list[Message] = []
        self._read_states: list[ReadState] = []
        self._broadcast_pending = False
        self._commit_broadcast_pending = False
        self._ready_number = 0
        self._outstanding: Ready | None = None
        self._prev_hard_state = hard
        self._prev_soft_state = SoftState()
        # Every line carries the term it was logged in: the logger is bound anew when it moves.
        self._unbound_logger = (logger or _NullLogger()).bind(node_id=self.id)
        self.logger = self._unbound_logger.bind(term=self.term)
        self._become_follower(self.term, NO_NODE)

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        """One unit of logical time passed (the driver decides how long a tick is)."""
        assert self._outstanding is None, "no input between ready() and advance()"
        self.now_ticks += 1
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def step(self, message: Message) -> None:
        assert self._outstanding is None, "no input between ready() and advance()"
        assert message.target == self.id, "the driver routes messages to their target"
        if message.source == self.id:
            return
        if message.term > self.term:
            if not self._accept_higher_term(message):
                return
        elif message.term < self.term:
            self._reply_to_stale(message)
            return
        if message.type in (MT.VOTE_RESPONSE, MT.PRE_VOTE_RESPONSE) and message.commit:
            self._learn_commit(message)  # refusals name the voter's commit, granted pre-votes too
        if message.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(message)
        elif self.role is Role.LEADER:
            self._step_leader(message)
        elif self.role is Role.FOLLOWER:
            self._step_follower(message)
        else:
            self._step_candidate(message)

    def propose(self, payloads: Sequence[bytes], kind: EntryKind = EntryKind.DATA) -> tuple[Term, Index]:
        """Append `payloads` as entries of this leader's term; returns (term, first index).

        Raises `NotLeader` (with a hint) on followers, `LeadershipTransferInProgress`
        during a transfer, and `ProposalDropped` when the uncommitted tail is full or
        while the leader has not applied a removal in its log.

        Why the last: configurations take effect when applied, and a restarted node
        knows only the commit index it synced. Voters {1, 2}, leader 2 removes 1; had
        it appended more, node 1 could hold entries node 2 lost in a crash while node 1
        applied its removal: node 2, restarted with the removal uncommitted, counts
        votes in {1, 2}, and node 1, no longer campaigning, refuses it for ever (its log
        is longer). The same when node 1 itself led with its removal in its log. With
        nothing after the removal until it is applied (then a removed node gets no more
        entries), the remaining voters' logs are never behind a removed node's
        (tests/unit/test_regression_removal_liveness.py).
        """
        assert self._outstanding is None, "no input between ready() and advance()"
        assert kind in (EntryKind.DATA, EntryKind.META), "NOOP and CONFIG entries are the core's own"
        assert payloads, "propose at least one payload"
        self._check_can_propose()
        if self.log.applied < self._pending_removal_index:
            raise ProposalDropped("a membership removal is being applied; retry after it")
        size = sum(len(p) for p in payloads) + ENTRY_OVERHEAD_BYTES * len(payloads)
        if self._uncommitted_bytes and self._uncommitted_bytes + size > self.config.uncommitted_bytes_max:
            raise ProposalDropped("too many uncommitted bytes; retry after commits catch up")
        first = Index(self.log.last_index() + 1)
        term = self.term
        entries = [Entry(Index(first + i), term, kind, p) for i, p in enumerate(payloads)]
        self._append_as_leader(entries, size)
        return term, first

    def propose_membership(self, change: ConfChange) -> tuple[Term, Index]:
        """Propose a single-server membership change (one at a time)."""
        assert self._outstanding is None, "no input between ready() and advance()"
        self._check_can_propose()
        if self.log.applied < self._pending_conf_index:
            raise MembershipChangeInProgress("a membership change is still being applied")
        if not self._committed_in_current_term():
            raise MembershipChangeInProgress("the leader has not committed an entry of its term yet")
        _validate_conf_change(self.membership, change)
        if change.op is ConfChangeOp.REMOVE and change.node_id == self.id:
            # A leader that removed itself would stop replicating before the remaining
            # voters learned the commit of its removal, leaving them without a quorum.
            raise InvalidMembershipChange("the leader cannot remove itself; transfer leadership first")
        payload = encode_conf_change(change)
        index = Index(self.log.last_index() + 1)
        entry = Entry(index, self.term, EntryKind.CONFIG, payload)
        self._append_as_leader([entry], entry.size_bytes())
        self._pending_conf_index = index
        if change.op is ConfChangeOp.REMOVE:
            self._pending_removal_index = index
        self.logger.info("membership_change_proposed", op=change.op.name, node=change.node_id, index=index)
        return self.term, index

    def transfer_leadership(self, target: NodeId | None = None) -> NodeId:
        """Hand leadership to `target`, or to the most caught-up in-sync voter."""
        assert self._outstanding is None, "no input between ready() and advance()"
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if target is None:
            target = self._best_transfer_target()
            if target is None:
                raise NotEnoughReplicas("no in-sync voter to transfer leadership to")
        if target == self.id:
            return target
        if target not in self.membership.voters:
            raise InvalidMembershipChange(f"node {target} is not a voter of this group")
        if self.lead_transferee == target:
            return target
        self.lead_transferee = target
        self.election_elapsed = 0  # the transfer is abandoned after one election timeout
        self.logger.info("leadership_transfer_started", target=target)
        if self._progress[target].match == self.log.last_index():
            self._send(self._message(MT.TIMEOUT_NOW, target))
        else:
            self._send_append(target)
        return target

    def campaign(self) -> None:
        """Start an election now (with PreVote when configured), if this node may lead.

        For a driver that knows this replica should lead (the preferred leader of a new
        group); everyone else still waits out their randomized timeouts.
        """
        assert self._outstanding is None, "no input between ready() and advance()"
        if self.role is not Role.LEADER and self._promotable():
            self.election_elapsed = 0
            self._campaign(transfer=False)

    def forget_leader(self, leader: NodeId) -> None:
        """The driver learned that `leader`'s node is gone (say, its process refuses
        connections): stop honouring its lease, so another replica's vote request is
        heard now rather than after our election timeout. Like our timer running out
        early, which Raft allows at any moment (its safety never rests on timing): a
        leader that is alive after all is followed again at its next message."""
        assert self._outstanding is None, "no input between ready() and advance()"
        if self.role is Role.FOLLOWER and self.leader == leader != NO_NODE:
            self.leader = NO_NODE
            self.logger.info("leader_forgotten", leader=leader)

    def note_active(self, node: NodeId) -> None:
        """The driver knows `node`'s process is alive and talking to this node (its
        node-level liveness: a frame from it within an election timeout): count the
        member active for this round's CheckQuorum, as an answer from its replica would.

        Why: on an overloaded node a follower's replica answers a new leader only after
        its flush, and answers nothing while it waits for one; counted per group, the
        leader stepped down at its first check (one election timeout after winning), and
        each step-down was another election on the same overloaded nodes.

        Why it is safe: CheckQuorum serves liveness only here. It lets a leader cut off
        from a majority step down so that the rest elect another (and backs the
        followers' lease against disruptive candidates); no read relies on a leader
        lease: `read_index` confirms leadership with a heartbeat round that a quorum of
        replicas must answer, and commits count replicas' acknowledgements, never
        `recent_active`. A leader whose node is cut off from a majority of nodes hears no
        node of theirs, is credited nothing, and still steps down. Wrong credit (a live
        node whose replica is stuck) keeps a leader that cannot commit in place until
        its replica answers or the node falls silent: a delay, never a second leader
        (elections need votes). A no-op on anyone but a leader, and for a non-member."""
        assert self._outstanding is None, "no input between ready() and advance()"
        progress = self._progress.get(node)
        if self.role is Role.LEADER and progress is not None:
            progress.recent_active = True

    def pass_quiet_time(self, ticks: int, present: Iterable[NodeId]) -> None:
        """A quiet leader wakes after the driver withheld `ticks` ticks (quiescence): that
        time still passed for the ISR, which is measured in ticks. Members `present` (the
        driver sees their nodes live now) that hold the whole log count as caught up all
        along: the log did not grow while the group was quiet. Any other member ages by
        `ticks`, and leaves the ISR if its lag passes the limit, as it would have had the
        group ticked. Why: a leader may go quiet past a member whose node is down (its
        ticks would only send heartbeats nobody answers, thousands of groups of them on
        a node that lost a peer); without this its ISR would keep the dead member until
        the group had ticked for the whole lag time again.

        No timer moves and nothing is sent: only `now_ticks` and the ISR's samples. A
        no-op on anyone but a leader (a follower's `now_ticks` measures nothing)."""
        assert self._outstanding is None, "no input between ready() and advance()"
        assert ticks >= 0
        if self.role is not Role.LEADER or ticks == 0:
            return
        self.now_ticks += ticks
        last = self.log.last_index()
        self._in_sync.sample(self.now_ticks, last)
        for node in present:
            progress = self._progress.get(node)
            if node != self.id and progress is not None and progress.match >= last:
                self._in_sync.record_match(node, progress.match, self.now_ticks, last)

    def announce(self, target: NodeId) -> None:
        """Tell `target` (the leader the driver heard of) where this follower's log ends,
        as a replica in repair does (`_say_log_end`). For a replica reopened after a
        restart that knows no leader yet: the message wakes a quiet leader, whose
        heartbeats then find this replica and catch it up, instead of this replica
        ticking until it campaigns (thousands of pre-vote rounds on a node reopening
        thousands of groups). Whatever the leader's term, a message is all this is: a
        stale one is dropped, and a wrong target ignores it."""
        assert self._outstanding is None, "no input between ready() and advance()"
        if self.role is Role.FOLLOWER and target != self.id:
            self._say_log_end(target)

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; a `ReadState` with `context` arrives in a Ready."""
        assert self._outstanding is None, "no input between ready() and advance()"
        assert context, "read contexts identify requests and must not be empty"
        if self.role is Role.LEADER:
            if not self._leader_read_index(ReadRequest(self.log.committed, context, self.id)):
                raise ProposalDropped("too many pending reads")
        elif self.leader != NO_NODE:
            self._send(self._message(MT.READ_INDEX, self.leader, context=context))
        else:
            raise NotLeader(NO_NODE, "no leader known to confirm a read")

    def report_snapshot(self, target: NodeId, success: bool) -> None:
        """The driver finished (or failed) moving a snapshot to `target`."""
        progress = self._progress.get(target)
        if self.role is not Role.LEADER or progress is None:
            return
        if progress.state is ProgressState.INSTALL:
            if not success:
                progress.install_index = Index(0)
            progress.become_probe()
            progress.probe_sent = True  # wait for the follower's answer or a heartbeat

    def hold_for_install(self, target: NodeId, index: Index) -> bool:
        """Far-horizon catch-up: the driver will move `target`'s log up to `index` as whole
        files, outside the messages of the log (multiraft/node/catchup_leader.py). Until
        `finish_install` (or the install timeout, which `install_progressing` defers) no
        append goes to it: the INSTALL state a snapshot uses. False, and nothing changes,
        unless this replica leads, `target` replicates normally (its match is known, not
        a guess of a new leader's probe) and `index` is committed and beyond that match:
        only committed entries may replace what a follower holds."""
        progress = self._progress.get(target)
        if self.role is not Role.LEADER or progress is None or target == self.id:
            return False
        if progress.state is not ProgressState.REPLICATE or not progress.match < index <= self.log.committed:
            return False
        progress.become_install(index)
        self.logger.info("far_install_started", target=target, index=index)
        return True

    def end_far_wait(self, target: NodeId) -> None:
        """The driver will not hold `target` for a far-horizon install now: replay starts
        at once instead of when its far wait runs out (Config.far_wait_learners)."""
        progress = self._progress.get(target)
        if self.role is Role.LEADER and progress is not None and progress.far_wait > 0:
            progress.far_wait = 0
            self._send_append(target)

    def install_progressing(self, target: NodeId) -> None:
        """The far-horizon transfer to `target` moved on: its install has not timed out."""
        progress = self._progress.get(target)
        if self.role is Role.LEADER and progress is not None and progress.state is ProgressState.INSTALL:
            progress.install_ticks = 0

    def finish_install(self, target: NodeId, success: bool) -> None:
        """The far-horizon install on `target` ended: probe it at once from where it should
        now stand (past the install on success, at its old match otherwise). A follower
        that does not hold what the probe names refuses it, and probing goes on as usual."""
        self.report_snapshot(target, success)
        progress = self._progress.get(target)
        if self.role is Role.LEADER and progress is not None and progress.state is ProgressState.PROBE:
            progress.probe_sent = False
            self._send_append(target)

    def report_unreachable(self, target: NodeId) -> None:
        progress = self._progress.get(target)
        if self.role is Role.LEADER and progress and progress.state is ProgressState.REPLICATE:
            progress.become_probe()

    # ------------------------------------------------------------------ queries

    @property
    def commit_index(self) -> Index:
        return self.log.committed

    @property
    def applied_index(self) -> Index:
        return self.log.applied

    def ticks_before_timer(self) -> int:
        """How many `tick()` calls from now only count time: none of them fires a timer
        (no campaign, heartbeat, CheckQuorum, transfer abort, install timeout, far wait or
        repair report) nor sends anything. A driver may hold that many back and apply them
        later, in order, before the next input, with the same effect as at once (a
        leader's ISR samples its last index per tick, which does not change meanwhile).

        A replica that cannot campaign has no timer: the answer is then bounded by an
        election timeout, to keep what a driver holds back (and its catch-up) small."""
        if self.role is Role.LEADER:
            if any(p.state is ProgressState.INSTALL or p.far_wait for p in self._progress.values()):
                return 0
            heartbeat = self.config.heartbeat_interval_ticks - self.heartbeat_elapsed
            check = self.config.election_timeout_ticks - self.election_elapsed
            return max(0, min(heartbeat, check) - 1)
        if self.needs_repair:
            return 0  # its repair report is due every randomized timeout: tick it at once
        if not self._promotable():
            return self.config.election_timeout_ticks
        return max(0, self.randomized_election_timeout - self.election_elapsed - 1)

    def progress(self, node: NodeId) -> Progress | None:
        return self._progress.get(node)

    @property
    def pending_read_count(self) -> int:
        """Linearizable reads waiting for a quorum (or for the first commit of the term)."""
        return len(self._read_only) + len(self._reads_before_commit)

    def in_sync_replicas(self) -> frozenset[NodeId]:
        """The ISR: this leader plus every member caught up within the lag time."""
        if self.role is not Role.LEADER:
            return frozenset()
        return self._in_sync.in_sync(self.now_ticks) | {self.id}

    def follower_lag_ticks(self) -> dict[NodeId, int]:
        """Per member other than this leader: ticks since it was last caught up (empty
        on a follower). The time lag of DESIGN.md principle 6, for metrics."""
        if self.role is not Role.LEADER:
            return {}
        return {node: self._in_sync.lag_ticks(node, self.now_ticks) for node in self.membership.members - {self.id}}

    def out_of_sync_replicas(self) -> frozenset[NodeId]:
        if self.role is not Role.LEADER:
            return frozenset()
        return self._in_sync.out_of_sync(self.now_ticks)

    def check_min_insync(self, min_insync_replicas: int) -> None:
        """Raise `NotEnoughReplicas` unless at least that many voters are in sync."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if min_insync_replicas <= 1 and self.id in self.membership.voters:
            return  # a voting leader is in sync with itself (the default; asked per produce)
        in_sync = len(self.in_sync_replicas() & self.membership.voters)
        if in_sync < min_insync_replicas:
            raise NotEnoughReplicas(
                f"{in_sync} in-sync replicas, fewer than min_insync_replicas={min_insync_replicas}"
            )

    # ------------------------------------------------------------------ Ready / advance

    def has_ready(self) -> bool:
        assert self._outstanding is None
        return bool(
            self._messages
            or self._persisted_messages
            or self._read_states
            or self.log.has_unwritten()
            or self.log.pending_snapshot is not None
            or self._broadcast_pending
            or self._commit_broadcast_pending
            or self.log.committed > self.log.applied
            or self._state_changed()
        )

    def _state_changed(self) -> bool:
        """Hard or soft state differ from the last Ready's (compared field by field:
        asked several times per Ready, building the two states each time showed up)."""
        hard, soft = self._prev_hard_state, self._prev_soft_state
        return (
            self.term != hard.term
            or self.vote != hard.vote
            or self.log.committed != hard.commit
            or self.leader != soft.leader
            or self.role is not soft.role
        )

    def ready(self) -> Ready:
        assert self._outstanding is None, "advance() the previous Ready first"
        if self.role is Role.LEADER:
            self._flush_broadcast()
        hard_state = self._hard_state()
        soft_state = self._soft_state()
        prev = self._prev_hard_state
        changed_hard = hard_state if hard_state != prev else None
        snapshot = self.log.pending_snapshot
        committed: tuple[Entry, ...] = ()
        if snapshot is None and self.log.committed > self.log.applied:
            committed = tuple(
                self.log.slice(
                    Index(self.log.applied + 1),
                    Index(self.log.committed + 1),
                    self.config.committed_bytes_per_ready_max,
                )
            )
        entries = tuple(self.log.unwritten())
        must_sync = bool(entries) or snapshot is not None or (
            changed_hard is not None and (hard_state.term != prev.term or hard_state.vote != prev.vote)
        ) or bool(self._persisted_messages and self.log.has_in_progress())
        # (The last case: an answer about entries a leader wrote without waiting for their
        # fsync, before it stepped down, waits for that fsync like any other promise.)
        self._ready_number += 1
        ready = Ready(
            number=self._ready_number,
            hard_state=changed_hard,
            soft_state=soft_state if soft_state != self._prev_soft_state else None,
            entries=entries,
            snapshot=snapshot,
            messages=tuple(self._messages),
            persisted_messages=tuple(self._persisted_messages),
            committed_entries=committed,
            read_states=tuple(self._read_states),
            must_sync=must_sync,
        )
        self._messages.clear()
        self._persisted_messages.clear()
        self._read_states.clear()
        self._outstanding = ready
        return ready

    def may_persist_later(self, ready: Ready) -> bool:
        """May the driver `advance(ready, persisted=False)`: go on before `ready`'s entries
        are durable, and report them with `persisted` when they are?

        Only a leader's plain appends: its own write promises nothing to anyone (it
        counts itself toward the quorum only once `persisted` says so), so two
        followers' acknowledgements commit an entry while the leader's fsync still
        runs (Raft allows the leader's write in parallel with replication; etcd's
        asynchronous storage writes do the same). A snapshot, a term or vote change,
        and any message that promises durability wait for the disk as always."""
        return (
            self.role is Role.LEADER
            and bool(ready.entries)
            and ready.snapshot is None
            and not ready.persisted_messages
            and (ready.hard_state is None or (ready.hard_state.term, ready.hard_state.vote) == (
                self._prev_hard_state.term, self._prev_hard_state.vote))
        )

    def advance(self, ready: Ready, persisted: bool = True) -> None:
        """The driver sent and applied everything in `ready`, and wrote what it holds.

        `persisted`: the write is durable (synced: with it, everything written for
        earlier Readys too). False only where `may_persist_later` allows; the driver
        then calls `persisted(index, term)` once the write's fsync is done."""
        assert self._outstanding is not None and ready.number == self._outstanding.number, (
            "advance() acknowledges the outstanding Ready"
        )
        assert persisted or self.may_persist_later(ready), "only a leader's plain appends persist later"
        self._outstanding = None
        if ready.hard_state is not None:
            self._prev_hard_state = ready.hard_state
        if ready.soft_state is not None:
            self._prev_soft_state = ready.soft_state
        if ready.snapshot is not None:
            self.log.snapshot_installed(ready.snapshot)
        if persisted and (ready.entries or ready.must_sync):
            self.log.stable_to_in_progress()
        if persisted and self.role is Role.LEADER and (ready.entries or ready.snapshot or ready.must_sync):
            self._count_own_write()
        if ready.committed_entries:
            self.log.applied_to(ready.committed_entries[-1].index)
            if self.role is Role.LEADER:
                size = entries_size_bytes(ready.committed_entries)
                self._uncommitted_bytes = max(0, self._uncommitted_bytes - size)
            for entry in ready.committed_entries:
                if entry.kind is EntryKind.CONFIG:
                    self._apply_conf_change(decode_conf_change(entry.payload))

    def persisted(self, index: Index, term: Term) -> None:
        """Entries through `index` (`index` of `term`) that a Ready handed out with
        `advance(ready, persisted=False)` are durable. A report about entries replaced
        since (this node stepped down and a new leader overwrote them) changes nothing."""
        assert self._outstanding is None, "no input between ready() and advance()"
        if self.log.stable_to(index, term) and self.role is Role.LEADER:
            self._count_own_write()

    def _count_own_write(self) -> None:
        """The leader counts itself toward the quorum only for what it persisted."""
        if self._progress[self.id].maybe_update(self.log.stable_last_index()):
            self._maybe_commit()

    # ------------------------------------------------------------------ role changes

    def _reset(self, term: Term) -> None:
        if term != self.term:
            assert term > self.term, "terms never go back"
            self.term = term
            self.vote = NO_NODE
            self.logger = self._unbound_logger.bind(term=term)
        self.leader = NO_NODE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        timeout = self.config.election_timeout_ticks
        self.randomized_election_timeout = timeout + self._rng.randrange(timeout)
        self.lead_transferee = NO_NODE
        self._votes = {}
        self._progress = {}
        self._commit_sent = {}
        self._pending_conf_index = Index(0)
        self._pending_removal_index = Index(0)
        self._uncommitted_bytes = 0
        self._read_only.clear()
        self._reads_before_commit.clear()
        self._broadcast_pending = False
        self._commit_broadcast_pending = False

    def _become_follower(self, term: Term, leader: NodeId) -> None:
        self._reset(term)
        self.leader = leader
        self.role = Role.FOLLOWER
        self.logger.debug("became_follower", leader=leader)

    def _become_pre_candidate(self) -> None:
        assert self.role is not Role.LEADER, "a leader does not campaign"
        self.role = Role.PRE_CANDIDATE
        self._votes = {}
        self.leader = NO_NODE
        self.logger.debug("became_pre_candidate")

    def _become_candidate(self) -> None:
        assert self.role is not Role.LEADER, "a leader does not campaign"
        self._reset(Term(self.term + 1))
        self.vote = self.id
        self.role = Role.CANDIDATE
        self.logger.debug("became_candidate")

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE, "only a candidate becomes leader"
        self._reset(self.term)
        self.leader = self.id
        self.role = Role.LEADER
        last = self.log.last_index()
        for node in sorted(self.membership.members | {self.id}):
            self._add_progress(node, last)
        self._progress[self.id].maybe_update(self.log.stable_last_index())
        self._progress[self.id].become_replicate()
        others = self.membership.members - {self.id}
        self._in_sync.reset(
            self.now_ticks, in_sync=others & self.membership.voters, others=others - self.membership.voters
        )
        # No membership change until everything before this term is applied.
        self._pending_conf_index = last
        self._pending_removal_index = self._last_unapplied_removal()
        noop = Entry(Index(last + 1), self.term, EntryKind.NOOP)
        self._append_as_leader([noop], noop.size_bytes())
        self.logger.info("became_leader", last_index=last)

    def _last_unapplied_removal(self) -> Index:
        tail = self.log.slice(Index(self.log.applied + 1), Index(self.log.last_index() + 1), 1 << 62)
        removals = [
            entry.index for entry in tail
            if entry.kind is EntryKind.CONFIG and decode_conf_change(entry.payload).op is ConfChangeOp.REMOVE
        ]
        return removals[-1] if removals else Index(0)

    def _add_progress(self, node: NodeId, last: Index) -> None:
        learner = node in self.membership.learners
        self._progress[node] = Progress(
            match=Index(0),
            next=Index(last + 1),
            inflights=Inflights(*self._window(learner)),
            is_learner=learner,
            recent_active=node == self.id,
        )

    def _window(self, learner: bool) -> tuple[int, int]:
        """(messages, bytes) in flight toward a member: smaller toward a learner."""
        config = self.config
        if not learner:
            return config.inflight_messages_max, config.inflight_bytes_max
        messages = min(config.inflight_messages_max, config.learner_inflight_messages_max)
        return messages, min(config.inflight_bytes_max, messages * config.message_bytes_max)

    # ------------------------------------------------------------------ ticking

    def _promotable(self) -> bool:
        return (
            self.id in self.membership.voters
            and self.log.pending_snapshot is None
            and not self.needs_repair
        )

    def mark_repaired(self) -> None:
        """The driver restored this replica's log from the leader: it may vote and lead again."""
        self.needs_repair = False

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self._promotable() and self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self._campaign(transfer=False)
        elif (
            self.needs_repair
            and self.role is Role.FOLLOWER
            and (not self._repair_asked or self.election_elapsed % self.randomized_election_timeout == 0)
        ):
            # The first time at once: a node back with a lost log (a replaced disk, a cut at
            # damage) is caught up that much sooner; its quiet leader hears nothing else.
            self._repair_asked = True
            self._ask_for_repair()

    def _ask_for_repair(self) -> None:
        """A replica in repair heard no leader for an election timeout: say what it holds.

        It may not campaign, the one thing that makes a follower heard when its leader is
        silent. And a leader is silent when its group is idle: it quiesced (it stopped
        ticking and sending) while it credited this replica with the whole log, before
        the replica lost part of it (a restart that found a damaged segment). Left alone,
        the replica would stay short, and in the ISR, until the next write. So it says it
        lost entries, as it does in answer to a heartbeat, every election timeout while no
        leader talks to it: to its leader, or to every voter while it knows none (a
        follower ignores it; a quiet one merely wakes, and its leader, woken too, quiets
        it again), counting the driver's `repair_contacts` in case the cut took the
        configuration entries with it. The leader forgets the match, drops it from the
        ISR and probes. Its elapsed time is left running: the lease rule for vote
        requests reads it."""
        if self.leader != NO_NODE:
            targets = [self.leader]
        else:
            targets = sorted((self.membership.voters | self.config.repair_contacts) - {self.id})
        self.logger.debug("repair_requested", targets=targets, last_index=self.log.last_index())
        for target in targets:
            self._say_log_end(target)

    def _say_log_end(self, target: NodeId) -> None:
        """Tell `target` that this log ends at its last entry, below what it may have
        acknowledged: a rejection of index 0, which no append can draw (see
        `_handle_append_rejection`), naming the last entry so the leader probes from there."""
        self._send(self._message(
            MT.APPEND_RESPONSE, target, index=Index(0), reject=True,
            reject_hint=self.log.last_index(), log_term=self.log.last_term(),
        ))

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_timeout_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self.logger.info("stepped_down_no_quorum")
                self._become_follower(self.term, NO_NODE)
                return
            for node, progress in self._progress.items():
                progress.recent_active = node == self.id
            if self.lead_transferee != NO_NODE:
                self.logger.info("leadership_transfer_aborted", target=self.lead_transferee)
                self.lead_transferee = NO_NODE
        self._in_sync.sample(self.now_ticks, self.log.last_index())
        for node, progress in self._progress.items():
            if progress.state is ProgressState.INSTALL:
                progress.install_ticks += 1
                if progress.install_ticks >= self.config.snapshot_timeout_ticks:
                    self.logger.info("install_timed_out", target=node)
                    progress.become_probe()
            elif progress.far_wait > 0:
                progress.far_wait -= 1
                if progress.far_wait == 0:  # no far-horizon install came: replay
                    self._send_append(node)
        if self.heartbeat_elapsed >= self.config.heartbeat_interval_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat(self._read_only.last_context())

    def _quorum_active(self) -> bool:
        active = [node for node, progress in self._progress.items() if progress.recent_active]
        return has_quorum(self.membership.voters, active)

    # ------------------------------------------------------------------ elections

    def _campaign(self, transfer: bool) -> None:
        """Start a pre-vote round, or (for a transfer, or without PreVote) a real election."""
        if self._has_unapplied_config():
            # Our membership may be two changes behind the one in force; the two majorities
            # need not overlap, so votes counted by the old one could elect a second leader.
            self.logger.info("campaign_deferred_unapplied_config")
            self._probe_commit()
            return
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
            self._request_votes(MT.PRE_VOTE, Term(self.term + 1), transfer=False)
        else:
            self._become_candidate()
            self._request_votes(MT.VOTE, self.term, transfer=transfer)

    def _commit_earlier_configs(self) -> None:
        """Take back a commit a crash lost, from the log alone: every CONFIG entry before
        the last one in our log is committed.

        Why it holds: a leader appends a CONFIG entry only once it applied every one before
        it in its log (`propose_membership`: `_pending_conf_index` is its last index when it
        was elected, then each change it proposed), and by Log Matching our log up to that
        entry is the leader's. It restores etcd's "Append" invariant, which a lazily stored
        commit breaks: after a whole-cluster power failure every voter could hold two
        changes above its stored commit, and all of them would defer their campaigns for
        ever (`_has_unapplied_config`), no leader ever again (found in review of seed
        1404912's fix; tests/unit/test_regression_stale_membership.py)."""
        if self.log.last_index() <= self.log.committed or self.log.pending_snapshot is not None:
            return
        tail = self.log.slice(Index(self.log.committed + 1), Index(self.log.last_index() + 1), 1 << 62)
        configs = [entry.index for entry in tail if entry.kind is EntryKind.CONFIG]
        if len(configs) >= 2:
            self.log.commit_to(configs[-2])

    def _probe_commit(self) -> None:
        """Ask the voters we know for their commit index, by a pre-vote that cannot win.

        A node deferred by two changes above a commit it lost may be the only one that
        could lead: voters {1, 2, 3} remove 2, then 1; node 3 crashes and keeps both
        removals above its stored commit, and the removed nodes never campaign, so no
        request or refusal ever tells it the commit (simulator seed 1500511, with a
        learner change as the second entry). A pre-vote changes no term or vote where it
        lands; every answer names the voter's commit (`_learn_commit`), and the round is
        never tallied: once the commit is learned and applied, the next timeout campaigns."""
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in sorted(self.membership.voters - {self.id}):
            self._send(Message(
                type=MT.PRE_VOTE, source=self.id, target=voter, term=Term(self.term + 1),
                index=last_index, log_term=last_term, commit=self.log.committed,
            ))

    def _has_unapplied_config(self) -> bool:
        """May our membership (the applied one) be two or more changes behind the one in
        force? Then majorities counted in it need not overlap those of the one in force.

        etcd's guard is the first case only: a CONFIG entry committed but not applied.
        It is enough where a log holding a membership change always holds, durably, a
        commit index covering the change before it (etcd's "Append" invariant). Ours does
        not: the commit index is stored lazily and only as far as the log was durable, so
        a crash can leave a log holding two changes above its stored commit. The
        simulator found it (seed 1404912, tests/unit/test_regression_stale_membership.py):
        voters {1..5}; the leader removes 4, then 1, then commits an entry with {2, 5};
        node 3, restarted with both removals in its log but a commit below them, counts
        votes in {1..5}, wins them from the removed nodes 1 and 4, and leads without the
        committed entry. So two CONFIG entries above the applied index, committed or not,
        also defer a campaign (one is fine: the two memberships differ by one voter). Such
        a node learns the commit from a leader, a refusal (`_learn_commit`) or another
        candidate's request (`_learn_commit_from_candidate`), and then applies."""
        if self.log.pending_snapshot is not None or self.log.last_index() <= self.log.applied:
            return False
        pending = self.log.slice(Index(self.log.applied + 1), Index(self.log.last_index() + 1), 1 << 62)
        configs = [entry.index for entry in pending if entry.kind is EntryKind.CONFIG]
        return len(configs) >= 2 or any(index <= self.log.committed for index in configs)

    def _request_votes(self, kind: MessageType, term: Term, transfer: bool) -> None:
        self._votes[self.id] = True
        if self._tally_votes():
            return
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in sorted(self.membership.voters - {self.id}):
            self._send(
                Message(
                    type=kind, source=self.id, target=voter, term=term,
                    index=last_index, log_term=last_term, transfer=transfer,
                    commit=self.log.committed,  # for voters that may not campaign yet
                )
            )

    def _tally_votes(self) -> bool:
        """Act on the votes so far; True when the campaign ended."""
        result = vote_result(self.membership.voters, self._votes)
        if result is VoteResult.WON and self._has_unapplied_config():
            # A commit learned during the round (`_learn_commit`) showed our membership may be
            # stale: votes counted in it elect nobody.
            self._become_follower(self.term, NO_NODE)
            return True
        if result is VoteResult.WON:
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate()  # the pre-vote won: now the real election
                self._request_votes(MT.VOTE, self.term, transfer=False)
            else:
                self._become_leader()
            return True
        if result is VoteResult.LOST:
            self._become_follower(self.term, NO_NODE)
            return True
        return False

    def _accept_higher_term(self, message: Message) -> bool:
        """Handle a message from a higher term; False when it must be ignored."""
        if message.type in (MT.VOTE, MT.PRE_VOTE):
            in_lease = (
                self.config.check_quorum
                and self.leader != NO_NODE
                and self.election_elapsed < self.config.election_timeout_ticks
            )
            if in_lease and not message.transfer:
                return False  # we heard from a live leader recently: ignore the disruption
        if message.type is MT.PRE_VOTE:
            return True  # never change term on a pre-vote
        if message.type is MT.PRE_VOTE_RESPONSE and not message.reject:
            return True  # granted pre-votes carry the term we would campaign in
        if message.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            self._become_follower(message.term, message.source)
        else:
            # Raft's rule: only a leader's message or a granted vote resets the election
            # timer. Keeping it here stops a node with a fast clock and a stale log from
            # holding everyone else's timers back forever by campaigning first each time.
            elapsed = self.election_elapsed if self.role is not Role.LEADER else 0
            self._become_follower(message.term, NO_NODE)
            self.election_elapsed = elapsed
        return True

    def _reply_to_stale(self, message: Message) -> None:
        """Tell a node from an older term about ours, so a stale leader steps down and a
        stale candidate campaigns above our term next time (Raft's rule; etcd drops a
        stale vote request, but a voter whose own requests never reach the candidate,
        its configuration being an older one, would then never meet it in one term)."""
        if message.type in (MT.APPEND, MT.HEARTBEAT) and (self.config.check_quorum or self.config.pre_vote):
            self._send(self._message(MT.APPEND_RESPONSE, message.source))
        elif message.type is MT.PRE_VOTE:
            self._send(self._message(MT.PRE_VOTE_RESPONSE, message.source, reject=True))
        elif message.type is MT.VOTE:
            self._send(self._message(MT.VOTE_RESPONSE, message.source, reject=True))

    def _handle_vote_request(self, message: Message) -> None:
        self._learn_commit_from_candidate(message)
        can_vote = (
            self.vote == message.source
            or (self.vote == NO_NODE and self.leader == NO_NODE)
            or (message.type is MT.PRE_VOTE and message.term > self.term)
        )
        if can_vote and not self.needs_repair and self._candidate_up_to_date(message):
            self._grant_vote(message)
        else:
            # The refusal names our commit index and its entry's term (see `_learn_commit`).
            response = MT.VOTE_RESPONSE if message.type is MT.VOTE else MT.PRE_VOTE_RESPONSE
            commit = self.log.committed
            commit_term = self.log.term_or_none(commit)
            self._send(self._message(
                response, message.source, reject=True,
                commit=commit if commit_term is not None else Index(0), log_term=commit_term or Term(0),
            ))

    def _learn_commit(self, refusal: Message) -> None:
        """A voter refused us and named its commit index: if our log holds that entry (same
        index and term), everything up to it is committed, and we may know it too.

        Our commit index may trail what we once knew: it is stored lazily, so a crash can
        take it back. With it goes the membership, which only applied CONFIG entries change
        (a restart re-applies the log up to the stored commit). The simulator found the
        deadlock (seed 93198, `tests/unit/test_regression_forgotten_commit.py`): voters
        {1, 3}; leader 1 commits and applies REMOVE 3, and so does node 3, which then
        never campaigns; node 1 crashes and forgets the commit, so it counts votes in
        {1, 3} again; it wins one term there with node 3's vote, sends node 3 its NOOP and
        crashes before that entry is durable on its own disk. Now node 3's log is longer,
        so it refuses node 1 for ever, and node 1, the only voter in truth, never learns
        that it is. A committed index is a fact, not an opinion of a leader: by Log
        Matching our log up to it is the voter's, all committed. Learning it only raises
        our commit index (and, applied, our membership); it changes no vote, term or log.
        A leader commits by counting and keeps to that."""
        if self.role is Role.LEADER:
            return
        if self.log.maybe_commit(refusal.commit, refusal.log_term):
            self.logger.info("commit_learned", source=refusal.source, commit=refusal.commit)

    def _learn_commit_from_candidate(self, request: Message) -> None:
        """A candidate's request names its commit index; if our log holds the candidate's
        last entry (same index and term), our logs agree up to it (Log Matching) and so
        does what the candidate knows committed there.

        Why: a node that may not campaign (`_has_unapplied_config`: two membership changes
        above its applied index) waits to learn the commit. When the only node that knows
        it has the shorter log, that node's campaigns are refused by the longer logs, and
        without this they would never learn it: no leader, ever."""
        if self.role is Role.LEADER or request.commit <= self.log.committed:
            return
        if request.index > self.log.last_index() or not self.log.match_term(request.index, request.log_term):
            return
        self.log.commit_to(Index(min(request.commit, request.index)))
        self.logger.info("commit_learned", source=request.source, commit=self.log.committed)

    def _candidate_up_to_date(self, message: Message) -> bool:
        return self.log.is_up_to_date(message.index, message.log_term)

    def _grant_vote(self, message: Message) -> None:
        if message.type is MT.PRE_VOTE:
            # A pre-vote promises nothing: it may leave at once, in the asked term. It names
            # our commit as a refusal does, for a candidate deferred until it knows the commit.
            commit = self.log.committed
            commit_term = self.log.term_or_none(commit)
            self._send(Message(
                type=MT.PRE_VOTE_RESPONSE, source=self.id, target=message.source, term=message.term,
                commit=commit if commit_term is not None else Index(0), log_term=commit_term or Term(0),
            ))
            return
        self.vote = message.source
        self.election_elapsed = 0
        self.logger.debug("vote_granted", candidate=message.source)
        # The vote is a promise: it leaves only after the hard state is durable.
        self._send_after_persist(self._message(MT.VOTE_RESPONSE, message.source))

    def _step_candidate(self, message: Message) -> None:
        kind = message.type
        if kind in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            self._become_follower(self.term, message.source)
            self._step_follower(message)
        elif (kind is MT.PRE_VOTE_RESPONSE and self.role is Role.PRE_CANDIDATE) or (
            kind is MT.VOTE_RESPONSE and self.role is Role.CANDIDATE
        ):
            self._votes.setdefault(message.source, not message.reject)
            self._tally_votes()

    # ------------------------------------------------------------------ follower

    def _step_follower(self, message: Message) -> None:
        kind = message.type
        if kind in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            self.election_elapsed = 0
            self.leader = message.source
            if kind is MT.APPEND:
                self._handle_append(message)
            elif kind is MT.HEARTBEAT:
                # The leader's commit for us is capped by the match it believes we have; a
                # replica that lost its tail (needs repair) holds less. Its prefix still
                # matches the leader's (only this term's leader appends), so commit what is there.
                last = self.log.last_index()
                self.log.commit_to(Index(min(message.commit, last)))
                self._send(self._message(MT.HEARTBEAT_RESPONSE, message.source, context=message.context))
                if message.commit > last:
                    # The leader believes we hold entries we no longer have (we lost a tail:
                    # a replica in repair). Say so, and the leader probes from our last
                    # entry: its appends would not find out, as it never probes below what
                    # we acknowledged, and an idle group sends none.
                    self._say_log_end(message.source)
            else:
                self._handle_snapshot(message)
        elif kind is MT.TIMEOUT_NOW:
            if self._promotable():
                self.logger.info("campaign_on_timeout_now", source=message.source)
                self._campaign(transfer=True)
        elif kind is MT.READ_INDEX_RESPONSE:
            self._read_states.append(ReadState(message.index, message.context))

    def _handle_append(self, message: Message) -> None:
        if message.index < self.log.committed:
            self._acknowledge_append(message.source, self.log.committed)
            return
        last_new = self.log.maybe_append(message.index, message.log_term, message.commit, message.entries)
        if last_new is not None:
            self._acknowledge_append(message.source, last_new)
            return
        hint = Index(min(message.index, self.log.last_index()))
        hint_index, hint_term = self.log.find_conflict_by_term(hint, message.log_term)
        self._send(
            self._message(
                MT.APPEND_RESPONSE, message.source, index=message.index, reject=True,
                reject_hint=hint_index, log_term=hint_term,
            )
        )

    def _acknowledge_append(self, leader: NodeId, index: Index) -> None:
        # "I hold the log up to index": true only once this Ready's entries are durable.
        self._send_after_persist(self._message(MT.APPEND_RESPONSE, leader, index=index))

    def _handle_snapshot(self, message: Message) -> None:
        snapshot = message.snapshot
        assert snapshot is not None, "SNAPSHOT messages carry a snapshot"
        meta = snapshot.meta
        if meta.index <= self.log.committed:
            self._acknowledge_append(message.source, self.log.committed)
            return
        if self.log.match_term(meta.index, meta.term):
            self.log.commit_to(meta.index)  # we already hold that prefix: fast-forward only
            # Only the prefix is known to match the leader's log; what follows is unchecked.
            self._acknowledge_append(message.source, meta.index)
            return
        self.logger.info("snapshot_restored", index=meta.index, term=meta.term)
        self.log.restore(snapshot)
        self.membership = meta.membership
        self._acknowledge_append(message.source, meta.index)

    # ------------------------------------------------------------------ leader

    def _step_leader(self, message: Message) -> None:
        kind = message.type
        assert kind not in (MT.APPEND, MT.SNAPSHOT), "two leaders in one term"
        progress = self._progress.get(message.source)
        if kind is MT.READ_INDEX:
            self._leader_read_index(ReadRequest(self.log.committed, message.context, message.source))
            return
        if progress is None:
            return  # not (or no longer) a member
        if kind is MT.APPEND_RESPONSE:
            progress.recent_active = True
            if message.reject:
                self._handle_append_rejection(message, progress)
            else:
                self._handle_append_success(message, progress)
        elif kind is MT.HEARTBEAT_RESPONSE:
            self._handle_heartbeat_response(message, progress)

    def _handle_append_rejection(self, message: Message, progress: Progress) -> None:
        next_probe = message.reject_hint
        if message.log_term > 0:
            next_probe, _ = self.log.find_conflict_by_term(message.reject_hint, message.log_term)
        # The follower lost entries it had acknowledged (a replica in repair) if it says so
        # (a rejection of index 0: see _step_follower's heartbeat case) or if it rejects the
        # probe at an index it acknowledged. Its match is then forgotten: trusting it would
        # leave the replica short for as long as this leader lasts, or bounce the same probe
        # between the two forever. Forgetting is safe even on a late answer (a resend).
        said_so = message.index == 0
        probe_refused = progress.state is ProgressState.PROBE and message.index == progress.next - 1
        if (said_so or probe_refused) and message.reject_hint < progress.match:
            self.logger.info("follower_lost_entries", follower=message.source,
                             match=progress.match, holds=message.reject_hint)
            progress.forget_match(Index(next_probe + 1))
            # Short, it is not in sync, whenever it last caught up: out of the ISR until its
            # match reaches our log again (a lone in-sync replica short of entries would
            # otherwise count toward min_insync_replicas and acks=all, and be picked for a
            # leadership transfer it cannot take).
            self._in_sync.lost(message.source, self.now_ticks)
            self._send_append(message.source)
            return
        if said_so:
            return  # it caught up since: old news
        if progress.maybe_decrease_to(message.index, next_probe):
            if progress.state is ProgressState.REPLICATE:
                progress.become_probe()
            self._send_append(message.source)

    def _handle_append_success(self, message: Message, progress: Progress) -> None:
        was_paused = progress.is_paused()
        if not progress.maybe_update(message.index):
            return
        if progress.state is ProgressState.PROBE:
            progress.become_replicate()
            behind = self.log.last_index() - progress.match
            if 0 < self.config.far_wait_lag_entries <= behind or (
                    self.config.far_wait_learners and behind > 0 and message.source in self.membership.learners):
                progress.far_wait = self.config.far_wait_ticks  # see Config.far_wait_lag_entries
        elif progress.state is ProgressState.INSTALL and progress.match >= progress.install_index:
            progress.become_probe()
            progress.become_replicate()
        else:
            progress.inflights.free_up_to(message.index)
        last = self.log.last_index()
        self._in_sync.record_match(message.source, progress.match, self.now_ticks, last)
        if not self._maybe_commit() and was_paused:
            self._send_append(message.source)
        while self._send_append(message.source, send_if_empty=False):
            pass
        if message.source == self.lead_transferee and progress.match == last:
            self.logger.info("timeout_now_sent", target=message.source)
            self._send(self._message(MT.TIMEOUT_NOW, message.source))

    def _handle_heartbeat_response(self, message: Message, progress: Progress) -> None:
        progress.recent_active = True
        progress.probe_sent = False
        # An idle follower that answers is as caught up as its match (Kafka's follower
        # fetches do the same): without this, idle groups would empty their ISR.
        self._in_sync.record_match(message.source, progress.match, self.now_ticks, self.log.last_index())
        if progress.state is ProgressState.REPLICATE and progress.inflights.full():
            progress.inflights.free_first()
        if progress.match < self.log.last_index():
            self._send_append(message.source)
        if not message.context:
            return
        acks = self._read_only.ack(message.context, message.source)
        if acks is None or not has_quorum(self.membership.voters, acks):
            return
        for request in self._read_only.release_through(message.context):
            self._deliver_read(request)

    def _maybe_commit(self) -> bool:
        match = {node: progress.match for node, progress in self._progress.items()}
        index = committed_index(self.membership.voters, match)
        if not self.log.maybe_commit(index, self.term):
            return False
        self._commit_broadcast_pending = True
        if self._reads_before_commit:
            pending, self._reads_before_commit = self._reads_before_commit, []
            for request in pending:
                request.index = self.log.committed
                self._leader_read_index(request)
        return True

    def _committed_in_current_term(self) -> bool:
        return self.log.term_or_none(self.log.committed) == self.term

    def _check_can_propose(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.lead_transferee != NO_NODE:
            raise LeadershipTransferInProgress(f"leadership is moving to node {self.lead_transferee}")

    def _append_as_leader(self, entries: list[Entry], size_bytes: int) -> None:
        self.log.append(entries)
        self._uncommitted_bytes += size_bytes
        self._broadcast_pending = True

    def _flush_broadcast(self) -> None:
        """Send what proposals and commits since the last Ready made necessary (batched)."""
        if not (self._broadcast_pending or self._commit_broadcast_pending):
            return
        commit_changed = self._commit_broadcast_pending
        self._broadcast_pending = self._commit_broadcast_pending = False
        for node in sorted(self._progress):
            if node == self.id:
                continue
            sent = False
            while self._send_append(node, send_if_empty=False):
                sent = True
            if not sent and commit_changed and self._commit_sent.get(node, -1) < self.log.committed:
                self._send_append(node, send_if_empty=True)  # carries the new commit index

    def _send_append(self, target: NodeId, send_if_empty: bool = True) -> bool:
        """Send the next append to `target` if flow control allows; True if one was sent."""
        progress = self._progress[target]
        if progress.is_paused():
            return False
        last = self.log.last_index()
        if progress.next > last and not send_if_empty:
            # Nothing new, and the entry before `next` (our last) always has a known
            # term, so no snapshot is due either. Asked several times per write (after
            # each send, after each answer): this answer is the common one.
            return False
        previous = Index(progress.next - 1)
        assert previous <= last, "a follower's next index never passes the leader's log"
        previous_term = self.log.term_or_none(previous)
        if previous_term is None:
            return self._send_snapshot(target, progress)
        entries: list[Entry] = []
        if progress.next <= last:
            try:
                entries = self.log.slice(progress.next, Index(last + 1), self.config.message_bytes_max)
            except CompactedError:
                return self._send_snapshot(target, progress)
        if not entries and not send_if_empty:
            return False
        if entries:
            progress.sent_entries(entries[-1].index, entries_size_bytes(entries))
        elif progress.state is ProgressState.PROBE:
            progress.probe_sent = True
        self._commit_sent[target] = self.log.committed
        self._send(
            Message(
                type=MT.APPEND, source=self.id, target=target, term=self.term, index=previous,
                log_term=previous_term, entries=tuple(entries), commit=self.log.committed,
            )
        )
        return True

    def _send_snapshot(self, target: NodeId, progress: Progress) -> bool:
        if not progress.recent_active:
            return False  # do not ship a snapshot to a follower that may be down
        snapshot = self.log.storage.snapshot()
        assert snapshot.meta.index >= self.log.first_index() - 1, "the snapshot covers the compacted prefix"
        progress.become_install(snapshot.meta.index)
        self.logger.info("install_started", target=target, index=snapshot.meta.index)
        self._send(self._message(MT.SNAPSHOT, target, snapshot=snapshot))
        return True

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for node in sorted(self._progress):
            if node == self.id:
                continue
            commit = Index(min(self._progress[node].match, self.log.committed))
            self._send(self._message(MT.HEARTBEAT, node, commit=commit, context=context))

    def _leader_read_index(self, request: ReadRequest) -> bool:
        """Queue a read; False when the queue is full (the caller refuses the read)."""
        if not self._committed_in_current_term():
            # Our commit index may lag the true one until an entry of this term commits.
            if len(self._reads_before_commit) >= self.config.pending_reads_max:
                return False
            self._reads_before_commit.append(request)
            return True
        if len(self.membership.voters) <= 1:
            self._deliver_read(request)
            return True
        if self._read_only.full():
            return False
        request.acks.add(self.id)
        if self._read_only.add(request):
            self._broadcast_heartbeat(request.context)
        return True

    def _deliver_read(self, request: ReadRequest) -> None:
        if request.requester == self.id:
            self._read_states.append(ReadState(request.index, request.context))
        else:
            self._send(
                self._message(MT.READ_INDEX_RESPONSE, request.requester, index=request.index, context=request.context)
            )

    def _best_transfer_target(self) -> NodeId | None:
        in_sync = self.in_sync_replicas() & self.membership.voters
        candidates = sorted(
            (node for node in in_sync if node != self.id),
            key=lambda node: (-self._progress[node].match, node),
        )
        return candidates[0] if candidates else None

    # ------------------------------------------------------------------ membership

    def _apply_conf_change(self, change: ConfChange) -> None:
        self.membership = self.membership.apply(change)
        self.logger.info(
            "membership_applied", op=change.op.name, node=change.node_id,
            voters=sorted(self.membership.voters), learners=sorted(self.membership.learners),
        )
        if self.role is not Role.LEADER:
            return
        if self.id not in self.membership.voters:
            self.logger.info("stepped_down_removed")
            self._become_follower(self.term, NO_NODE)
            return
        if len(self.membership.voters) == 1 and len(self._read_only):
            # Nobody is left to echo a heartbeat: a single voter confirms its reads alone.
            for request in self._read_only.release_through(self._read_only.last_context()):
                self._deliver_read(request)
        node = change.node_id
        if change.op is ConfChangeOp.REMOVE:
            self._progress.pop(node, None)
            self._in_sync.remove(node)
            if self.lead_transferee == node:
                self.lead_transferee = NO_NODE
        elif node not in self._progress:
            self._add_progress(node, self.log.last_index())
            self._in_sync.add(node)
            self._send_append(node)  # probe the new member now, not at the next heartbeat
        else:
            progress = self._progress[node]
            progress.is_learner = change.op is ConfChangeOp.ADD_LEARNER
            # The window only grows or shrinks its bounds; what is in flight stays counted.
            progress.inflights.messages_max, progress.inflights.bytes_max = self._window(progress.is_learner)
        self._maybe_commit()
        self._broadcast_pending = True

    # ------------------------------------------------------------------ plumbing

    def _hard_state(self) -> HardState:
        return HardState(term=self.term, vote=self.vote, commit=self.log.committed)

    def _soft_state(self) -> SoftState:
        return SoftState(leader=self.leader, role=self.role)

    def _message(self, kind: MessageType, target: NodeId, **fields: Any) -> Message:
        return Message(type=kind, source=self.id, target=target, term=self.term, **fields)

    def _send(self, message: Message) -> None:
        self._messages.append(message)

    def _send_after_persist(self, message: Message) -> None:
        self._persisted_messages.append(message)


def _validate_conf_change(membership: Membership, change: ConfChange) -> None:
    node = change.node_id
    if change.op is ConfChangeOp.ADD_VOTER and node in membership.voters:
        raise InvalidMembershipChange(f"node {node} is already a voter")
    if change.op is ConfChangeOp.ADD_LEARNER:
        if node in membership.learners:
            raise InvalidMembershipChange(f"node {node} is already a learner")
        if node in membership.voters:
            raise InvalidMembershipChange(f"node {node} is a voter; remove it first")
    if change.op is ConfChangeOp.REMOVE:
        if node not in membership.members:
            raise InvalidMembershipChange(f"node {node} is not a member")
        if membership.voters == {node}:
            raise InvalidMembershipChange("cannot remove the last voter")
