"""The group runtime: one asyncio task that drives one `RaftCore` through its Ready loop.

This is the only place a core meets storage, the network and time. One task owns
each core, so the core needs no locks. The loop, in the order `raftlog/core/ready.py`
prescribes:

    wait for work (messages, ticks, proposals, reads) -> drain a bounded batch into the core
    while the core has a Ready:
        send `messages`; append entries + hard state to the store; sync (one fsync for
        everything the batch produced: group commit); send `persisted_messages`;
        apply committed entries (resolving proposal waiters); serve reads; advance

Waiters are futures. A proposal resolves when its entry is applied; if another
entry lands at its index it fails with `ProposalDropped` (it definitely did not
apply); if this node stops leading first, it fails with `OutcomeUnknown` (it may
still commit), never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from multiraft.runtime.histograms import NodeLatencies
from multiraft.runtime.quiescence import follower_may_quiesce, quiesce_refusal
from raftlog.core.progress import ProgressState
from raftlog.core.raft import RaftCore
from raftlog.core.ready import Ready
from raftlog.errors import ClientError, NotLeader, OutcomeUnknown, ProposalDropped
from raftlog.messages import (
    ConfChange,
    Entry,
    EntryKind,
    Membership,
    Message,
    MessageType,
    Role,
    decode_conf_change,
    entries_size_bytes,
)
from raftlog.storage import RaftStorage
from raftlog.types import NO_NODE, GroupId, Index, NodeId, Term
from storage.errors import InvalidBatchError

# A leader holds an append that only carries a new commit index this long: the next
# append to that follower (which carries the commit too) usually replaces it. For
# sequential writes that halves the messages per write; followers learn the commit
# at most this much later (their reads and applies lag by it, Kafka's followers lag by
# a fetch round). Delay is always safe in Raft: the network may delay anything.
COMMIT_HOLD_S = 0.005
# A leader's own appends whose background fsync has not reported yet, in bytes: past
# this the leader waits for its next write's fsync, as every write did before. Why:
# its followers' answers commit entries without the leader's disk, so nothing else
# stops a leader whose disk stalls from holding more and more entries in memory (its
# log keeps them until they are durable) and queueing more and more fsyncs.
BACKGROUND_BYTES_MAX = 32 * 1024 * 1024
INBOX_ITEMS_MAX = 8192  # queued inputs per group; beyond it messages are shed (Raft tolerates loss)
DRAIN_BATCH_MAX = 512  # inputs handed to the core per Ready round
_CAMPAIGNING = frozenset({Role.PRE_CANDIDATE, Role.CANDIDATE})
CAMPAIGN_BACKOFF_SHIFT_MAX = 3  # a replica's clock slows to 1/8 after failed campaigns (see tick)
# After a leader's node is gone (GroupRuntime._leader_gone) its successor asks again
# this often, this many times, in case the others learned of it after its first round.
LEADER_GONE_RETRY_S = 0.05
LEADER_GONE_RETRIES = 4
PENDING_TICKS_MAX = 16  # ticks buffered while busy (etcd buffers 128 on its tick channel)
# The ack-before-fsync chaos control (multiraft/node/unsafe.py) syncs this long after it
# acknowledged: a kill -9 (with write-behind files) then loses up to this much
# acknowledged data on every replica, wide enough for the runner to catch.
UNSAFE_SYNC_DELAY_S = 2.0


class StateMachine(Protocol):
    """What a group applies its committed entries to (partition state, metadata catalog)."""

    def apply(self, entry: Entry) -> Any: ...

    def restore(self, data: object, index: Index) -> None: ...


@dataclass(slots=True)
class _Proposal:
    term: Term
    future: asyncio.Future[Any]
    began: float = 0.0  # time.perf_counter() when proposed


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
    # Node-level liveness of a peer; a group with a silent member never goes quiet
    # (its leader must keep ticking so the ISR notices).
    is_live: Callable[[int], bool] = _always_live
    # Cross-group group commit (multiraft/runtime/flusher.py); None: the store syncs alone.
    sync: Callable[[Any], Awaitable[None]] | None = None
    store_lazily: Callable[[Any], None] | None = None
    write_states: Callable[[], None] | None = None  # see Flusher.write_states
    # A leader's own appends: made durable without waiting (see _persist_later);
    # None: the leader waits for them like any replica.
    sync_in_background: Callable[[Any], asyncio.Future[None]] | None = None
    latencies: NodeLatencies | None = None  # node-wide histograms (/metrics)
    # Partition state at closed-segment ends, for retention; None: no retention here.
    boundaries: SegmentBoundaries | None = None
    # Reads wait until the replica re-applied what it had committed before it (re)opened,
    # so no reader sees its high watermark go back after a restart.
    replay_until: Index = Index(0)
    # The ack-before-fsync chaos control only (multiraft/node/unsafe.py); False in production.
    ack_before_fsync: bool = False


class GroupRuntime:
    def __init__(
        self,
        group_id: GroupId,
        core: RaftCore,
        store: RaftStorage,
        state_machine: StateMachine,
        deps: GroupDeps,
    ) -> None:
        self.group_id = group_id
        self._check_data = deps.check_data
        send, logger, on_role_change = deps.send, deps.logger, deps.on_role_change
        self.core = core
        self.store = store
        self.state_machine = state_machine
        self._send = send
        self._on_role_change = on_role_change
        self._unbound_logger = logger.bind(group_id=group_id)
        self._logged_term = core.term
        self.logger = self._unbound_logger.bind(term=core.term)  # bound anew as the term moves
        # Filled by callbacks, drained by this group's task, on one loop: a deque and a
        # bound. (asyncio.Queue's waiter bookkeeping went unused and cost a leader about
        # twenty Python calls per write.)
        self._inbox: deque[tuple[str, Any]] = deque()
        self._pending_ticks = 0
        self._wakeup = asyncio.Event()
        self._proposals: dict[Index, _Proposal] = {}
        self._reads: dict[bytes, asyncio.Future[Index]] = {}
        self._read_ids = itertools.count(1)
        self._ready_reads: list[tuple[Index, asyncio.Future[Index]]] = []
        # acks=leader writes: (last index, waiter, (first index, term) to answer with).
        self._persist_waiters: list[tuple[Index, asyncio.Future[tuple[Index, Term]], tuple[Index, Term]]] = []
        self._isr_waiters: list[tuple[Index, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._role = core.role
        self._known_leader = core.leader
        self.messages_shed = 0
        self.appends_refused = 0  # appends holding a batch that is not valid (see _batches_valid)
        # Quiescence (see quiescence.py): a quiet group is not ticked.
        self.quiesced = False
        self._idle_ticks = 0
        self._woken_in: tuple[Any, ...] | None = None  # see wake_for_silence
        self._held = False  # see hold_for_first_voter
        self._campaigns_without_leader = 0  # see tick
        self._ticks_offered = 0
        self.on_quiesce = deps.on_quiesce
        self.is_live = deps.is_live
        self.sync = deps.sync
        self.store_lazily = deps.store_lazily
        self.write_states = deps.write_states
        self.sync_in_background = deps.sync_in_background
        self._persist_reports: list[tuple[Index, Term]] = []
        self._persist_failure: BaseException | None = None
        self._background_bytes = 0  # appends handed to sync_in_background, not reported yet
        self._campaign_requested = False
        self.failed = False
        self.failure: BaseException | None = None  # what made the group fail, for the reopen
        self.boundaries = deps.boundaries
        self.replay_until = deps.replay_until
        self.latencies = deps.latencies
        self.elections = 0  # times this replica became a candidate
        self.leader_changes = 0  # times the leader it knows changed
        self.on_failure = deps.on_failure
        self._held_commits: dict[int, Message] = {}
        self._held_timer: asyncio.TimerHandle | None = None
        self.ack_before_fsync = deps.ack_before_fsync
        self._unsafe_term_vote = (core.term, core.vote)
        self._unsafe_sync_timer: asyncio.TimerHandle | None = None

    def status(self) -> GroupStatus:
        core = self.core
        leading = core.role is Role.LEADER
        last = core.log.last_index()
        lag_entries = lag_ticks = None
        if leading:
            matches = [p.match for n in core.membership.members if n != core.id
                       and (p := core.progress(n)) is not None]
            lag_entries = max((last - m for m in matches), default=0)
            lag_ticks = max(core.follower_lag_ticks().values(), default=0)
        return GroupStatus(
            group_id=self.group_id, role=core.role, term=core.term, leader=core.leader,
            commit_index=core.commit_index, applied_index=core.applied_index, last_index=last,
            voters=frozenset(core.membership.voters), in_sync=frozenset(core.in_sync_replicas()) if leading else None,
            follower_lag_entries=lag_entries, follower_lag_ticks=lag_ticks, messages_shed=self.messages_shed,
            appends_refused=self.appends_refused, elections=self.elections, leader_changes=self.leader_changes,
            quiesced=self.quiesced,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.create_task(self._run(), name=f"group-{self.group_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await self._task
                except Exception as error:  # already logged by the loop; stopping goes on
                    self.logger.warning("group_stopped_after_failure", error=repr(error))
            self._task = None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        self._held_commits.clear()
        if self._unsafe_sync_timer is not None:
            self._unsafe_sync_timer.cancel()
            self._unsafe_sync_timer = None
        self._fail_waiters(OutcomeUnknown("the group stopped"))

    # ------------------------------------------------------------------ inputs (any task)

    def wake(self) -> None:
        self._held = False
        if self.quiesced:
            self.quiesced = False
            self._idle_ticks = 0
            self._wakeup.set()

    def hold_for_first_voter(self) -> None:
        """A new group's other voters start quiet: the first voter campaigns at once
        (`request_campaign`) and its vote request wakes them. Were they ticking, every
        replica that opened before the first voter's (a thousand groups open over
        seconds on a busy node) would time out and campaign too, and those contested
        elections are what overloads a node creating many partitions. `release_hold`
        wakes a replica that heard nothing, should that campaign never come."""
        if self.core.needs_repair:
            return  # a replica in repair ticks: see follower_may_quiesce
        self._held = True
        self.quiesced = True

    def release_hold(self) -> None:
        if self._held:
            self.wake()

    def wake_for_silence(self) -> None:
        """Wake because a member's node fell silent, remembering the state it woke in: if
        the node is heard again before anything happened here, `sleep_again` undoes it."""
        if self.quiesced:
            self.wake()
            self._woken_in = self._sleep_state()

    def sleep_again(self) -> bool:
        """Back to quiet after a false alarm: only a follower still following the same
        leader in the same term with the same log, nothing queued. The leader never woke
        (its node was only slow), so nothing else would quiet this replica again; it would
        campaign instead, and wake the leader's group to reject it. Safe as any quiescence:
        it only withholds ticks."""
        woken_in, self._woken_in = self._woken_in, None
        if woken_in is None or self.quiesced or self._inbox or woken_in != self._sleep_state():
            return False
        if self.core.role is not Role.FOLLOWER or self.core.needs_repair:
            return False  # a replica in repair keeps ticking (see follower_may_quiesce)
        self.quiesced = True
        return True

    def _sleep_state(self) -> tuple[Any, ...]:
        core = self.core
        return (core.role, core.term, core.leader, core.log.last_index(), core.commit_index)

    def request_campaign(self) -> None:
        """Campaign once the bootstrap is applied (a new group's preferred leader does,
        so a thousand new groups do not all wait out randomized election timeouts)."""
        self._campaign_requested = True
        self._wakeup.set()

    def request_transfer(self, target: int) -> None:
        """Hand leadership to `target` (a no-op unless this replica leads when it runs)."""
        self.wake()
        if not self._enqueue("transfer", target):
            return  # the next balancing round asks again
        self._wakeup.set()

    def request_quiesce(self, leader: int, term: int, index: int) -> None:
        """The leader says the group is idle; obeyed in order with the messages around it."""
        if not self._enqueue("quiesce", (leader, term, index)):
            return
        self._wakeup.set()

    def _enqueue(self, kind: str, item: Any) -> bool:
        """Queue an input for this group's task; False when INBOX_ITEMS_MAX already wait."""
        if len(self._inbox) >= INBOX_ITEMS_MAX:
            return False
        self._inbox.append((kind, item))
        return True

    def leader_gone(self, leader: int) -> None:
        """`leader`'s node is gone (its raft port refuses connections); see _leader_gone."""
        self.quiesced = self._held = False
        if self._enqueue("leader_gone", leader):
            self._wakeup.set()

    def deliver(self, message: Message) -> None:
        self.quiesced = self._held = False
        if not self._enqueue("message", message):
            self.messages_shed += 1  # Raft retries: shedding beats blocking the loop
        self._wakeup.set()

    def tick(self) -> None:
        if self.quiesced:
            return
        failed = self._campaigns_without_leader - 1
        if failed > 0:
            # Campaigns that found no leader back off: after each one this replica's clock
            # runs at half the speed, down to an eighth, until some leader is known. When
            # a busy node's messages take longer than an election timeout, every campaign
            # times out before its votes arrive and starts another, whose messages slow
            # the node further; without backing off, such an election storm never ends (a
            # thousand new partitions on a slow box did just that). Withholding ticks is
            # as safe as quiescence: ticks only drive liveness.
            self._ticks_offered += 1
            if self._ticks_offered % (1 << min(failed, CAMPAIGN_BACKOFF_SHIFT_MAX)):
                return
        self._pending_ticks = min(self._pending_ticks + 1, PENDING_TICKS_MAX)
        self._wakeup.set()

    async def propose(
        self, payloads: Sequence[bytes], kind: EntryKind = EntryKind.DATA, acks: str = "quorum"
    ) -> list[Any]:
        """Replicate `payloads` as consecutive entries and wait as `acks` says.

        - "quorum": until applied (committed by a majority); returns the apply results;
        - "leader": until durable on this leader only; returns the entries' indexes
          (a leader crash before the commit can lose them: the relaxation the user
          asked for; Kafka's acks=1 answers with the leader's offsets the same way);
        - "all": until applied and held by every in-sync replica.
        """
        assert acks in ("quorum", "leader", "all")
        self._check_running()
        self.wake()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in payloads]
        persisted: asyncio.Future[tuple[Index, Term]] = loop.create_future()
        if not self._enqueue("propose", (tuple(payloads), kind, futures, persisted)):
            raise ProposalDropped("the group's inbox is full; retry")
        self._wakeup.set()
        if acks == "leader":
            for future in futures:  # nobody awaits these: retrieve their outcome quietly
                future.add_done_callback(_consume_outcome)
            first, term = await persisted
            if self.core.log.term_or_none(first) != term:  # replaced since (this leader was deposed)
                raise OutcomeUnknown("leadership was lost after the leader's write; it may be lost")
            return [Index(first + i) for i in range(len(futures))]
        persisted.add_done_callback(_consume_outcome)
        if len(futures) == 1:  # one batch, the usual case: gather would add a loop turn
            results = [await futures[0]]
        else:
            results = list(await asyncio.gather(*futures))
        if acks == "all":
            held: asyncio.Future[None] = loop.create_future()
            self._isr_waiters.append((self._last_applied_target(results), held))
            self._wakeup.set()
            await held
        return results

    def _check_running(self) -> None:
        if self.failed:
            raise ProposalDropped("this replica's storage failed; it is being reopened, retry")

    def _last_applied_target(self, results: list[Any]) -> Index:
        return self.core.applied_index

    async def propose_membership(self, change: ConfChange) -> None:
        """Add or remove one member; returns once the change is applied here."""
        self.wake()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._enqueue("membership", (change, future)):
            raise ProposalDropped("the group's inbox is full; retry")
        self._wakeup.set()
        await future

    async def read_index(self) -> Index:
        """A linearizable read point: the index the state machine has applied past."""
        self.wake()
        future: asyncio.Future[Index] = asyncio.get_running_loop().create_future()
        context = b"r%d" % next(self._read_ids)
        if not self._enqueue("read", (context, future)):
            raise ProposalDropped("the group's inbox is full; retry")
        self._wakeup.set()
        return await future

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                self._drain()
                while self.core.has_ready():
                    await self._handle_ready()
                if self._campaign_requested and self.core.applied_index >= self.core.commit_index:
                    self._campaign_requested = False
                    self.core.campaign()
                    self._wakeup.set()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a storage failure is fatal for the group, never silent
            self.logger.error("group_failed", error=repr(error))
            self.failed = True
            self.failure = error
            self._fail_waiters(OutcomeUnknown(f"group {self.group_id} failed: {error!r}"))
            if self.on_failure is not None:
                self.on_failure(self.group_id)  # the node reopens it from disk (like a restart)
            raise

    def _drain(self) -> None:
        core = self.core
        ticks, self._pending_ticks = self._pending_ticks, 0
        for _ in range(ticks):
            elapsed = core.election_elapsed
            core.tick()
            if core.election_elapsed <= elapsed and core.role in _CAMPAIGNING:
                self._campaigns_without_leader += 1  # its election timer ran out (see tick)
        if self._persist_reports or self._persist_failure is not None:
            self._take_persist_reports()
        inbox = self._inbox
        for _ in range(min(len(inbox), DRAIN_BATCH_MAX)):
            kind, item = inbox.popleft()
            if kind == "message":
                self.quiesced = False
                if item.type is MessageType.APPEND and item.entries and self._check_data is not None \
                        and not self._batches_valid(item):
                    continue
                core.step(item)
            elif kind == "propose":
                self._propose(*item)
            elif kind == "quiesce":
                self.quiesced = follower_may_quiesce(core, *item)
            elif kind == "membership":
                self._propose_membership(*item)
            elif kind == "transfer":
                with contextlib.suppress(ClientError):  # no longer leading, or target not a voter
                    core.transfer_leadership(item)
            elif kind == "leader_gone":
                self._leader_gone(item)
            elif kind == "gone_retry":
                self._campaign_again()
            else:
                self._read(*item)
        self._consider_quiescing(ticks)
        if inbox:
            self._wakeup.set()
        self._check_role()
        if self._isr_waiters:
            self._release_isr_waiters()

    def _leader_gone(self, leader: int) -> None:
        """Failover without waiting out an election timeout: a follower of a leader whose
        process is gone (a kill -9 closes its sockets; a live node never refuses a
        connection) stops honouring its lease, and the lowest-numbered voter left that
        this node hears campaigns at once. Only that one: two campaigning together would
        split the vote and both wait out a timeout. If it is not heard by the others, or
        they have not noticed yet, the timers elect someone as before."""
        core = self.core
        if core.role is not Role.FOLLOWER or core.leader != leader:
            return
        core.forget_leader(NodeId(leader))
        left = [v for v in core.membership.voters if v != leader and (v == core.id or self.is_live(v))]
        if left and min(left) == core.id:
            self.logger.info("campaign_leader_gone", leader=leader)
            core.campaign()
            # The others may learn of it a few milliseconds after us and ignore this
            # round (the dead leader's lease): ask again, a bounded number of times.
            loop = asyncio.get_running_loop()
            for attempt in range(1, LEADER_GONE_RETRIES + 1):
                loop.call_later(attempt * LEADER_GONE_RETRY_S, self._enqueue_and_wake, "gone_retry", leader)

    def _campaign_again(self) -> None:
        """A retry of _leader_gone's campaign, while still no leader is known and no real
        election of ours is under way (a new term for nothing would only disturb)."""
        core = self.core
        if core.leader == NO_NODE and core.role in (Role.FOLLOWER, Role.PRE_CANDIDATE):
            core.campaign()

    def _enqueue_and_wake(self, kind: str, item: Any) -> None:
        if self._task is not None and self._enqueue(kind, item):
            self._wakeup.set()

    def _propose(
        self, payloads: tuple[bytes, ...], kind: EntryKind, futures: list[asyncio.Future[Any]],
        persisted: asyncio.Future[tuple[Index, Term]],
    ) -> None:
        try:
            term, first = self.core.propose(payloads, kind)
        except ClientError as error:
            for future in [*futures, persisted]:
                if not future.done():
                    future.set_exception(error)
            return
        now = time.perf_counter()
        for offset, future in enumerate(futures):
            self._proposals[Index(first + offset)] = _Proposal(term, future, now)
        self._persist_waiters.append((Index(first + len(payloads) - 1), persisted, (first, term)))

    def _propose_membership(self, change: ConfChange, future: asyncio.Future[Any]) -> None:
        try:
            term, index = self.core.propose_membership(change)
        except ClientError as error:
            future.set_exception(error)
            return
        self._proposals[index] = _Proposal(term, future)

    def _read(self, context: bytes, future: asyncio.Future[Index]) -> None:
        try:
            self.core.read_index(context)
        except ClientError as error:
            future.set_exception(error)
            return
        self._reads[context] = future

    async def _handle_ready(self) -> None:
        ready = self.core.ready()
        flushed = later = False
        for message in ready.messages:
            self._send_or_hold(message)
        store = self.store
        if ready.snapshot is not None:
            self._install_snapshot(ready.snapshot)
        if ready.entries:
            store.append(ready.entries)
            if self.boundaries is not None:
                self.boundaries.note_segments(
                    store, self.core.applied_index, self.state_machine, self.core.membership
                )
        if ready.hard_state is not None:
            store.set_hard_state(ready.hard_state)
        if ready.must_sync or ready.entries or ready.hard_state is not None:
            if self.ack_before_fsync and self._unsafe_may_defer_sync(ready):
                self._unsafe_sync_later()  # UNSAFE: acknowledged below before it is durable
            elif self.sync is not None and not ready.must_sync and not ready.entries:
                # Only the commit index moved: it is stored lazily (Raft needs no fsync for
                # it), with the node's next flush; nothing below waits for it.
                if self.store_lazily is not None:
                    self.store_lazily(store)
                else:
                    self.sync(store).add_done_callback(_consume_outcome)
            elif (
                self.sync_in_background is not None
                and self._background_bytes < BACKGROUND_BYTES_MAX
                and self.core.may_persist_later(ready)
            ):
                self._persist_later(ready)
                later = True
            elif self.sync is not None:
                await self.sync(store)  # shared with every group of this loop turn
                flushed = True
            else:
                store.sync()
                await asyncio.sleep(0)  # let other groups run between Readys
        if ready.entries and self._persist_waiters and not later:
            self._release_persisted(ready.entries[-1].index)
        for message in ready.persisted_messages:
            self._send_or_hold(message)
        if flushed and ready.committed_entries and self.write_states is not None:
            self.write_states()  # the flush's state write: after the answers, before applying
        if ready.committed_entries:
            began = time.perf_counter()
            # The configuration in force at each entry, for retention's captures (the core
            # takes this Ready's configuration changes in at advance()).
            membership = self.core.membership
            for entry in ready.committed_entries:
                if entry.kind is EntryKind.CONFIG:
                    membership = membership.apply(decode_conf_change(entry.payload))
                self._apply(entry, membership)
            if self.latencies is not None:
                self.latencies.apply.observe(time.perf_counter() - began)
        for read_state in ready.read_states:
            future = self._reads.pop(read_state.context, None)
            if future is not None and not future.done():
                self._ready_reads.append((read_state.index, future))
        self.core.advance(ready, persisted=not later)
        if self.core.needs_repair:
            self._check_repaired()
        self._serve_reads()
        self._check_role()

    def _persist_later(self, ready: Ready) -> None:
        """A leader's own appends: start their fsync and go on without waiting for it.

        Why: the leader's own write promises nothing to anyone, and two followers'
        answers are a majority without it. Waiting for it, a busy leader left the
        answers and the next requests unread for the length of its fsync (produce
        throughput rose 6-32 % without the wait; docs/node.md). The core counts the
        leader toward the quorum only once the report below says the entries are
        durable (`RaftCore.persisted`), so nothing is committed on the strength of a
        write a crash could lose."""
        assert self.sync_in_background is not None
        last = ready.entries[-1]
        size = entries_size_bytes(ready.entries)
        self._background_bytes += size
        done = self.sync_in_background(self.store)

        def report(future: asyncio.Future[None]) -> None:
            self._background_bytes -= size
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                self._persist_failure = error
            else:
                self._persist_reports.append((last.index, last.term))
            if self._task is not None:
                self._wakeup.set()

        done.add_done_callback(report)

    def _take_persist_reports(self) -> None:
        if self._persist_failure is not None:
            raise self._persist_failure  # the group fails (and is reopened), as on any failed flush
        reports, self._persist_reports = self._persist_reports, []
        for index, term in reports:
            self.core.persisted(index, term)
        if self._persist_waiters:
            self._release_persisted(self.core.log.stable_last_index())

    def _unsafe_may_defer_sync(self, ready: Ready) -> bool:
        """ack-before-fsync control: defer every sync but a snapshot's and a term or vote
        change's (those stay synced, so this control breaks only what it names)."""
        if ready.snapshot is not None:
            return False
        hard_state = ready.hard_state
        if hard_state is not None and (hard_state.term, hard_state.vote) != self._unsafe_term_vote:
            self._unsafe_term_vote = (hard_state.term, hard_state.vote)
            return False
        return True

    def _unsafe_sync_later(self) -> None:
        if self._unsafe_sync_timer is None:
            self._unsafe_sync_timer = asyncio.get_running_loop().call_later(
                UNSAFE_SYNC_DELAY_S, self._unsafe_sync_now
            )

    def _unsafe_sync_now(self) -> None:
        self._unsafe_sync_timer = None
        if self.sync is not None:
            self.sync(self.store).add_done_callback(_consume_outcome)
        else:
            self.store.sync()

    def _check_repaired(self) -> None:
        """A replica that lost durable entries may vote and lead again once its leader has
        given back everything up to what it had recorded as committed, and committed it."""
        target = getattr(self.store, "repair_until", 0)
        core = self.core
        if core.leader and core.commit_index >= target and core.log.last_index() >= target:
            core.mark_repaired()
            mark = getattr(self.store, "mark_repaired", None)
            if mark is not None:
                mark()
            self.logger.warning("replica_repaired", commit=core.commit_index)

    def _batches_valid(self, message: Message) -> bool:
        """A follower checks every batch it is sent before storing it, as the leader did
        before proposing it: a leader with a bug (or a corrupting path between them)
        must not plant a batch that every later read of this replica trips over. A bad
        append is dropped whole; the leader retries it, and the error says which."""
        assert self._check_data is not None
        for entry in message.entries:
            if entry.kind is EntryKind.DATA:
                try:
                    self._check_data(entry.payload)
                except InvalidBatchError as error:
                    self.appends_refused += 1
                    self.logger.error("append_refused_invalid_batch", leader=message.source, index=entry.index,
                                      error=str(error))
                    return False
        return True

    def _send_or_hold(self, message: Message) -> None:
        """Send, except a leader's commit-only append to a replicating follower, which
        waits up to COMMIT_HOLD_S for a later append to the same follower to replace it."""
        target = message.target
        if message.type is MessageType.APPEND:
            progress = self.core.progress(target) if self.core.role is Role.LEADER else None
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
        self._send(self.group_id, message)

    def _release_held_commits(self) -> None:
        self._held_timer = None
        held, self._held_commits = self._held_commits, {}
        if self.core.role is not Role.LEADER:
            return  # a deposed leader's commit news is stale; dropping is safe
        for message in held.values():
            self._send(self.group_id, message)

    def _install_snapshot(self, snapshot: Any) -> None:
        """The leader's log starts past ours: take its state, and its offsets with it."""
        next_offset_of = getattr(self.state_machine, "next_offset_of", None)
        if next_offset_of is not None and snapshot.data is not None:
            self.store.apply_snapshot(snapshot, next_offset_of(snapshot.data))
        else:
            self.store.apply_snapshot(snapshot)
        self.state_machine.restore(snapshot.data, snapshot.meta.index)
        if self.boundaries is not None:
            self.boundaries.clear()

    def _apply(self, entry: Entry, membership: Membership) -> None:
        result = self.state_machine.apply(entry)
        if self.boundaries is not None:
            self.boundaries.applied(entry.index, self.state_machine, membership)
        proposal = self._proposals.pop(entry.index, None)
        if proposal is None or proposal.future.done():
            return
        if proposal.term == entry.term:
            proposal.future.set_result(result)
            if self.latencies is not None and proposal.began:
                self.latencies.replicate.observe(time.perf_counter() - proposal.began)
        else:
            proposal.future.set_exception(
                ProposalDropped("another entry took this proposal's place")
            )

    def _consider_quiescing(self, ticks: int) -> None:
        """A leader idle for an election timeout goes quiet and tells its followers."""
        core = self.core
        if self.quiesced or not ticks or core.role is not Role.LEADER:
            return
        if quiesce_refusal(core) is not None or not all(
            self.is_live(node) for node in core.membership.members if node != core.id
        ):
            self._idle_ticks = 0
            return
        self._idle_ticks += ticks
        if self._idle_ticks >= core.config.election_timeout_ticks and self.on_quiesce is not None:
            self.quiesced = True
            self.on_quiesce(self.group_id, core.term, core.log.last_index())

    def _release_persisted(self, stable_index: Index) -> None:
        waiting = []
        for index, future, answer in self._persist_waiters:
            if future.done():
                continue
            if index <= stable_index:
                future.set_result(answer)
            else:
                waiting.append((index, future, answer))
        self._persist_waiters = waiting

    def _release_isr_waiters(self) -> None:
        """acks=all: release writes every in-sync replica has acknowledged."""
        core = self.core
        if core.role is not Role.LEADER:
            return
        holders = [core.progress(node) for node in core.in_sync_replicas()]
        held = min((p.match for p in holders if p is not None), default=Index(0))
        waiting = []
        for index, future in self._isr_waiters:
            if future.done():
                continue
            if index <= held:
                future.set_result(None)
            else:
                waiting.append((index, future))
        self._isr_waiters = waiting

    def _serve_reads(self) -> None:
        applied = self.core.applied_index
        waiting = []
        for index, future in self._ready_reads:
            if future.done():
                continue
            if index <= applied:
                future.set_result(index)
            else:
                waiting.append((index, future))
        self._ready_reads = waiting

    def _check_role(self) -> None:
        if self.core.term != self._logged_term:
            self._logged_term = self.core.term
            self.logger = self._unbound_logger.bind(term=self._logged_term)
        leader = self.core.leader
        if leader:
            self._campaigns_without_leader = 0
        if leader != self._known_leader:
            self._known_leader = leader
            if leader:
                self.leader_changes += 1
        role = self.core.role
        if role is self._role:
            return
        previous, self._role = self._role, role
        if role is Role.CANDIDATE:
            self.elections += 1
        self.logger.info(
            "role_changed", role=role.value, previous=previous.value
        )
        if previous is Role.LEADER:
            self._fail_waiters(OutcomeUnknown("leadership was lost before the proposal applied"))
        elif role is not Role.LEADER and self._reads:
            for future in self._reads.values():
                if not future.done():
                    future.set_exception(NotLeader(self.core.leader))
            self._reads.clear()
        if self._on_role_change is not None:
            self._on_role_change(self.group_id, role, self.core.term)

    def _fail_waiters(self, error: ClientError) -> None:
        for proposal in self._proposals.values():
            if not proposal.future.done():
                proposal.future.set_exception(error)
        self._proposals.clear()
        for future in self._reads.values():
            if not future.done():
                future.set_exception(error)
        self._reads.clear()
        for future in [
            *(f for _, f in self._ready_reads),
            *(f for _, f, _ in self._persist_waiters),
            *(f for _, f in self._isr_waiters),
        ]:
            if not future.done():
                future.set_exception(error)
        self._ready_reads.clear()
        self._persist_waiters.clear()
        self._isr_waiters.clear()


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
