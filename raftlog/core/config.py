"""Configuration of one Raft replica, validated when it is built.

Every limit is a named field: a queue, message or read that has no bound is a
bug waiting for a burst. Defaults follow etcd-io/raft's proven values, scaled for
a log service whose entries are whole record batches (hundreds of KiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.types import NO_NODE, Index, NodeId

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    node_id: NodeId
    # Time enters only as ticks; the node decides how long a tick is (100 ms by default).
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    # Flow control toward each follower (etcd: MaxSizePerMsg, MaxInflightMsgs, MaxInflightBytes).
    message_bytes_max: int = 1 * MIB
    inflight_messages_max: int = 256
    inflight_bytes_max: int = 64 * MIB
    # Toward a learner (a copy being made), a smaller window: its appends may wait in the
    # driver's move throttle (multiraft/node/move_throttle.py), and a full window of every
    # moving copy must fit what that throttle holds, or the overflow is dropped and sent
    # again. Promoted to voter, the learner gets the full window.
    learner_inflight_messages_max: int = 4
    # Proposals beyond this many uncommitted bytes are refused (backpressure, not a queue).
    uncommitted_bytes_max: int = 128 * MIB
    # Bound on what one Ready hands to the state machine.
    committed_bytes_per_ready_max: int = 16 * MIB
    # Pending linearizable reads per leader.
    pending_reads_max: int = 4096
    # A follower is in sync while it was caught up within this many ticks (Kafka's
    # replica.lag.time.max.ms, in ticks: 300 ticks of 100 ms = 30 s, Kafka's default).
    replica_lag_time_max_ticks: int = 300
    # Ticks a leader waits in the install (snapshot) state before probing again.
    snapshot_timeout_ticks: int = 50
    # Far-horizon catch-up (the driver moves whole files: `hold_for_install`): a follower
    # found at least this many entries behind when its probe succeeds gets no appends for
    # up to `far_wait_ticks`, so the driver can hold it before replay starts; 0: never.
    far_wait_lag_entries: int = 0
    far_wait_ticks: int = 5
    # A learner (a copy being made, from nothing) found behind at all waits the same way:
    # the driver also installs by bytes (far_catchup_lag_bytes), which the core cannot
    # see, and appends sent before its hold are thrown away by the install (a new copy of
    # 1 MiB batches got about 19 MiB of them through the move throttle first). The driver
    # ends a wait it will not turn into a hold (`end_far_wait`), so a small copy replays
    # at once.
    far_wait_learners: bool = False
    # Index the driver's state machine has already applied (restart point).
    applied: Index = Index(0)
    # Whom a replica in repair tells what it holds while it knows no leader, besides the
    # voters of its membership: the group's replicas as the driver knows them. A log cut
    # at damage before its configuration entries leaves the core no membership at all.
    repair_contacts: frozenset[NodeId] = frozenset()

    def __post_init__(self) -> None:
        if self.node_id == NO_NODE or self.node_id < 0:
            raise ValueError("node_id must be a positive integer")
        if self.heartbeat_interval_ticks < 1:
            raise ValueError("heartbeat_interval_ticks must be at least 1")
        if self.election_timeout_ticks <= self.heartbeat_interval_ticks:
            raise ValueError("election_timeout_ticks must exceed heartbeat_interval_ticks")
        for name in (
            "message_bytes_max",
            "inflight_messages_max",
            "inflight_bytes_max",
            "learner_inflight_messages_max",
            "uncommitted_bytes_max",
            "committed_bytes_per_ready_max",
            "pending_reads_max",
            "replica_lag_time_max_ticks",
            "snapshot_timeout_ticks",
            "far_wait_ticks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.far_wait_lag_entries < 0:
            raise ValueError("far_wait_lag_entries must not be negative")
        if self.applied < 0:
            raise ValueError("applied must not be negative")
        if any(node == NO_NODE or node < 0 for node in self.repair_contacts):
            raise ValueError("repair_contacts must be positive node ids")
