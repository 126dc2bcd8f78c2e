"""A deterministic simulator: N Raft cores, one seed, a hostile world.

One `random.Random(seed)` picks everything: which faults are on for this seed
(swarm testing: a random subset per seed finds more than all-at-once), when
nodes tick (each with its own clock rate), how long every message and every disk
write takes, what the network drops, duplicates or reorders, when nodes crash
(losing unsynced writes, sometimes in the middle of one, sometimes keeping a torn
tail), pause, get partitioned, compact their logs, transfer leadership, change
membership, and when clients propose and read. Virtual time is an integer; events
sit in a heap ordered by (time, sequence), so a run replays exactly.

Each node's core is driven by the production Ready processor
(`multiraft/runtime/ready_processor.py`), the one the node runtime runs: it takes
each Ready through its steps and picks how its write becomes durable. The
simulator is its host and its persistence (`SimNodeIO`): the steps land in
in-memory storage and a simulated network, and a write the processor waits for
becomes durable when a simulated disk event fires (slow disks, crashes in the
middle), the suspended processor kept in `SimNode.busy` meanwhile; a leader's own
appends may be made durable in the background (`leader_writes_async`), and a
write that only moves the commit index is stored lazily, as on a node. Whatever
arrives while a node is busy waits in its inbox.

After the chaos phase everything heals; the run then demands liveness: a leader
within a bounded time, and a fresh proposal applied on every member.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from multiraft.runtime.pacing import credit_live_members, split_ticks, tick_due
from multiraft.runtime.ready_processor import Durability, process_ready
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.core.ready import Ready
from raftlog.errors import ClientError
from raftlog.messages import (
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
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage
from tests.sim.checker import InvariantViolation, SafetyChecker
from tests.sim.network import NetworkFaults, SimNetwork

APPLYING = "applying"
TICK_INTERVAL = 10  # virtual time units per tick at a normal clock rate
INBOX_MAX = 4096  # a paused node's inbox is bounded like a socket buffer
DRAIN_BATCH_MAX = 64


@dataclass(frozen=True, slots=True)
class FaultMix:
    """Which kinds of trouble a seed brings (swarm testing)."""

    loss: bool = False
    duplicate: bool = False
    reorder: bool = False
    partition: bool = False
    one_way: bool = False
    crash: bool = False
    crash_mid_persist: bool = False
    torn_tail: bool = False
    pause: bool = False
    clock_skew: bool = False
    slow_disk: bool = False
    transfer: bool = False
    membership: bool = False
    compaction: bool = False
    read_index: bool = False
    # Quiescence: a node stops ticking (its group went quiet) while still stepping
    # messages; it wakes on a timer here, as a real node wakes when the leader's node
    # looks dead. Ticks only drive liveness, so safety must not notice.
    quiesce: bool = False
    # A leader's own appends become durable in the background (`advance(ready,
    # persisted=False)`, then `persisted`), as the node runtime does: followers'
    # acknowledgements commit while the leader's fsync runs, and a crash loses them.
    leader_writes_async: bool = False
    # Applying committed entries takes time on some nodes (the runtime writes them into
    # the partition's segments after the fsync): the Ready is held meanwhile, so with a
    # small `committed_bytes_per_ready_max` a node's applied index trails its commit
    # index over many Readys (after a restart: over its whole log), while it ticks and
    # steps messages between them. CONFIG entries take effect only when applied.
    slow_apply: bool = False
    # Membership changes race elections: changes come in bursts (the next one as soon as
    # the leader applied the last), and as a leader commits a CONFIG entry an election
    # is provoked (a campaign, the leader crashed or cut off, a follower restarted,
    # a split), while some nodes have the change committed but not yet applied.
    membership_race: bool = False
    # Overload: a node's loop falls behind (docs/scale.md, issue 26). For a while its
    # groups' task runs late, again and again: its ticker keeps counting ticks and
    # messages queue; when it runs, it steps the queued messages, then a capped burst
    # of ticks (multiraft/runtime/pacing.py, which paces every node here).
    overload: bool = False
    # CheckQuorum credits live nodes (`RaftCore.note_active`), as the runtime does: a
    # node-level oracle says a peer is live while its messages reach this node and it
    # is up (or went down less than an election timeout ago: liveness is that stale).
    liveness_credit: bool = False

    @classmethod
    def everything(cls) -> FaultMix:
        return cls(**{f.name: True for f in fields(cls)})

    @classmethod
    def random(cls, rng: random.Random) -> FaultMix:
        mix = cls(**{f.name: rng.random() < 0.5 for f in fields(cls)})
        return mix if any(getattr(mix, f.name) for f in fields(cls)) else cls.everything()

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


@dataclass(slots=True)
class SimOptions:
    nodes: int = 3
    chaos_time: int = 4000  # virtual time of the fault phase (400 ticks at normal rate)
    election_timeout_ticks: int = 10
    # After the heal: a leader within `leader_ticks_max`, and the final proposal applied on
    # every member within `commit_ticks_base` plus `commit_ticks_per_entry` for each entry
    # some member still lacked at the heal (catch-up can be one entry per round trip).
    leader_ticks_max: int = 200
    commit_ticks_base: int = 300
    commit_ticks_per_entry: int = 10
    events_max: int = 400_000
    faults: FaultMix | None = None  # None: a random mix from the seed
    core_class: type[RaftCore] = RaftCore
    trace: Callable[[str], None] | None = None


@dataclass(slots=True)
class Proposal:
    node: NodeId
    term: Term
    index: Index
    status: str = "pending"  # pending -> acked | refused | unknown


@dataclass(slots=True)
class SimNode:
    id: NodeId
    storage: MemoryStorage
    core: RaftCore | None = None
    up: bool = True
    paused_until: int = 0
    # The suspended Ready processor while its write waits for the (simulated) disk, or
    # APPLYING while the state machine digests what the last Ready applied.
    busy: Generator[Any, None, None] | str | None = None
    incarnation: int = 0
    tick_interval: int = TICK_INTERVAL
    pending_ticks: int = 0
    inbox: deque[tuple[str, Any]] = field(default_factory=deque)
    applied: list[tuple[Index, Term, EntryKind, bytes]] = field(default_factory=list)
    applied_payloads: set[bytes] = field(default_factory=set)
    ticks_frozen_until: int = 0
    stalled_until: int = 0  # overload: until then its loop is late (ticks counted, nothing run)
    crashed_at: int = -(1 << 62)
    last_commit: int = 0
    last_term: int = 0
    was_leader_in: int = -1
    led_last_index: int = -1
    apply_time_max: int = 0  # virtual time one Ready's committed entries may take to apply
    io: SimNodeIO | None = None  # the Ready processor's host and persistence for this node


@dataclass(slots=True)
class SimResult:
    seed: int
    nodes: int
    faults: list[str]
    events: int
    time: int
    acked: int
    leaders_elected: int
    heal_to_leader_ticks: int
    heal_to_commit_ticks: int
    crashes: int
    messages_sent: int
    reads_checked: int


class Simulation:
    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.options = options or SimOptions()
        self.rng = random.Random(seed)
        self.faults = self.options.faults or FaultMix.random(self.rng)
        self.network = SimNetwork(self.rng, self._network_faults())
        # Swarm over the protocol options too: safety may not depend on them.
        self.pre_vote = self.rng.random() < 0.75
        self.check_quorum = self.rng.random() < 0.75
        # Half the seeds drain as the runtime did before issue 26 (every held tick before
        # the inbox): a schedule safety may not depend on, and more leader churn (a
        # figure-8 core is caught in far fewer seeds with it).
        self.ticks_first = self.rng.random() < 0.5
        self.checker = SafetyChecker()
        self.now = 0
        self._heap: list[tuple[int, int, str, tuple[Any, ...]]] = []
        self._sequence = 0
        self.events = 0
        self.healed = False
        self.heal_time = 0
        self.commit_ticks_max = 0
        self.leader_after_heal_time = -1
        self.final_payload: bytes | None = None
        self.final_attempts = 0
        self.final_applied_time = -1
        self.final_leader: SimNode | None = None
        self.proposals: dict[bytes, Proposal] = {}
        self.crashes = 0
        self.quiesce_events = 0
        self.stalls = 0  # late turns of overloaded nodes
        self.membership_changes = 0  # membership changes a leader accepted
        self.membership_races = 0  # elections provoked as a CONFIG entry committed
        self.reads_checked = 0
        self._read_requirements: dict[bytes, int] = {}
        self._payload_counter = 0
        voter_ids = [NodeId(i) for i in range(1, self.options.nodes + 1)]
        spare = 2 if self.faults.membership or self.faults.membership_race else 0
        self.all_ids = [NodeId(i) for i in range(1, self.options.nodes + spare + 1)]
        bootstrap, hard_state = bootstrap_entries(voter_ids)
        self.nodes: dict[NodeId, SimNode] = {}
        for node_id in self.all_ids:
            storage = MemoryStorage()
            if node_id in voter_ids:
                storage.append(bootstrap)
                storage.set_hard_state(hard_state)
                storage.sync()
            node = SimNode(node_id, storage)
            if self.faults.clock_skew:
                node.tick_interval = self.rng.randrange(TICK_INTERVAL * 6 // 10, TICK_INTERVAL * 14 // 10 + 1)
            if self.faults.slow_apply:
                node.apply_time_max = self.rng.choice([0, 10, 30, 80])
            self.nodes[node_id] = node
            self._start(node)

    # ------------------------------------------------------------------ running

    def run(self) -> SimResult:
        for node in self.nodes.values():
            self._schedule(self.rng.randrange(node.tick_interval), "tick", node.id, node.incarnation)
        self._schedule(self.rng.randrange(5, 50), "client")
        self._schedule(self.rng.randrange(50, 300), "fault")
        self._schedule(self.options.chaos_time, "heal")
        deadline_events = self.options.events_max
        while self._heap:
            if self.events >= deadline_events:
                raise InvariantViolation("liveness", f"no convergence within {deadline_events} events")
            time, _, kind, args = heapq.heappop(self._heap)
            self.now = time
            self.events += 1
            getattr(self, "_on_" + kind)(*args)
            if self.events % 250 == 0:
                self._check_log_matching()
            if self.final_applied_time >= 0:
                break
        self._check_log_matching()
        self._final_checks()
        return self._result()

    def _schedule(self, delay: int, kind: str, *args: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (self.now + delay, self._sequence, kind, args))

    def _trace(self, node: NodeId | str, event: str, **details: Any) -> None:
        if self.options.trace is not None:
            text = " ".join(f"{k}={v}" for k, v in details.items())
            self.options.trace(f"t={self.now:>6} n{node} {event} {text}")

    # ------------------------------------------------------------------ node lifecycle

    def _start(self, node: SimNode) -> None:
        snapshot = node.storage.snapshot()
        config = Config(
            node_id=node.id,
            election_timeout_ticks=self.options.election_timeout_ticks,
            heartbeat_interval_ticks=1,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            message_bytes_max=self.rng.choice([64, 512, 4096]),
            inflight_messages_max=self.rng.choice([1, 4, 64]),
            # Small values make applying lag committing by many Readys (restarts, catch-up).
            committed_bytes_per_ready_max=self.rng.choice([40, 200, 4096, 16 << 20]),
            replica_lag_time_max_ticks=30,
            snapshot_timeout_ticks=30,
            applied=snapshot.meta.index,
        )
        node.core = self.options.core_class(config, node.storage, random.Random(self.rng.random()))
        node.io = SimNodeIO(self, node)
        node.up = True
        node.busy = None
        node.pending_ticks = 0
        node.stalled_until = 0
        node.inbox.clear()
        node.incarnation += 1
        node.last_commit = node.core.commit_index
        node.last_term = node.core.term
        node.was_leader_in = -1
        node.led_last_index = -1
        self._restore_state_machine(node, snapshot)

    def _restore_state_machine(self, node: SimNode, snapshot: Snapshot) -> None:
        node.applied = list(snapshot.data or ())
        node.applied_payloads = {p for _, _, kind, p in node.applied if kind is EntryKind.DATA}
        for index, term, kind, payload in node.applied:
            self.checker.on_applied(node.id, Entry(index, term, kind, payload))

    def _crash(self, node: SimNode, reason: str) -> None:
        if not node.up:
            return
        torn = self.faults.torn_tail and self.rng.random() < 0.5
        self._trace(node.id, "crash", reason=reason, torn_tail=torn)
        node.storage.crash(self.rng, torn_tail=torn)
        node.up = False
        node.crashed_at = self.now
        node.core = None
        node.busy = None
        node.inbox.clear()
        node.incarnation += 1
        self.crashes += 1
        for proposal in self.proposals.values():
            if proposal.node == node.id and proposal.status == "pending":
                proposal.status = "unknown"

    # ------------------------------------------------------------------ events

    def _on_tick(self, node_id: NodeId, incarnation: int) -> None:
        node = self.nodes[node_id]
        if incarnation != node.incarnation:
            return
        self._schedule(node.tick_interval, "tick", node_id, incarnation)
        if self.now < node.stalled_until:
            node.pending_ticks += 1  # a late loop: its ticker counts, its task does not run
            return
        if self.now < node.paused_until or self.now < node.ticks_frozen_until:
            return
        node.pending_ticks += 1
        assert node.core is not None
        # As the runtime: the task runs for a tick only if a timer can fire (pacing.py);
        # a busy one (awaiting its disk) applies the count when it is done.
        if node.busy is None and tick_due(node.core, node.pending_ticks):
            self._pump(node)

    def _on_deliver(self, message: Message) -> None:
        node = self.nodes[message.target]
        if not node.up or (message.source, message.target) in self.network.blocked:
            return  # a partition also loses what was in flight on the cut link
        if len(node.inbox) < INBOX_MAX:
            node.inbox.append(("message", message))
        if node.busy is None and self.now >= node.paused_until:
            self._pump(node)

    def _on_persisted(self, node_id: NodeId, incarnation: int) -> None:
        """The disk finished what a node's Ready processor waits for (or its state machine
        finished applying): the write is durable; the processor goes on."""
        node = self.nodes[node_id]
        if incarnation != node.incarnation or node.busy is None:
            return
        if self.now < node.paused_until:
            self._schedule(node.paused_until - self.now, "persisted", node_id, incarnation)
            return
        steps, node.busy = node.busy, None
        if steps is not APPLYING:
            assert not isinstance(steps, str)
            node.storage.sync()
            self._resume(node, steps)
        self._pump(node)

    def _on_leader_persisted(self, node_id: NodeId, incarnation: int, index: Index, term: Term) -> None:
        """A write a leader did not wait for is durable (with all written before it)."""
        node = self.nodes[node_id]
        if incarnation != node.incarnation:
            return  # the crash lost whatever was not synced
        if node.busy is not None or self.now < node.paused_until:
            self._schedule(1, "leader_persisted", node_id, incarnation, index, term)
            return
        assert node.core is not None
        node.storage.sync()
        node.core.persisted(index, term)
        self._after_input(node)
        self._pump(node)

    def _on_restart(self, node_id: NodeId) -> None:
        node = self.nodes[node_id]
        if node.up:
            return
        self._trace(node_id, "restart")
        self._start(node)
        self._schedule(self.rng.randrange(node.tick_interval), "tick", node_id, node.incarnation)

    def _on_resume(self, node_id: NodeId) -> None:
        node = self.nodes[node_id]
        if node.up and node.busy is None and self.now >= node.paused_until:
            self._pump(node)

    def _on_heal_partition(self) -> None:
        self.network.heal()
        self._trace("-", "partition_healed")

    def _on_client(self) -> None:
        if self.healed:
            self._client_after_heal()
            return
        self._schedule(self.rng.randrange(5, 40), "client")
        node = self.nodes[self.rng.choice(self.all_ids)]
        leaders = [n for n in self.nodes.values() if n.up and n.core is not None and n.core.role is Role.LEADER]
        if leaders and self.rng.random() < 0.8:
            node = self.rng.choice(leaders)
        if not node.up:
            return
        if self.faults.read_index and self.rng.random() < 0.2:
            context = b"read-%d" % self._next_id()
            self._read_requirements[context] = self._acked_high_index()
            self._enqueue(node, "read", context)
        else:
            payloads = [b"p%d" % self._next_id() for _ in range(self.rng.randrange(1, 4))]
            self._enqueue(node, "propose", payloads)

    def _client_after_heal(self) -> None:
        self._schedule(TICK_INTERVAL * 5, "client")
        elapsed_ticks = (self.now - self.heal_time) // TICK_INTERVAL
        if elapsed_ticks > self.commit_ticks_max:
            raise InvariantViolation(
                "liveness", f"final proposal not applied everywhere {elapsed_ticks} ticks after the heal"
            )
        leader = self._current_leader()
        if leader is None:
            if self.leader_after_heal_time < 0 and elapsed_ticks > self.options.leader_ticks_max:
                raise InvariantViolation("liveness", f"no leader {elapsed_ticks} ticks after the heal")
            return
        if self.leader_after_heal_time < 0:
            self.leader_after_heal_time = self.now
        assert leader.core is not None
        final = self.final_payload
        proposal = self.proposals.get(final) if final is not None else None
        # A proposal of the leader's earlier term may have been overwritten while it was
        # deposed; nothing ever resolves it (the runtime fails it with OutcomeUnknown).
        stale = proposal is not None and proposal.status == "pending" and proposal.term != leader.core.term
        if proposal is None or proposal.status in ("unknown", "refused") or proposal.node != leader.id or stale:
            # (Re)propose on the current leader; a new payload each time keeps ids unique.
            self.final_attempts += 1
            if proposal is None and final is not None and self.final_attempts % 4 != 0:
                return  # give a queued proposal a few rounds to reach the core
            self.final_payload = b"final-%d-%d" % (self.seed, self.final_attempts)
            self._enqueue(leader, "propose", [self.final_payload])
            return
        members = leader.core.membership.members
        if proposal.status == "acked" and all(final in self.nodes[m].applied_payloads for m in members):
            self.final_applied_time = self.now
            self.final_leader = leader

    def _on_fault(self) -> None:
        if self.healed:
            return
        self._schedule(self.rng.randrange(30, 300), "fault")
        actions = [
            (self.faults.crash, self._fault_crash),
            (self.faults.pause, self._fault_pause),
            (self.faults.partition, self._fault_partition),
            (self.faults.transfer, self._fault_transfer),
            (self.faults.membership or self.faults.membership_race, self._fault_membership),
            (self.faults.compaction, self._fault_compaction),
            (self.faults.quiesce, self._fault_quiesce),
            (self.faults.overload, self._fault_overload),
        ]
        enabled = [action for on, action in actions if on]
        if enabled:
            self.rng.choice(enabled)()

    def _on_heal(self) -> None:
        self.healed = True
        self.heal_time = self.now
        cores = [n.core for n in self.nodes.values() if n.core is not None]
        backlog = max(c.log.last_index() for c in cores) - min(c.commit_index for c in cores) if cores else 0
        self.commit_ticks_max = self.options.commit_ticks_base + self.options.commit_ticks_per_entry * backlog
        self.network.heal()
        self.network.faults = NetworkFaults(delay_min=1, delay_jitter=4)
        self._trace("-", "heal_all")
        for node in self.nodes.values():
            node.paused_until = 0
            node.stalled_until = 0
            node.ticks_frozen_until = 0
            node.apply_time_max = 0  # the liveness bound is about catching up, not slow state machines
            if not node.up:
                self._on_restart(node.id)
            elif node.busy is None:
                self._pump(node)

    def _on_crash(self, node_id: NodeId, incarnation: int, reason: str) -> None:
        node = self.nodes[node_id]
        if node.incarnation == incarnation and not self.healed:
            self._crash(node, reason)
            downtime = self.rng.randrange(5, 60) if self.rng.random() < 0.5 else self.rng.randrange(60, 400)
            self._schedule(downtime, "restart", node_id)

    # ------------------------------------------------------------------ faults

    def _fault_crash(self) -> None:
        up = [n for n in self.nodes.values() if n.up]
        if not up:
            return
        leader = self._current_leader()
        if leader is not None and self.rng.random() < 0.4:
            self._on_crash(leader.id, leader.incarnation, "leader")
            return
        count = 1 if self.rng.random() < 0.8 else self.rng.randrange(1, len(up) + 1)
        for node in self.rng.sample(up, count):
            self._on_crash(node.id, node.incarnation, "fault")

    def _fault_pause(self) -> None:
        node = self.nodes[self.rng.choice(self.all_ids)]
        duration = self.rng.randrange(50, 600)
        node.paused_until = self.now + duration
        self._trace(node.id, "pause", ticks=duration // TICK_INTERVAL)
        self._schedule(duration, "resume", node.id)

    def _fault_partition(self) -> None:
        nodes = list(self.all_ids)
        kind = self.rng.choice(["isolate", "split", "links"] + (["one_way"] if self.faults.one_way else []))
        if kind == "isolate":
            self.network.isolate(self.rng.choice(nodes), nodes)
        elif kind == "one_way":
            self.network.isolate(self.rng.choice(nodes), nodes, one_way=True)
        elif kind == "split":
            self.network.split(self.rng.sample(nodes, self.rng.randrange(1, len(nodes))), nodes)
        else:
            for _ in range(self.rng.randrange(1, 4)):
                a, b = self.rng.sample(nodes, 2)
                self.network.block_link(a, b)
        self._trace("-", "partition", kind=kind, blocked=sorted(self.network.blocked))
        self._schedule(self.rng.randrange(100, 1500), "heal_partition")

    def _fault_transfer(self) -> None:
        if self.rng.random() < 0.3:
            # A driver-initiated election (a new group's preferred leader does this).
            node = self.nodes[self.rng.choice(self.all_ids)]
            if node.up:
                self._enqueue(node, "campaign", None)
            return
        leader = self._current_leader()
        if leader is None or leader.core is None:
            return
        voters = sorted(leader.core.membership.voters)
        target = self.rng.choice([None, *voters])
        self._enqueue(leader, "transfer", target)

    def _fault_membership(self) -> None:
        if self.faults.membership_race and self.rng.random() < 0.7:
            self._on_membership_burst(self.membership_changes, self.rng.randrange(2, 4), 30)
        else:
            self._propose_membership_change()

    def _on_membership_burst(self, accepted_before: int, changes_left: int, attempts_left: int) -> None:
        """The next change of a burst, as soon as the leader takes it (it refuses one while
        its previous change is unapplied, or before it committed an entry of its term)."""
        if self.membership_changes > accepted_before:
            changes_left -= 1
        if self.healed or changes_left <= 0 or attempts_left <= 0:
            return
        accepted = self.membership_changes
        self._propose_membership_change()
        self._schedule(self.rng.randrange(5, 30), "membership_burst", accepted, changes_left, attempts_left - 1)

    def _maybe_race_membership(self, core: RaftCore, previous_commit: int) -> None:
        """A leader just committed entries; if one is a CONFIG entry, provoke an election
        soon, while followers have it committed but (with slow apply) not yet applied."""
        entries = core.log.slice(Index(previous_commit + 1), Index(core.commit_index + 1), 1 << 60)
        if any(e.kind is EntryKind.CONFIG for e in entries) and self.rng.random() < 0.5:
            self._schedule(self.rng.randrange(8 * TICK_INTERVAL), "membership_race")

    def _on_membership_race(self) -> None:
        if self.healed:
            return
        self.membership_races += 1
        leader = self._current_leader()
        followers = [n for n in self.nodes.values() if n.up and n is not leader]
        kind = self.rng.choice(["campaign", "crash_leader", "isolate_leader", "restart_follower", "split"])
        self._trace("-", "membership_race", kind=kind)
        if kind == "campaign" and followers:
            self._enqueue(self.rng.choice(followers), "campaign", None)
        elif kind == "crash_leader" and leader is not None:
            self._on_crash(leader.id, leader.incarnation, "membership-race")
        elif kind == "isolate_leader" and leader is not None:
            self.network.isolate(leader.id, self.all_ids)
            self._schedule(self.rng.randrange(100, 800), "heal_partition")
        elif kind == "restart_follower" and followers:
            node = self.rng.choice(followers)
            self._crash(node, "membership-race")
            self._schedule(self.rng.randrange(1, 30), "restart", node.id)
        elif kind == "split":
            nodes = list(self.all_ids)
            self.network.split(self.rng.sample(nodes, self.rng.randrange(1, len(nodes))), nodes)
            self._schedule(self.rng.randrange(100, 800), "heal_partition")

    def _propose_membership_change(self) -> None:
        leader = self._current_leader()
        if leader is None or leader.core is None:
            return
        membership = leader.core.membership
        choices: list[ConfChange] = []
        if len(membership.voters) > 1:
            choices.append(ConfChange(ConfChangeOp.REMOVE, self.rng.choice(sorted(membership.voters))))
        outsiders = [n for n in self.all_ids if n not in membership.members]
        if outsiders:
            choices.append(ConfChange(ConfChangeOp.ADD_LEARNER, self.rng.choice(outsiders)))
            choices.append(ConfChange(ConfChangeOp.ADD_VOTER, self.rng.choice(outsiders)))
        if membership.learners:
            choices.append(ConfChange(ConfChangeOp.ADD_VOTER, self.rng.choice(sorted(membership.learners))))
        if choices:
            self._enqueue(leader, "membership", self.rng.choice(choices))

    def _fault_quiesce(self) -> None:
        """Freeze the ticks of some nodes (all of them, sometimes) as quiescence would."""
        count = self.rng.randrange(1, len(self.all_ids) + 1)
        for node_id in self.rng.sample(self.all_ids, count):
            self.nodes[node_id].ticks_frozen_until = self.now + self.rng.randrange(100, 1500)
        self.quiesce_events += 1
        self._trace("-", "quiesce", nodes=count)

    def _fault_overload(self) -> None:
        """Some nodes' loops fall behind for a while: stall after stall (see `_on_stall`)."""
        count = 1 if self.rng.random() < 0.7 else self.rng.randrange(1, len(self.all_ids) + 1)
        window = self.rng.randrange(100, 1500)
        for node_id in self.rng.sample(self.all_ids, count):
            node = self.nodes[node_id]
            self._on_stall(node_id, node.incarnation, self.now + window)
        self._trace("-", "overload", nodes=count, window=window)

    def _on_stall(self, node_id: NodeId, incarnation: int, window_end: int) -> None:
        """One late turn of an overloaded node: mostly a tick or three, sometimes up to two
        election timeouts; then it runs a little (queued messages, capped ticks) and is
        late again, until `window_end`."""
        node = self.nodes[node_id]
        if self.healed or node.incarnation != incarnation or not node.up or self.now >= window_end:
            return
        timeout = self.options.election_timeout_ticks * TICK_INTERVAL
        stall = self.rng.randrange(5, 3 * TICK_INTERVAL) if self.rng.random() < 0.8 else self.rng.randrange(
            timeout // 2, 2 * timeout)
        self.stalls += 1
        node.stalled_until = self.now + stall
        node.paused_until = max(node.paused_until, node.stalled_until)
        self._schedule(stall, "resume", node_id)
        self._schedule(stall + self.rng.randrange(1, 15), "stall", node_id, incarnation, window_end)

    def _node_live(self, viewer: NodeId, peer: NodeId) -> bool:
        """The node-level liveness oracle (`liveness_credit`): `viewer` hears `peer`'s node."""
        node = self.nodes.get(peer)
        if node is None or (peer, viewer) in self.network.blocked:
            return False
        return node.up or self.now - node.crashed_at <= self.options.election_timeout_ticks * TICK_INTERVAL

    def _fault_compaction(self) -> None:
        node = self.nodes[self.rng.choice(self.all_ids)]
        core = node.core
        if not node.up or core is None or node.busy is not None:
            return
        index = core.applied_index
        storage = node.storage
        if index < storage.first_index():
            return
        term = storage.term(index)
        storage.compact(index)
        meta = SnapshotMeta(index=index, term=term, membership=core.membership)
        storage.set_snapshot(Snapshot(meta=meta, data=tuple(node.applied)))
        self._trace(node.id, "compact", index=index)

    # ------------------------------------------------------------------ the driver

    def _enqueue(self, node: SimNode, kind: str, item: Any) -> None:
        if len(node.inbox) < INBOX_MAX:
            node.inbox.append((kind, item))
        if node.up and node.busy is None and self.now >= node.paused_until:
            self._pump(node)

    def _run_ticks(self, node: SimNode, ticks: int) -> None:
        core = node.core
        assert core is not None
        if ticks and self.faults.liveness_credit:
            credit_live_members(core, lambda peer: self._node_live(node.id, NodeId(peer)))
        for _ in range(ticks):
            core.tick()
            self._after_input(node)

    def _pump(self, node: SimNode) -> None:
        """Drive one node until it waits for its disk or has nothing to do."""
        while node.up and node.busy is None and self.now >= node.paused_until:
            self._drain(node)
            core = node.core
            assert core is not None and node.io is not None
            if not core.has_ready():
                if not node.inbox:
                    return
                continue
            ready = core.ready()
            node.io.ready = ready
            self._resume(node, process_ready(core, ready, node.io, node.io))

    def _resume(self, node: SimNode, steps: Generator[Any, None, None]) -> None:
        """Run the Ready processor on until it waits for the disk, or to its end."""
        delay = next(steps, None)
        if delay is not None:
            node.busy = steps  # written; durable (and the processor resumed) after `delay`
            self._schedule(delay, "persisted", node.id, node.incarnation)
            return
        self._after_input(node)
        assert node.io is not None and node.io.ready is not None
        apply_time = self._apply_time(node, node.io.ready)
        node.io.ready = None
        if apply_time:
            node.busy = APPLYING  # a slow state machine: the next Ready waits for it
            self._schedule(apply_time, "persisted", node.id, node.incarnation)

    def _apply_time(self, node: SimNode, ready: Ready) -> int:
        """How long applying `ready`'s committed entries takes on `node` (0: at once)."""
        if not node.apply_time_max or not ready.committed_entries:
            return 0
        return self.rng.randrange(1, node.apply_time_max + 1)

    def _mid_persist_crash_rate(self, ready: Ready) -> float:
        """Crash often while a promise (a vote) is being written: that is where bugs hide."""
        hard = ready.hard_state
        if hard is not None and hard.vote != 0 and any(
            m.type is MessageType.VOTE_RESPONSE for m in ready.persisted_messages + ready.messages
        ):
            return 0.3
        return 0.03

    def _drain(self, node: SimNode) -> None:
        """As the runtime's: ticks that fire no timer, the inbox, then the others (capped)."""
        core = node.core
        assert core is not None
        quiet, due = split_ticks(core, node.pending_ticks)
        node.pending_ticks = 0
        if self.ticks_first:
            quiet, due = quiet + due, 0
        self._run_ticks(node, quiet)
        for _ in range(min(len(node.inbox), DRAIN_BATCH_MAX)):
            kind, item = node.inbox.popleft()
            if kind == "message":
                core.step(item)
            else:
                self._client_request(node, kind, item)
            self._after_input(node)
        self._run_ticks(node, due)

    def _client_request(self, node: SimNode, kind: str, item: Any) -> None:
        core = node.core
        assert core is not None
        try:
            if kind == "propose":
                term, first = core.propose(item)
                for offset, payload in enumerate(item):
                    self.proposals[payload] = Proposal(node.id, term, Index(first + offset))
            elif kind == "read":
                core.read_index(item)
            elif kind == "transfer":
                core.transfer_leadership(item)
            elif kind == "membership":
                core.propose_membership(item)
                self.membership_changes += 1
                self._trace(node.id, "membership", op=item.op.name, target=item.node_id)
            elif kind == "campaign":
                core.campaign()
            elif kind == "snapshot_failed":
                core.report_snapshot(item, success=False)
            elif kind == "unreachable":
                core.report_unreachable(item)
        except ClientError as error:
            self._trace(node.id, "refused", kind=kind, error=error.code)

    def _after_input(self, node: SimNode) -> None:
        """Checks that must hold after every single input to a core."""
        core = node.core
        assert core is not None
        if core.commit_index < node.last_commit:
            raise InvariantViolation("commit-monotonic", f"node {node.id} commit went back")
        if core.term < node.last_term:
            raise InvariantViolation("term-monotonic", f"node {node.id} term went back")
        if core.role is Role.LEADER and core.commit_index > node.last_commit:
            log = core.log
            newly = range(node.last_commit + 1, core.commit_index + 1)
            committed = {Index(i): log.term_or_none(Index(i)) for i in newly}
            self.checker.on_leader_commit(core.term, committed)
            self._check_newer_leaders_hold(core.term, committed)
            self._check_commit_durable(node)
            if self.faults.membership_race:
                self._maybe_race_membership(core, node.last_commit)
        node.last_commit, node.last_term = core.commit_index, core.term
        if core.role is Role.LEADER and node.was_leader_in != core.term:
            node.was_leader_in = core.term
            node.led_last_index = -1
            self._trace(node.id, "leader", term=core.term)
            self.checker.on_leader(node.id, core.term)
            if self.faults.crash and self.rng.random() < 0.1:
                # Kill fresh leaders now and then: old-term entries are most at risk then.
                delay = self.rng.randrange(1, 3 * node.tick_interval)
                self._schedule(delay, "crash", node.id, node.incarnation, "new-leader")
            first = core.log.first_index()
            term_at = {Index(i): core.log.term_or_none(Index(i)) for i in range(first, core.log.last_index() + 1)}
            self.checker.check_leader_completeness(node.id, core.term, term_at, first)

    def _check_commit_durable(self, leader: SimNode) -> None:
        """A committed entry must be in every log that could still win an election.

        A voter lacking the entry could win if a majority of voters hold (durably)
        logs no more up to date than its own. Each voter is judged twice: as it is now
        (if up) and as a crash now would leave it (its durable log), whether it is up
        or down. Correct Raft never allows such a candidate; a commit by counting an
        old-term entry does (Raft figure 8), long before the rare schedule that
        actually overwrites it comes along.
        """
        core = leader.core
        assert core is not None
        index = core.commit_index
        term = core.log.term_or_none(index)
        voters = core.membership.voters
        if any(e.kind is EntryKind.CONFIG for e in core.log.unstable) or core.applied_index < index - 50:
            return  # skip while membership may be in flux or the leader's view is far behind
        durable = {n: self.nodes[n].storage.durable_last() for n in sorted(voters) if n in self.nodes}
        majority = len(voters) // 2 + 1
        for node_id in sorted(durable):
            node = self.nodes[node_id]
            storage = node.storage
            states: list[tuple[tuple[int, int], bool]] = []
            d_index, d_term = durable[node_id]
            holds = index < storage.durable_first_index() or storage.durable_term(index) == term
            states.append(((d_term, d_index), holds))
            if node.core is not None:
                log = node.core.log
                holds_now = index < log.first_index() or log.term_or_none(index) == term
                states.append(((log.last_term(), log.last_index()), holds_now))
            for last, holds_entry in states:
                if holds_entry:
                    continue
                supporters = sum(1 for (i, t) in durable.values() if (t, i) <= last)
                if supporters >= majority:
                    raise InvariantViolation(
                        "commit-durability",
                        f"leader {leader.id} committed index {index} (term {term}) but node {node_id} "
                        f"lacks it and could still be elected",
                    )

    def _check_newer_leaders_hold(self, term: Term, entries: dict[Index, Term | None]) -> None:
        """Entries a stale leader commits late must already be in every newer leader's log."""
        for node in self.nodes.values():
            core = node.core
            if core is None or core.role is not Role.LEADER or core.term <= term:
                continue
            first = core.log.first_index()
            for index, entry_term in entries.items():
                if index >= first and core.log.term_or_none(index) != entry_term:
                    raise InvariantViolation(
                        "leader-completeness",
                        f"leader {node.id} of term {core.term} lacks entry {index} committed in term {term}",
                    )

    def _apply(self, node: SimNode, entry: Entry) -> None:
        last = node.applied[-1][0] if node.applied else node.storage.snapshot().meta.index
        if entry.index != last + 1:
            raise InvariantViolation("apply-order", f"node {node.id} applied {entry.index} after {last}")
        self.checker.on_applied(node.id, entry)
        node.applied.append((entry.index, entry.term, entry.kind, entry.payload))
        if entry.kind is EntryKind.DATA:
            if entry.payload in node.applied_payloads:
                raise InvariantViolation("exactly-once", f"node {node.id} applied {entry.payload!r} twice")
            node.applied_payloads.add(entry.payload)
        self._resolve_proposals(node, entry)

    def _resolve_proposals(self, node: SimNode, entry: Entry) -> None:
        proposal = self.proposals.get(entry.payload) if entry.kind is EntryKind.DATA else None
        if proposal is not None and proposal.node == node.id and proposal.index == entry.index:
            proposal.status = "acked"
            self._trace(node.id, "acked", payload=entry.payload, index=entry.index)

    def _check_read(self, node: SimNode, index: Index, context: bytes) -> None:
        required = self._read_requirements.pop(context, None)
        if required is None:
            return
        self.reads_checked += 1
        if index < required:
            raise InvariantViolation(
                "linearizable-read", f"node {node.id} read at {index} after index {required} was acknowledged"
            )

    def _send(self, message: Message) -> None:
        if message.type is MessageType.VOTE_RESPONSE and not message.reject:
            self.checker.on_vote_sent(message.source, message.term, message.target)
        delays = self.network.deliveries(message.source, message.target)
        for delay in delays:
            self._schedule(delay, "deliver", message)
        if not delays and message.type is MessageType.SNAPSHOT:
            # A real transport learns that a snapshot transfer failed, and says so.
            self._schedule(self.rng.randrange(1, 50), "report", message.source, "snapshot_failed", message.target)
        elif not delays and (message.source, message.target) in self.network.blocked and self.rng.random() < 0.1:
            self._schedule(1, "report", message.source, "unreachable", message.target)

    def _on_report(self, node_id: NodeId, kind: str, target: NodeId) -> None:
        node = self.nodes[node_id]
        if node.up:
            self._enqueue(node, kind, target)

    # ------------------------------------------------------------------ helpers

    def _network_faults(self) -> NetworkFaults:
        faults = self.faults
        return NetworkFaults(
            delay_min=1,
            delay_jitter=self.rng.randrange(10, 60) if faults.reorder else 2,
            loss_rate=self.rng.choice([0.01, 0.05, 0.2]) if faults.loss else 0.0,
            duplicate_rate=self.rng.choice([0.01, 0.05]) if faults.duplicate else 0.0,
        )

    def _next_id(self) -> int:
        self._payload_counter += 1
        return self._payload_counter

    def _acked_high_index(self) -> int:
        acked = [p.index for p in self.proposals.values() if p.status == "acked"]
        return max(acked, default=0)

    def _current_leader(self) -> SimNode | None:
        leaders = [
            n for n in self.nodes.values()
            if n.up and n.core is not None and n.core.role is Role.LEADER and self.now >= n.paused_until
        ]
        if not leaders:
            return None
        return max(leaders, key=lambda n: n.core.term if n.core else 0)

    def _check_log_matching(self) -> None:
        logs: dict[NodeId, dict[Index, tuple[Term, bytes]]] = {}
        for node in self.nodes.values():
            if node.core is None:
                continue
            log = node.core.log
            entries = log.slice(log.first_index(), Index(log.last_index() + 1), 1 << 60)
            logs[node.id] = {e.index: (e.term, e.payload) for e in entries}
        SafetyChecker.check_log_matching(logs)

    def _final_checks(self) -> None:
        if self.final_applied_time < 0:
            raise InvariantViolation("liveness", "the final proposal was never applied")
        leader = self.final_leader
        assert leader is not None and leader.core is not None
        acked = [payload for payload, p in self.proposals.items() if p.status == "acked"]
        for member in sorted(leader.core.membership.members):
            applied = self.nodes[member].applied_payloads
            missing = [payload for payload in acked if payload not in applied]
            if missing:
                raise InvariantViolation(
                    "acknowledged-lost", f"node {member} lacks acknowledged {missing[:3]}"
                )
        for payload, proposal in self.proposals.items():
            if proposal.status == "pending" and proposal.node == leader.id and proposal.term == leader.core.term:
                raise InvariantViolation("liveness", f"proposal {payload!r} of the final leader never resolved")

    def _result(self) -> SimResult:
        return SimResult(
            seed=self.seed,
            nodes=self.options.nodes,
            faults=self.faults.names()
            + (["pre_vote"] if self.pre_vote else [])
            + (["check_quorum"] if self.check_quorum else []),
            events=self.events,
            time=self.now,
            acked=sum(1 for p in self.proposals.values() if p.status == "acked"),
            leaders_elected=len(self.checker.leaders),
            heal_to_leader_ticks=(self.leader_after_heal_time - self.heal_time) // TICK_INTERVAL,
            heal_to_commit_ticks=(self.final_applied_time - self.heal_time) // TICK_INTERVAL,
            crashes=self.crashes,
            messages_sent=self.network.sent,
            reads_checked=self.reads_checked,
        )


def run_seed(seed: int, options: SimOptions | None = None) -> SimResult:
    """Run one seed; raises `InvariantViolation` (or AssertionError from the core) on failure."""
    opts = options or SimOptions()
    if options is None:
        opts.nodes = random.Random(seed ^ 0x5EED).choice([3, 3, 5])
    return Simulation(seed, opts).run()


class SimNodeIO:
    """One node's side of the production Ready processor: its `ReadyHost` (the steps land
    in the simulation's storage and network, under its checks) and its `Persistence`
    (the seed's disk faults decide when a write becomes durable)."""

    lazy_commit = True  # as a node's flusher: a commit-only write rides with the next sync

    def __init__(self, simulation: Simulation, node: SimNode) -> None:
        self.sim = simulation
        self.node = node
        self.ready: Ready | None = None  # the Ready under way

    # -- ReadyHost

    def send_message(self, message: Message) -> None:
        self.sim._send(message)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.node.storage.apply_snapshot(snapshot)
        self.sim._restore_state_machine(self.node, snapshot)

    def append_entries(self, entries: tuple[Entry, ...]) -> None:
        node = self.node
        core = node.core
        assert core is not None
        leading = core.role is Role.LEADER
        if leading and node.led_last_index >= 0 and node.was_leader_in == core.term:
            if entries[0].index != node.led_last_index + 1:
                raise InvariantViolation(
                    "leader-append-only", f"leader {node.id} rewrote its log from {entries[0].index}"
                )
        self.sim.checker.on_entries_written(node.id, entries)
        node.storage.append(entries)
        if leading:
            node.led_last_index = node.storage.last_index()

    def store_hard_state(self, hard_state: HardState) -> None:
        self.node.storage.set_hard_state(hard_state)

    def entries_durable(self, index: Index) -> None:
        pass  # no acks=leader writers here

    def apply_committed(self, entries: Iterator[tuple[Entry, Membership]]) -> None:
        for entry, _ in entries:
            self.sim._apply(self.node, entry)

    def hand_over_reads(self, read_states: tuple[ReadState, ...]) -> None:
        for read in read_states:
            self.sim._check_read(self.node, read.index, read.context)

    # -- Persistence

    def may_persist_later(self, ready: Ready) -> bool:
        return self.sim.faults.leader_writes_async and self.sim.rng.random() < 0.7

    def persist_lazily(self) -> None:
        pass  # durable with the next sync; a crash before it loses only the commit index

    def persist_later(self, ready: Ready) -> None:
        sim, node = self.sim, self.node
        last = ready.entries[-1]
        delay = sim.rng.randrange(1, 40 if sim.faults.slow_disk else 12)
        sim._schedule(delay, "leader_persisted", node.id, node.incarnation, last.index, last.term)
        if sim.faults.crash_mid_persist and sim.rng.random() < 0.03:
            sim._schedule(sim.rng.randrange(delay + 1), "crash", node.id, node.incarnation, "mid-persist")

    def persist_now(self, ready: Ready) -> int | None:
        """Durable at once (None), or after a delay the processor waits for, during which
        a crash loses the write (often while a vote is being written)."""
        sim, node = self.sim, self.node
        faults = sim.faults
        delay = 0
        if (ready.must_sync or ready.persisted_messages) and (faults.slow_disk or faults.crash_mid_persist):
            delay = sim.rng.randrange(1, 30 if faults.slow_disk else 6)
        if not delay:
            node.storage.sync()
            return None
        if faults.crash_mid_persist and sim.rng.random() < sim._mid_persist_crash_rate(ready):
            sim._schedule(sim.rng.randrange(delay + 1), "crash", node.id, node.incarnation, "mid-persist")
        return delay

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        pass
