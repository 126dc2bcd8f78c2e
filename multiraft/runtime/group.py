"""The group runtime: one asyncio task that drives one `RaftCore` through its Ready loop.

This is the only place a core meets storage, the network and time. One task owns
each core, so the core needs no locks. The loop, in the order `raftlog/core/ready.py`
prescribes:

    wait for work (messages, ticks, proposals, reads) -> drain a bounded batch into the core
    while the core has a Ready: run the Ready processor over it (`ready_processor.py`: send,
        write, make durable as the group's `Persistence` allows, answer, apply, advance)

Waiters are futures (`waiters.py`), resolved on apply, on durability or on reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from multiraft.runtime import failover, group_types, persistence, quiescence
from multiraft.runtime.group_host import COMMIT_HOLD_S, GroupHost
from multiraft.runtime.group_types import GroupDeps, GroupStatus, StateMachine, status_of
from multiraft.runtime.pacing import campaign_backoff_skips, run_ticks, split_ticks, tick_due
from multiraft.runtime.persistence import BackgroundWrites, choose_persistence, consume_outcome
from multiraft.runtime.ready_processor import process_ready
from multiraft.runtime.waiters import Proposal, Waiters, release_in_sync_writes
from raftlog.core.raft import RaftCore
from raftlog.errors import ClientError, NotLeader, OutcomeUnknown, ProposalDropped
from raftlog.messages import ConfChange, EntryKind, Message, MessageType, Role
from raftlog.storage import RaftStorage
from raftlog.types import GroupId, Index, Term

__all__ = ["COMMIT_HOLD_S", "GroupDeps", "GroupRuntime", "GroupStatus", "StateMachine"]

INBOX_ITEMS_MAX = 8192  # queued inputs per group; beyond it messages are shed (Raft tolerates loss)
DRAIN_BATCH_MAX = 512  # inputs handed to the core per Ready round


class GroupRuntime:
    def __init__(self, group_id: GroupId, core: RaftCore, store: RaftStorage, state_machine: StateMachine,
                 deps: GroupDeps) -> None:
        self.group_id = group_id
        self._check_data = deps.check_data
        self.core = core
        self.store = store
        self.state_machine = state_machine
        self._on_role_change = deps.on_role_change
        self._unbound_logger = deps.logger.bind(group_id=group_id)
        self._logged_term = core.term
        self.logger = self._unbound_logger.bind(term=core.term)  # bound anew as the term moves
        # Filled by callbacks, drained by this group's task, on one loop: a deque and a bound
        # (asyncio.Queue's waiter bookkeeping went unused and cost a leader ~20 calls a write).
        self._inbox: deque[tuple[str, Any]] = deque()
        self._pending_ticks = 0
        self._wakeup = asyncio.Event()
        self._waiters = Waiters()
        self._read_ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._role = core.role
        self._known_leader = core.leader
        self.messages_shed = 0
        # Quiescence (see quiescence.py): a quiet group is not ticked.
        self.quiesced = False
        self._idle_ticks = 0
        self._woken_in: tuple[Any, ...] | None = None  # see wake_for_silence
        self._held = False  # see hold_for_first_voter
        self._campaigns_without_leader = 0  # see tick
        self._ticks_offered = 0
        self.on_quiesce = deps.on_quiesce
        self.is_live = deps.is_live
        # A leader gone quiet: the members it went quiet past (their nodes were down) and
        # the node's tick then, to pass the quiet time on waking (`_pass_quiet_time`).
        self.quiet_past: frozenset[int] = frozenset()
        self.quiet_since: int | None = None
        self._node_ticks = deps.node_ticks
        self._pacer = deps.campaign_pacer or failover.CampaignPacer()
        self._wake_after_ticks = deps.wake_after_ticks
        # How this group's writes become durable: chosen here, once (persistence.py).
        self.persistence, self._background = choose_persistence(store, deps, (core.term, core.vote), self._wake_task)
        self._campaign_requested = False
        self.failed = False
        self.failure: BaseException | None = None  # what made the group fail, for the reopen
        self.boundaries = deps.boundaries
        self.replay_until = deps.replay_until
        self.latencies = deps.latencies
        self.elections = 0  # times this replica became a candidate
        self.leader_changes = 0  # times the leader it knows changed
        self.on_failure = deps.on_failure
        self.host = GroupHost(group_id, core, store, state_machine, deps.send, self._waiters, deps.boundaries,
                              deps.latencies)

    def status(self) -> GroupStatus:
        return status_of(self.group_id, self.core, messages_shed=self.messages_shed,
                         appends_refused=self.host.appends_refused, elections=self.elections,
                         leader_changes=self.leader_changes, quiesced=self.quiesced)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.create_task(self._run(), name=f"group-{self.group_id}")
        self._wakeup.set()  # its first Ready now, held or not (a reopened replica replays: reopening.py)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await self._task
                except Exception as error:  # already logged by the loop; stopping goes on
                    self.logger.warning("group_stopped_after_failure", error=repr(error))
            self._task = None
        self.host.close()
        self.persistence.close()
        persistence.forget_frames(self.failure)  # see there: a kept traceback would keep this group
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
        (`request_campaign`) and its vote request wakes them (had they ticked, a thousand
        new groups' replicas would time out and campaign against it). `release_hold`
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
        campaign instead, and wake the leader's group to reject it (safe: withholds ticks)."""
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
        self._enqueue_and_wake("transfer", target)  # if refused, the next balancing round asks again

    def report_unreachable(self, target: int) -> None:
        """A message to `target` was dropped on the way out: probe it again (move_throttle.py)."""
        self.call_core(lambda core: core.report_unreachable(target))

    def call_core(self, call: Callable[[RaftCore], None]) -> None:
        """Run `call(core)` on the group's task, in order with its inputs (catchup_leader.py)."""
        self._enqueue_and_wake("call", call)

    def request_quiesce(self, leader: int, term: int, index: int) -> None:
        """The leader says the group is idle; obeyed in order with the messages around it."""
        self._enqueue_and_wake("quiesce", (leader, term, index))

    def announce_to(self, leader: int) -> None:
        """Tell `leader` where this replica's log ends (`RaftCore.announce`), staying quiet."""
        if self._enqueue("announce", leader):
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
        if self.quiesced and not (self._held and message.type in quiescence.VOTE_REQUESTS):
            # Woken (held, it answers vote requests): a leader counts idle time anew, a follower wakes its leader.
            self._idle_ticks, tell = quiescence.woken_by(self.core, message, self._idle_ticks)
            if tell and self._enqueue("announce", tell):
                self._wakeup.set()
            self.quiesced = self._held = False
        if not self._enqueue("message", message):
            self.messages_shed += 1  # Raft retries: shedding beats blocking the loop
        self._wakeup.set()

    def tick(self) -> None:
        if self.quiesced:
            return
        self._ticks_offered += 1
        if campaign_backoff_skips(self._campaigns_without_leader, self._ticks_offered):
            return
        self._pending_ticks += 1  # counted; the task wakes only if a timer may fire (pacing.py)
        if tick_due(self.core, self._pending_ticks):
            self._wakeup.set()

    async def propose(self, payloads: Sequence[bytes], kind: EntryKind = EntryKind.DATA, acks: str = "quorum",
                      guard: group_types.AppendGuard | None = None) -> list[Any]:
        """Replicate `payloads` as consecutive entries and wait as `acks` says.

        - "quorum": until applied (committed by a majority); returns the apply results;
        - "leader": until durable on this leader only; returns the entries' indexes
          (a leader crash before the commit can lose them: the relaxation the user
          asked for; Kafka's acks=1 answers with the leader's offsets the same way);
        - "all": until applied and held by every in-sync replica.
        A `guard` decides on this group's task, right before the append, whether it may be.
        """
        assert acks in ("quorum", "leader", "all")
        self._check_running()
        self.wake()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in payloads]
        persisted: asyncio.Future[tuple[Index, Term]] = loop.create_future()
        if not self._enqueue("propose", (tuple(payloads), kind, futures, persisted, guard)):
            raise ProposalDropped("the group's inbox is full; retry")
        self._wakeup.set()
        if acks == "leader":
            for future in futures:  # nobody awaits these: retrieve their outcome quietly
                future.add_done_callback(consume_outcome)
            first, term = await persisted
            if self.core.log.term_or_none(first) != term:  # replaced since (this leader was deposed)
                raise OutcomeUnknown("leadership was lost after the leader's write; it may be lost")
            return [Index(first + i) for i in range(len(futures))]
        persisted.add_done_callback(consume_outcome)
        if len(futures) == 1:  # one batch, the usual case: gather would add a loop turn
            results = [await futures[0]]
        else:
            results = list(await asyncio.gather(*futures))
        if acks == "all":
            held: asyncio.Future[None] = loop.create_future()
            self._waiters.in_sync.append((self.core.applied_index, held))
            self._wakeup.set()
            await held
        return results

    def _check_running(self) -> None:
        if self.failed:
            raise ProposalDropped("this replica's storage failed; it is being reopened, retry")

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
                self.host.release_cached()  # after a follower's answer too, which may make no Ready
                if self._campaign_requested and self.core.applied_index >= self.core.commit_index:
                    self._campaign_requested = False
                    self.core.campaign()
                    self._wakeup.set()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a storage failure is fatal for the group, never silent
            self.logger.error("group_failed", error=repr(error))
            self.failed, self.failure = True, error
            self._fail_waiters(OutcomeUnknown(f"group {self.group_id} failed: {error!r}"))
            if self.on_failure is not None:
                self.on_failure(self.group_id)  # the node reopens it from disk (like a restart)
            raise

    def _drain(self) -> None:
        core, check_data = self.core, self._check_data
        if self.quiet_since is not None and not self.quiesced:
            self._pass_quiet_time()
        # Ticks that fire no timer first (time passed before what is queued), the others
        # after the inbox, capped (pacing.py); campaigns timing out count for `tick`.
        (quiet, due), self._pending_ticks = split_ticks(core, self._pending_ticks), 0
        self._campaigns_without_leader += run_ticks(core, quiet, self.is_live)
        if self._background is not None and self._background.reported:
            self._take_persist_reports(self._background)
        inbox = self._inbox
        for _ in range(min(len(inbox), DRAIN_BATCH_MAX)):
            kind, item = inbox.popleft()
            if kind == "message":
                if self.quiesced and not (self._held and quiescence.stays_held(core, item)):  # see deliver
                    self.quiesced = self._held = False
                if item.type is MessageType.APPEND and item.entries and check_data is not None \
                        and not self.host.batches_valid(item, check_data, self.logger):
                    continue
                core.step(item)
            elif kind == "propose":
                self._propose(*item)
            elif kind == "quiesce":
                self.quiesced = quiescence.follower_may_quiesce(core, *item)
            elif kind == "membership":
                self._propose_membership(*item)
            elif kind == "transfer":
                with contextlib.suppress(ClientError):  # no longer leading, or target not a voter
                    core.transfer_leadership(item)
            elif kind == "leader_gone":
                self._leader_gone(item)
            elif kind == "announce":
                core.announce(item)
            elif kind == "gone_campaign":
                self._campaign_for(item)
            elif kind == "gone_retry":
                failover.campaign_again(core)
            elif kind == "call":
                item(core)
            else:
                self._read(*item)
        self._consider_quiescing(quiet + due)
        if not self.quiesced:  # a leader going quiet now sends no heartbeat (its answers would wake it)
            self._campaigns_without_leader += run_ticks(core, due, self.is_live)
        if inbox:
            self._wakeup.set()
        self._check_role()
        if self._waiters.in_sync:
            release_in_sync_writes(core, self._waiters)

    def _leader_gone(self, leader: int) -> None:
        """See failover.py: the successor campaigns when the node's pacer says, the other
        survivors hold for it; neither side's timers campaign meanwhile."""
        succession = failover.forget_dead_leader(self.core, leader, self.is_live)
        if succession is failover.Succession.NONE:
            return
        self.quiesced = self._held = True
        if succession is failover.Succession.OTHER:
            asyncio.get_running_loop().call_later(self._pacer.others_hold_s, self.release_hold)
        else:
            self._pacer.request(self.group_id, lambda: self._enqueue_and_wake("gone_campaign", leader))

    def _campaign_for(self, leader: int) -> None:
        self.wake()
        if not failover.campaign_now(self.core, leader, self.logger):
            self._pacer.done(self.group_id)
            return
        loop = asyncio.get_running_loop()  # asked again, a little later each time (failover.py)
        for attempt in range(1, failover.LEADER_GONE_RETRIES + 1):
            loop.call_later(attempt * failover.LEADER_GONE_RETRY_S, self._enqueue_and_wake, "gone_retry", leader)

    def _enqueue_and_wake(self, kind: str, item: Any) -> None:
        if self._task is not None and self._enqueue(kind, item):
            self._wakeup.set()

    def _propose(self, payloads: tuple[bytes, ...], kind: EntryKind, futures: list[asyncio.Future[Any]],
                 persisted: asyncio.Future[tuple[Index, Term]], guard: group_types.AppendGuard | None) -> None:
        try:
            if guard is not None:
                guard.check(self.core)
            term, first = self.core.propose(payloads, kind)
        except ClientError as error:
            self._waiters.refuse([*futures, persisted], error)
            return
        if guard is not None:
            guard.appended(self.core)
        self._waiters.proposed(term, first, futures, persisted, time.perf_counter())

    def _propose_membership(self, change: ConfChange, future: asyncio.Future[Any]) -> None:
        try:
            term, index = self.core.propose_membership(change)
        except ClientError as error:
            future.set_exception(error)
            return
        self._waiters.proposals[index] = Proposal(term, future)

    def _read(self, context: bytes, future: asyncio.Future[Index]) -> None:
        try:
            self.core.read_index(context)
        except ClientError as error:
            future.set_exception(error)
            return
        self._waiters.reads[context] = future

    async def _handle_ready(self) -> None:
        core = self.core
        for wait in process_ready(core, core.ready(), self.host, self.persistence):
            await wait  # the flush this Ready's write waits for
        if core.needs_repair:
            self.host.check_repaired(self.logger)
        self._waiters.serve_reads(core.applied_index)
        self._check_role()

    def _wake_task(self) -> None:
        if self._task is not None:
            self._wakeup.set()

    def _take_persist_reports(self, background: BackgroundWrites) -> None:
        """Background writes reported durable: the core counts them; acks=leader may answer
        (a failed one raises: the group fails and is reopened, as on any failed flush)."""
        for index, term in background.take_reports():
            self.core.persisted(index, term)
        if self._waiters.persisted:
            self._waiters.release_persisted(self.core.log.stable_last_index())

    def _consider_quiescing(self, ticks: int) -> None:
        """A leader idle for an election timeout goes quiet and tells its followers, past
        members whose nodes are down if need be, woken when one leaves the ISR (quiescence.py)."""
        core = self.core
        if self.quiesced or not ticks or core.role is not Role.LEADER:
            return
        absent = quiescence.absent_members(core, self.is_live)
        if quiescence.quiesce_refusal(core, absent) is not None:
            self._idle_ticks = 0
            return
        self._idle_ticks += ticks
        if self._idle_ticks >= core.config.election_timeout_ticks and self.on_quiesce is not None:
            self.quiesced = True
            self.quiet_past = absent
            self.quiet_since = self._node_ticks() if self._node_ticks is not None else None
            self.on_quiesce(self.group_id, core.term, core.log.last_index())
            due = quiescence.ticks_until_isr_drops(core, absent) if absent else None
            if due is not None and self._wake_after_ticks is not None:
                self._wake_after_ticks(due, self)

    def _pass_quiet_time(self) -> None:
        """Awake after a quiet spell as leader: it passed for the ISR (`RaftCore.pass_quiet_time`)."""
        assert self._node_ticks is not None and self.quiet_since is not None
        quiet = self._node_ticks() - self.quiet_since - self._pending_ticks
        self.quiet_since, self.quiet_past = None, frozenset()
        core = self.core
        core.pass_quiet_time(max(0, quiet), [n for n in core.membership.members if self.is_live(n)])

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
                self._pacer.done(self.group_id)  # a succession campaign, if any, is over
            if self.core.role is not Role.LEADER and self._waiters.reads:  # forwarded to the old leader:
                self._waiters.fail_reads(NotLeader(leader))  # lost with its read queue; callers ask again
        role = self.core.role
        if role is self._role:
            return
        previous, self._role = self._role, role
        if role is Role.CANDIDATE:
            self.elections += 1
        self.logger.info("role_changed", role=role.value, previous=previous.value)
        if previous is Role.LEADER:
            self._fail_waiters(OutcomeUnknown("leadership was lost before the proposal applied"))
        elif role is not Role.LEADER and self._waiters.reads:
            self._waiters.fail_reads(NotLeader(self.core.leader))
        if self._on_role_change is not None:
            self._on_role_change(self.group_id, role, self.core.term)

    def _fail_waiters(self, error: ClientError) -> None:
        self._waiters.fail_all(error)
