"""The node as its edge sees it: `NodeApi`, and the few types the edge speaks in.

The HTTP layer (multiraft/http/) imports this module and `multiraft.metadata`, nothing
else of the node: no runtime, store or state machine crosses this line, only
read-only snapshots (`GroupStatus`, `PartitionStatus`, the catalog) and the entry
points for produce, consume, consumer offsets and admin, with typed results
(`ProduceResult`, `ConsumeResult`) and typed errors (`multiraft.errors`).

`NodeApi` is a thin facade the composition root (multiraft/node/node.py) builds over
the node's services; it holds no state of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import (
    ASSIGNORS,
    CreateInstance,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    Subscription,
)
from multiraft.consumer_groups import commands as group_limits
from multiraft.consumer_groups.resets import (
    RESET_PARTITIONS_MAX,
    RESET_TOPICS_MAX,
    RESET_VALUE_RANGES,
    ResetRequest,
    ResetStrategy,
    ResetTopic,
)
from multiraft.metadata.catalog import Catalog
from multiraft.node import debug_views, decommission, draining, move_throttle
from multiraft.node.acks import Acks
from multiraft.node.admission import SIGNATURE_HEADER, TIMESTAMP_HEADER
from multiraft.node.admission import verify as verify_admission
from multiraft.node.batch_checks import validate_off_loop
from multiraft.node.config import NodeConfig
from multiraft.node.consumer_instances import POLL_RECORDS_MAX
from multiraft.node.controller import Readiness
from multiraft.node.forwarding import PartitionBatch
from multiraft.node.group_admin import METRICS_GROUP_PARTITIONS_MAX, GroupMetrics
from multiraft.node.group_reads import RESETS, MemberFetch, PartitionFetch
from multiraft.node.mirror_trees import LEVEL_MAX as TREE_LEVEL_MAX
from multiraft.node.mirror_trees import POSITIONS_MAX as TREE_POSITIONS_MAX
from multiraft.node.move_throttle import REPLICA_MOVE_BYTES_PER_S_MAX
from multiraft.node.move_throttle import SETTING as MOVE_THROTTLE_SETTING
from multiraft.node.partition_ops import MAX_BYTES_MAX, MAX_RECORDS_MAX, WAIT_MS_MAX, ConsumeResult
from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from multiraft.node.registry import METADATA_GROUP
from multiraft.node.scrubber import PARTITIONS_PER_CALL, VerifyReport
from multiraft.node.tree_sidecars import SidecarCounts
from multiraft.runtime.group import GroupStatus
from multiraft.state.consumer_offsets import GROUP_NAME_PATTERN, OffsetCommit
from multiraft.state.partitioner import partition_for_key, partitions_for_keys
from multiraft.transport.inbound_admission import Refusal as TransportRefusal
from multiraft.transport.transport_config import TransportStats
from raftlog.messages import Role
from raftlog.types import GroupId, NodeId
from storage.batch import BatchHeader

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.consumer_instances import ConsumerInstances
    from multiraft.node.controller import Controller
    from multiraft.node.features import FeatureGate
    from multiraft.node.group_admin import GroupAdmin
    from multiraft.node.group_coordinator import GroupCoordinator
    from multiraft.node.group_reads import GroupReads
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.mirror_links import MirrorLinks
    from multiraft.node.mirror_trees import PartitionTrees
    from multiraft.node.mirror_verify import LinkVerifyCounts
    from multiraft.node.move_throttle import MoveThrottle
    from multiraft.node.partition_ops import PartitionOps
    from multiraft.node.produce import Produce
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing
    from multiraft.node.scheduled_scrubs import ScheduledScrubs
    from multiraft.node.scrub_schedule import ScrubResults
    from multiraft.node.scrubber import Scrubber
    from multiraft.node.ticker import Ticker
    from multiraft.node.unsafe import ChaosHooks
    from multiraft.runtime.histograms import NodeLatencies
    from multiraft.transport.transport import Transport

__all__ = [
    "ASSIGNORS",
    "GROUP_NAME_PATTERN",
    "MAX_BYTES_MAX",
    "MAX_RECORDS_MAX",
    "METRICS_GROUP_PARTITIONS_MAX",
    "MOVE_THROTTLE_SETTING",
    "NO_OFFSET",
    "PARTITIONS_PER_CALL",
    "POLL_RECORDS_MAX",
    "REPLICA_MOVE_BYTES_PER_S_MAX",
    "RESETS",
    "RESET_PARTITIONS_MAX",
    "RESET_TOPICS_MAX",
    "RESET_VALUE_RANGES",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TREE_LEVEL_MAX",
    "TREE_POSITIONS_MAX",
    "WAIT_MS_MAX",
    "Acks",
    "ConsumeResult",
    "CreateInstance",
    "GroupMetrics",
    "GroupStatus",
    "Heartbeat",
    "JoinGroup",
    "LeaveGroup",
    "MemberFetch",
    "NodeApi",
    "NodeConfig",
    "OffsetCommit",
    "PartitionBatch",
    "PartitionFetch",
    "PartitionStatus",
    "ProduceResult",
    "Readiness",
    "ResetRequest",
    "ResetStrategy",
    "ResetTopic",
    "ScrubCounts",
    "Subscription",
    "TransportRefusal",
    "TransportStats",
    "VerifyReport",
    "group_limits",
    "partition_for_key",
    "partitions_for_keys",
    "validate_off_loop",
    "verify_admission",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStatus:
    """A partition replica hosted here, as the edge may see it (a snapshot)."""

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrubCounts:
    partitions_verified: int
    ranges_found: int
    repairs_started: int
    bytes_hashed: int
    sidecars: SidecarCounts  # closed segments' tree sidecars (multiraft/node/tree_sidecars.py)
    scheduled: ScrubResults  # scheduled scrubs led here (multiraft/node/scheduled_scrubs.py)
    scheduled_partitions: int  # partitions led here with a due time (0: scheduled scrubs off)
    paced_bytes_hashed: int  # read within the scrub byte rate here: scheduled scrubs led and served


class NodeApi:
    def __init__(self, *, config: NodeConfig, hooks: ChaosHooks, registry: GroupRegistry, catalog: CatalogHolder,
                 routing: Routing, metadata: MetadataOps, controller: Controller, produce: Produce,
                 reads: PartitionOps, groups: GroupCoordinator, group_reads: GroupReads,
                 group_admin: GroupAdmin, instances: ConsumerInstances, ticker: Ticker, transport: Transport,
                 latencies: NodeLatencies,
                 balance_leaders: Callable[[], Awaitable[dict[int, int]]], scrubber: Scrubber,
                 throttle: MoveThrottle, mirrors: MirrorLinks, trees: PartitionTrees,
                 scheduled_scrubs: ScheduledScrubs, features: FeatureGate,
                 catchup_counts: Callable[[], dict[str, int]] = dict) -> None:
        self.id = config.node_id
        self.config = config
        self.hooks = hooks  # read at start (routes served, health), never on a hot path
        self.latencies = latencies
        self._registry = registry
        self._catalog = catalog
        self._routing = routing
        self._metadata = metadata
        self._controller = controller
        self._produce = produce
        self._reads = reads
        self._ticker = ticker
        self._transport = transport
        self.balance_leaders = balance_leaders
        self._scrubber = scrubber
        self._scheduled_scrubs = scheduled_scrubs
        self._throttle = throttle
        self._catchup_counts = catchup_counts
        # Entry points, as the services define them.
        self.consume = reads.consume
        self.commit_offsets = reads.commit_offsets
        self.fetch_offsets = reads.fetch_offsets
        # Consumer groups (multiraft/node/group_coordinator.py, group_reads.py).
        self.group_command = groups.command
        self.list_groups = groups.list_groups
        self.group_fetch = group_reads.fetch
        self.group_commit = group_reads.commit
        self.describe_group = group_reads.describe
        self.delete_group = group_reads.delete_group  # refused while the group has members
        self.reset_group_offsets = group_admin.reset_offsets  # refused while the group has members
        self.group_metrics = group_admin.metrics
        self.partition_bounds = group_reads.bounds
        # Confluent REST v2 consumer instances (multiraft/node/consumer_instances.py).
        self.instances = instances
        self.require_leadership = produce.require_leadership
        self.produce_spread = produce.produce_spread
        self.propose_metadata = metadata.propose
        self.create_topic = metadata.create_topic
        self.delete_topic = metadata.delete_topic
        self.alter_topic_config = metadata.alter_topic_config
        self.create_partitions = metadata.create_partitions  # issue 25: more partitions, drain
        self.set_drained = metadata.set_drained
        self.set_decommissioning = metadata.set_decommissioning
        self.allocate_producer_id = metadata.allocate_producer_id
        self.sync_catalog = metadata.sync_catalog
        self.wait_for_topic = metadata.wait_for_topic
        self.readiness = controller.readiness
        self.promote_node = controller.promote  # a metadata learner to voter (metadata_voters.py)
        self.mirrors = mirrors  # mirror links: admin, status, verify (multiraft/node/mirror_links.py, docs/mirror.md)
        self.partition_tree = trees.tree  # a source's tree for a mirror's full sync (multiraft/node/mirror_trees.py)
        self.partition_tree_nodes = trees.nodes
        self.features = features  # the cluster's feature level (multiraft/node/features.py)

    # ------------------------------------------------------------------ snapshots

    @property
    def catalog(self) -> Catalog:
        """This node's catalog as applied now (read it, never keep it: a restore replaces it)."""
        return self._catalog.catalog

    @property
    def registered(self) -> bool:
        return self._controller.registered.is_set()

    def group_subscription(self, group: str, member_id: str) -> Subscription | None:
        """A member's subscription in this node's copy of group 0 (None: not there, or not yet)."""
        state = self._catalog.groups.groups.get(group)
        member = state.members.get(member_id) if state is not None else None
        return member.subscription if member is not None else None

    def partition_group(self, topic: str, partition: int) -> GroupId:
        """The group of a topic's partition (UnknownTopic when there is none)."""
        return self._catalog.partition_group(topic, partition)

    def group_status(self, group_id: GroupId) -> GroupStatus | None:
        return self._registry.status(group_id)

    def group_statuses(self) -> list[GroupStatus]:
        return self._registry.statuses()

    def partition_status(self, group_id: GroupId) -> PartitionStatus | None:
        """The partition replica's offsets here (None: no partition replica here)."""
        machine, store = self._registry.partitions.get(group_id), self._registry.stores.get(group_id)
        if machine is None or store is None:
            return None
        state = machine.state
        return PartitionStatus(topic=state.topic, partition=state.partition,
                               log_start_offset=int(store.log_start_offset),
                               high_watermark=int(state.high_watermark), log_end_offset=int(store.log_end_offset))

    def leader_of(self, group_id: GroupId) -> int:
        return self._routing.leader_of(group_id)

    def partitions_led(self, node_id: NodeId) -> int:
        """Partitions `node_id` leads as this node sees it (a drain's progress)."""
        return draining.partitions_led(self._routing, node_id)

    def decommission_progress(self, node_id: NodeId) -> decommission.Progress:
        """Where `node_id`'s decommission stands as this node sees it (its catalog, and its
        copy of the metadata group's membership); why it waits, when this node is the
        controller."""
        metadata = self._registry.groups.get(METADATA_GROUP)
        membership = metadata.core.membership if metadata is not None else None
        waiting = self._controller.decommission_waiting if metadata is not None and metadata.core.role is Role.LEADER \
            else ""
        return decommission.progress(self._catalog.catalog, membership, node_id, waiting)

    def metadata_membership(self) -> tuple[list[int], list[int]]:
        """(voters, learners) of the metadata group as this node's replica has applied them."""
        metadata = self._registry.groups.get(METADATA_GROUP)
        if metadata is None:
            return [], []
        membership = metadata.core.membership
        return sorted(membership.voters), sorted(membership.learners)

    def effective_setting(self, key: str) -> int:
        """What this node uses for a cluster setting now (the cluster's, else its own)."""
        assert key == move_throttle.SETTING, key
        return move_throttle.effective_rate(self._catalog.catalog.cluster_config, self.config.replica_move_bytes_per_s)

    def quiesced_groups(self) -> int:
        return self._registry.quiesced()

    @property
    def move_throttle_counts(self) -> tuple[int, int, int]:
        """The move throttle's bytes sent, appends dropped, appends waiting."""
        return self._throttle.sent_bytes, self._throttle.dropped, self._throttle.queued

    @property
    def catchup_counts(self) -> dict[str, int]:
        """Far-horizon catch-up here: transfers led (started, installed, failed, bytes_sent)
        and installs taken (follower_installed, follower_failed, bytes_received)."""
        return self._catchup_counts()

    @property
    def peer_silences(self) -> int:
        return self._ticker.peer_silences

    @property
    def groups_back_to_quiet(self) -> int:
        return self._ticker.groups_back_to_quiet

    def mirror_pulls(self) -> list[dict[str, Any]]:
        """The mirror partitions this node pulls (it leads them): their state, lag, bytes."""
        return [status.view() for status in self.mirrors.pulls.status.values()]

    def mirror_verify_counts(self) -> dict[str, LinkVerifyCounts]:
        """What the full syncs this node ran (as sink leader) found, by link (docs/mirror.md)."""
        return self.mirrors.verifier.counts()

    def mirror_truncated_resyncs(self) -> dict[str, int]:
        """Mirror partitions this node resynced because their source truncated past them, by
        link (docs/mirror.md "The source truncated past a mirror")."""
        return self.mirrors.pulls.truncated.counts()

    def transport_stats(self) -> TransportStats:
        return self._transport.stats()

    def debug_groups(self) -> list[dict[str, Any]]:
        """Every hosted group's Raft and log state (the chaos runner's debug route)."""
        return [debug_views.group_view(self._registry, g) for g in sorted(self._registry.groups)]

    async def debug_digest(self, group_id: GroupId, upto: int | None, start: int = 1) -> dict[str, Any]:
        return await debug_views.log_digest(self._registry, self.id, group_id, upto, start)

    @property
    def scrub_counts(self) -> ScrubCounts:
        """What the scrubber verified and found here (docs/mirror.md)."""
        scrubber = self._scrubber
        return ScrubCounts(partitions_verified=scrubber.partitions_verified, ranges_found=scrubber.ranges_found,
                           repairs_started=scrubber.repairs_started, bytes_hashed=scrubber.trees.bytes_hashed,
                           sidecars=dataclasses.replace(scrubber.trees.sidecars.counts),
                           scheduled=self._scheduled_scrubs.results,
                           scheduled_partitions=len(self._scheduled_scrubs.schedule or ()),
                           paced_bytes_hashed=scrubber.trees.pace.bytes)

    def scrub_status(self) -> dict[str, Any]:
        """This node's scheduled scrubs: the schedule, the counts, the latest verdicts that were
        not identical (GET /v1/admin/scrub; docs/mirror.md "Scheduled scrubs")."""
        return {"node": int(self.id), **self._scheduled_scrubs.status()}

    # ------------------------------------------------------------------ entry points

    async def verify(self, topics: list[str] | None, start: int, deep: bool = True) -> VerifyReport:
        """Compare partitions' replicas with their leaders (the scrubber, multiraft/node/scrubber.py);
        `deep` (the default) reads every segment again, false takes closed segments' tree sidecars."""
        return await self._scrubber.verify(topics, start, deep=deep)

    async def produce(self, topic: str, partition: int, batch: bytes, acks: Acks | str = Acks.QUORUM,
                      header: BatchHeader | None = None) -> ProduceResult:
        return await self._produce.produce(topic, partition, batch, acks, header)

    async def add_node(self, node_id: NodeId, raft_addr: str, http_addr: str, rack: str | None) -> dict[str, str]:
        return await self._controller.add_node(node_id, raft_addr, http_addr, rack)
