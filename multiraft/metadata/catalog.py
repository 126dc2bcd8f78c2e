"""The catalog: the state machine of the metadata group (group 0).

Every node applies the same committed commands in the same order and so holds
the same catalog: nodes, topics with their partitions (group id, replicas,
replicas being moved), the next free group id and producer id, cluster config,
bearer tokens (as digests, multiraft/metadata/auth.py) and the finalized feature
level (multiraft/metadata/features.py). `apply` is pure and
deterministic: no clock, no randomness, no dict-order surprises (ids only grow).

A command that fails validation on apply is still a committed entry: the catalog
does not change, the applied index advances, and the result carries the error for
the proposer's waiter. The controller calls `validate` before proposing, so such
failures only happen when two proposals race (two creates of one topic).

Group ids are never reused: group 0 is the metadata group, partitions get 1, 2,
3, ... in creation order, and a deleted topic's ids stay retired, so a stale
replica of a deleted partition can never be mistaken for a new one.
"""

from __future__ import annotations

from dataclasses import replace

from multiraft.errors import (
    ClusterTooSmall,
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    MirrorLinkExists,
    MirrorLinkInUse,
    NotAMirror,
    ResourceExhausted,
    TooManyMirrorLinks,
    TopicExists,
    UnknownMirrorLink,
    UnknownNode,
    UnknownToken,
    UnknownTopic,
)
from multiraft.metadata.catalog_records import (
    FIRST_PARTITION_GROUP,
    ID_MAX,
    METADATA_GROUP,
    CatalogResult,
    LocalGroup,
    NodeInfo,
    PartitionInfo,
    ProducerIdBlock,
    TokenInfo,
    TopicInfo,
)
from multiraft.metadata.catalog_snapshot import decode_catalog, encode_catalog
from multiraft.metadata.checks import altered_config
from multiraft.metadata.commands import (
    CONFIG_ENTRIES_MAX,
    AllocateProducerIds,
    AlterTopicConfig,
    Command,
    ConfigValue,
    CreateMirrorLink,
    CreateMirrorTopic,
    CreatePartitions,
    CreateTopic,
    DeleteMirrorLink,
    DeleteToken,
    DeleteTopic,
    FinalizeFeatureLevel,
    NodeStatus,
    PromoteMirrorTopic,
    PutToken,
    RegisterNode,
    ReplaceReplica,
    ReplicaLeft,
    ResyncMirrorPartition,
    SetClusterConfig,
    SetMirrorLinkPolicy,
    SetMirrorLinkState,
    SetNodeDecommissioning,
    SetNodeDrained,
    SetNodeStatus,
)
from multiraft.metadata.features import check_finalize
from multiraft.metadata.mirror_commands import (
    MIRROR_LINKS_MAX,
    GrowMirrorTopic,
    MirrorCommand,
    MirrorLink,
)
from multiraft.metadata.mirror_growth import check_growable, check_mirror_growth, grown_mirror
from raftlog.errors import ClientError, MembershipChangeInProgress
from raftlog.types import GroupId, Index, NodeId

__all__ = [
    "FIRST_PARTITION_GROUP", "ID_MAX", "METADATA_GROUP", "Catalog", "CatalogResult", "LocalGroup",
    "NodeInfo", "PartitionInfo", "ProducerIdBlock", "TokenInfo", "TopicInfo", "groups_for_node",
]

class Catalog:
    """Applied metadata. Invariants: ids below `next_group_id` / `next_producer_id`
    were handed out; every partition's group id is unique and >= 1."""

    def __init__(self) -> None:
        self.applied_index = Index(0)
        self.nodes: dict[NodeId, NodeInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.next_group_id = FIRST_PARTITION_GROUP
        self.next_producer_id = 0
        self.cluster_config: dict[str, ConfigValue] = {}
        self.tokens: dict[str, TokenInfo] = {}
        self._token_digests: dict[str, TokenInfo] = {}
        self.mirror_links: dict[str, MirrorLink] = {}
        self.feature_level = 0  # the finalized level: only raised (multiraft/metadata/features.py)

    # ---- validation (before proposing, and again on apply) -----------------

    def validate(self, command: Command) -> None:
        """Raise the typed error `command` would meet against this catalog."""
        if (isinstance(command, SetNodeStatus | SetNodeDrained | SetNodeDecommissioning)
                and command.node_id not in self.nodes):
            raise UnknownNode(f"node {command.node_id} is not registered")
        if isinstance(command, SetNodeDrained) and command.drained:
            self._validate_drain(command.node_id)
        if isinstance(command, SetNodeDecommissioning) and command.decommissioning:
            self._validate_decommission(command.node_id)
        if isinstance(command, CreatePartitions):
            self._validate_partitions(command)
        if isinstance(command, CreateTopic):
            self._validate_create(command)
        if isinstance(command, DeleteTopic) and command.name not in self.topics:
            raise UnknownTopic(f"topic {command.name!r} does not exist")
        if isinstance(command, AllocateProducerIds):
            if self.next_producer_id + command.count - 1 > ID_MAX:
                raise ResourceExhausted("producer ids are exhausted")
        if isinstance(command, ReplaceReplica):
            partition = self.partition_info(command.topic, command.partition)
            if command.old not in partition.replicas:
                raise InvalidReplicaAssignment(f"node {command.old} holds no replica of {command.topic}/"
                                               f"{command.partition}")
            if partition.leaving:
                # One move per partition at a time: the controller waits for a copy to
                # leave before it names the next, but two controllers (a metadata leader
                # change between a proposal and its apply) could each name one; a second
                # would change the voters while the first's learner is not yet caught up.
                raise InvalidReplicaAssignment(
                    f"{command.topic}/{command.partition} is still moving: node(s) "
                    f"{', '.join(map(str, partition.leaving))} leaving")
            if command.new in partition.hosts:
                raise InvalidReplicaAssignment(f"node {command.new} already holds a copy of {command.topic}/"
                                               f"{command.partition}")
            if command.new not in self.nodes:
                raise UnknownNode(f"node {command.new} is not registered")
            if self.nodes[command.new].decommissioning:
                raise InvalidReplicaAssignment(f"node {command.new} is being decommissioned")
        if isinstance(command, FinalizeFeatureLevel):
            check_finalize(self.feature_level, command)
        if isinstance(command, DeleteToken) and command.name not in self.tokens:
            raise UnknownToken(f"token {command.name!r} does not exist")
        if isinstance(command, PutToken):
            holder = self._token_digests.get(command.digest)
            if holder is not None and holder.name != command.name:
                raise InvalidRequest("that token digest belongs to another token")
        if isinstance(command, AlterTopicConfig):
            if len(altered_config(self.topic(command.name).config, command.changes)) > CONFIG_ENTRIES_MAX:
                raise InvalidConfig(f"a topic has at most {CONFIG_ENTRIES_MAX} config entries")
        if isinstance(command, MirrorCommand):
            self._validate_mirror(command)
        if isinstance(command, ReplicaLeft):
            partition = self.partition_info(command.topic, command.partition)
            if command.node not in partition.leaving:
                raise InvalidReplicaAssignment(f"node {command.node} is not leaving {command.topic}/"
                                               f"{command.partition}")

    def _validate_mirror(self, command: MirrorCommand) -> None:
        if isinstance(command, CreateMirrorLink):
            if command.name in self.mirror_links:
                raise MirrorLinkExists(f"mirror link {command.name!r} already exists")
            if len(self.mirror_links) >= MIRROR_LINKS_MAX:
                raise TooManyMirrorLinks(f"a cluster has at most {MIRROR_LINKS_MAX} mirror links")
        elif isinstance(command, PromoteMirrorTopic | ResyncMirrorPartition):
            if not self.topic(command.name).is_mirror:
                raise NotAMirror(f"topic {command.name!r} is not a mirror (or was promoted already)")
            if isinstance(command, ResyncMirrorPartition) and self.partition_info(
                    command.name, command.partition).leaving:
                raise MembershipChangeInProgress(f"{command.name}/{command.partition} is moving; resync it after")
        else:
            name = command.link if isinstance(command, CreateMirrorTopic | GrowMirrorTopic) else command.name
            if name not in self.mirror_links:
                raise UnknownMirrorLink(f"mirror link {name!r} does not exist")
        if isinstance(command, DeleteMirrorLink):
            mirrors = self.mirror_topics(command.name)
            if mirrors:
                raise MirrorLinkInUse(f"mirror link {command.name!r} still has {len(mirrors)} mirror topic(s) "
                                      f"({', '.join(mirrors[:5])}); promote or delete them first")
        if isinstance(command, CreateMirrorTopic):
            self._validate_create(_as_create(command))
        if isinstance(command, GrowMirrorTopic):
            check_mirror_growth(self.topic(command.name), command)
            self._validate_new_replicas(command.assignments)

    def mirror_topics(self, link: str) -> list[str]:
        """The mirror topics of `link`, by name."""
        return sorted(t.name for t in self.topics.values() if t.is_mirror and t.mirror_link == link)

    def _validate_create(self, command: CreateTopic) -> None:
        if command.name in self.topics:
            raise TopicExists(f"topic {command.name!r} already exists")
        if command.replication_factor > len(self.nodes):
            raise InvalidReplicationFactor(
                f"replication factor {command.replication_factor} exceeds the "
                f"{len(self.nodes)} registered nodes"
            )
        self._validate_new_replicas(command.assignments)

    def _validate_new_replicas(self, assignments: tuple[tuple[NodeId, ...], ...]) -> None:
        """New partitions' replicas: on registered nodes, and a group id left for each."""
        for replicas in assignments:
            for node_id in replicas:
                if node_id not in self.nodes:
                    raise InvalidReplicaAssignment(f"node {node_id} is not registered")
        if self.next_group_id + len(assignments) - 1 > ID_MAX:
            raise ResourceExhausted("group ids are exhausted")

    def _validate_decommission(self, node_id: NodeId) -> None:
        """Every replica of the node must have somewhere to go: the nodes left (live, not
        leaving) must be at least as many as the largest replication factor of any topic
        the node holds a copy of (a partition never holds two copies on one node)."""
        if self.nodes[node_id].decommissioning:
            return  # asked again: nothing new to check
        staying = [n for n in self.nodes.values()
                   if n.node_id != node_id and not n.decommissioning and n.status is NodeStatus.ALIVE]
        held = [t for t in self.topics.values() if any(node_id in p.replicas for p in t.partitions)]
        needed = max((len(p.replicas) for t in held for p in t.partitions), default=0)
        if len(staying) < max(needed, 1):
            raise ClusterTooSmall(
                f"decommissioning node {node_id} leaves {len(staying)} live node(s) to hold its replicas, and "
                f"its partitions need {needed} (their replication factor); add a node first")
        self._validate_drain(node_id)

    def _validate_drain(self, node_id: NodeId) -> None:
        """A drain must leave some node to lead: one registered, not drained, not dead."""
        leaders = [n for n in self.nodes.values()
                   if n.node_id != node_id and not n.leads_nothing and n.status is not NodeStatus.DEAD]
        if not leaders:
            raise InvalidRequest(f"draining node {node_id} would leave no node to lead partitions "
                                 "(every other node is drained or dead); undrain one first")

    def _validate_partitions(self, command: CreatePartitions) -> None:
        topic = self.topic(command.name)
        check_growable(topic)
        current = len(topic.partitions)
        if command.count <= current:
            raise InvalidPartitions(f"topic {command.name!r} has {current} partitions; partitions can only be "
                                    f"added, so the new count must be above {current}, got {command.count}")
        if len(command.assignments) != command.count - current:
            raise InvalidReplicaAssignment(f"growing {command.name!r} from {current} to {command.count} partitions "
                                           f"takes {command.count - current} replica lists, got "
                                           f"{len(command.assignments)}")
        if len(command.assignments[0]) != topic.replication_factor:
            raise InvalidReplicaAssignment(f"topic {command.name!r} has replication factor "
                                           f"{topic.replication_factor}")
        self._validate_new_replicas(command.assignments)

    # ---- apply ----------------------------------------------------------------

    def apply(self, index: Index, command: Command) -> CatalogResult:
        """Apply the committed command at `index`. Deterministic on every node."""
        assert index > self.applied_index, "commands apply in log order"
        try:
            self.validate(command)
        except ClientError as error:
            self.applied_index = index
            return CatalogResult(index=index, error=error)
        value = self._mutate(command)
        self.applied_index = index
        return CatalogResult(index=index, value=value)

    def skip(self, index: Index) -> None:
        """Advance past an entry that holds no command (NOOP, CONFIG)."""
        assert index > self.applied_index
        self.applied_index = index

    def _mutate(self, command: Command) -> NodeInfo | TopicInfo | ProducerIdBlock | MirrorLink | None:
        if isinstance(command, RegisterNode):
            return self._register(command)
        if isinstance(command, SetNodeStatus):
            self.nodes[command.node_id] = updated = replace(self.nodes[command.node_id], status=command.status)
            return updated
        if isinstance(command, SetNodeDrained):
            self.nodes[command.node_id] = node = replace(self.nodes[command.node_id], drained=command.drained)
            return node
        if isinstance(command, SetNodeDecommissioning):
            self.nodes[command.node_id] = node = replace(self.nodes[command.node_id],
                                                        decommissioning=command.decommissioning)
            return node
        if isinstance(command, CreatePartitions):
            return self._grow(command)
        if isinstance(command, CreateTopic):
            return self._create(command)
        if isinstance(command, MirrorCommand):
            return self._mirror(command)
        if isinstance(command, DeleteTopic):
            return self.topics.pop(command.name)
        if isinstance(command, AllocateProducerIds):
            block = ProducerIdBlock(self.next_producer_id, command.count)
            self.next_producer_id += command.count
            return block
        if isinstance(command, ReplaceReplica | ReplicaLeft):
            return self._move(command)
        if isinstance(command, PutToken | DeleteToken):
            return self._token(command)
        if isinstance(command, AlterTopicConfig):
            topic = self.topics[command.name]
            self.topics[command.name] = updated = replace(topic, config=altered_config(topic.config, command.changes))
            return updated
        if isinstance(command, FinalizeFeatureLevel):
            self.feature_level = command.level
            return None
        assert isinstance(command, SetClusterConfig), f"unknown command {command!r}"
        if command.value is None:
            self.cluster_config.pop(command.key, None)
        else:
            self.cluster_config[command.key] = command.value
        return None

    def _register(self, command: RegisterNode) -> NodeInfo:
        """Registering again (a restart, new addresses) keeps the id and its drain and
        decommission marks, and revives it: a drained node restarts drained (that is what a
        drain is for), a decommissioning one goes on leaving."""
        before = self.nodes.get(command.node_id)
        node = NodeInfo(command.node_id, command.raft_addr, command.http_addr, command.rack,
                        NodeStatus.ALIVE, before is not None and before.drained,
                        before is not None and before.decommissioning)  # fmt: skip
        self.nodes[command.node_id] = node
        return node

    def _mirror(self, command: MirrorCommand) -> MirrorLink | TopicInfo | None:
        if isinstance(command, CreateMirrorLink):
            self.mirror_links[command.name] = link = command.link()
            return link
        if isinstance(command, SetMirrorLinkState | SetMirrorLinkPolicy):
            self.mirror_links[command.name] = link = command.applied_to(self.mirror_links[command.name])
            return link
        if isinstance(command, DeleteMirrorLink):
            return self.mirror_links.pop(command.name)
        if isinstance(command, PromoteMirrorTopic):
            self.topics[command.name] = topic = replace(self.topics[command.name], mirror_promoted=True)
            return topic
        if isinstance(command, ResyncMirrorPartition):
            return self._resync(command)
        if isinstance(command, GrowMirrorTopic):
            self.topics[command.name] = topic = grown_mirror(self.topics[command.name], command, self.next_group_id)
            self.next_group_id = GroupId(self.next_group_id + len(command.assignments))
            return topic
        topic = self._create(_as_create(command))
        partitions = tuple(replace(p, start_offset=start, source_group=source) for p, start, source in zip(
            topic.partitions, command.start_offsets, command.source_groups or (None,) * len(topic.partitions),
            strict=True))
        self.topics[command.name] = topic = replace(topic, partitions=partitions, mirror_link=command.link,
                                                    mirror_partitions=len(partitions))
        return topic

    def _resync(self, command: ResyncMirrorPartition) -> TopicInfo | None:
        """A new incarnation of a mirror partition (the next group id, its log starting at
        `start_offset`, or keeping the old one's first start point and prefix): every host
        drops the old group and starts the new one (reconcile). A resync of an incarnation
        already replaced changes nothing, and its result says so (None, not the topic)."""
        topic = self.topics[command.name]
        old = topic.partitions[command.partition]
        if old.group_id != command.group_id:
            return None
        # Kept only while the partition has not moved since the old incarnation began (see
        # mirror_prefix.may_keep_prefix: its first voters are its replicas) and the voters the
        # leader saw are still its replicas (a move that ended meanwhile).
        keep = command.prefix_index and not old.initial and sorted(command.prefix_voters) == sorted(old.replicas)
        fresh = replace(old, group_id=self.next_group_id, prefix=(old.group_id, command.prefix_index,
                                                                 command.prefix_term, command.prefix_offset)) \
            if keep else replace(old, group_id=self.next_group_id, initial=(), start_offset=command.start_offset,
                                 prefix=())
        self.next_group_id = GroupId(self.next_group_id + 1)
        partitions = tuple(fresh if p.partition == command.partition else p for p in topic.partitions)
        self.topics[command.name] = topic = replace(topic, partitions=partitions)
        return topic

    def _create(self, command: CreateTopic) -> TopicInfo:
        first = self.next_group_id
        partitions = tuple(
            PartitionInfo(p, GroupId(first + p), replicas)
            for p, replicas in enumerate(command.assignments)
        )
        self.next_group_id = GroupId(first + command.partitions)
        topic = TopicInfo(command.name, command.replication_factor, dict(command.config),
                          partitions)  # fmt: skip
        self.topics[command.name] = topic
        return topic

    def _grow(self, command: CreatePartitions) -> TopicInfo:
        """New partitions get the next group ids (not contiguous with the topic's first ones:
        ids are handed out in creation order across topics, and never reused)."""
        topic = self.topics[command.name]
        first, current = self.next_group_id, len(topic.partitions)
        added = tuple(PartitionInfo(current + i, GroupId(first + i), replicas)
                      for i, replicas in enumerate(command.assignments))
        self.next_group_id = GroupId(first + len(added))
        self.topics[command.name] = updated = replace(topic, partitions=topic.partitions + added)
        return updated

    def drained_nodes(self) -> frozenset[NodeId]:
        """Nodes that lead nothing: drained, or decommissioning."""
        return frozenset(n.node_id for n in self.nodes.values() if n.leads_nothing)

    def decommissioning_nodes(self) -> frozenset[NodeId]:
        return frozenset(n.node_id for n in self.nodes.values() if n.decommissioning)

    def apply_token(self, command: PutToken | DeleteToken) -> None:
        """A token change outside `apply` (restoring a snapshot)."""
        self._token(command)

    def _token(self, command: PutToken | DeleteToken) -> None:
        old = self.tokens.pop(command.name, None)
        if old is not None:
            self._token_digests.pop(old.digest, None)
        if isinstance(command, PutToken):
            token = TokenInfo(command.name, command.digest, command.rights)
            self.tokens[token.name] = token
            self._token_digests[token.digest] = token
        return None

    def token_by_digest(self, digest: str) -> tuple[str, tuple[str, ...]] | None:
        """(name, rights) of the token with this SHA-256 digest."""
        token = self._token_digests.get(digest)
        return (token.name, token.rights) if token is not None else None

    def _move(self, command: ReplaceReplica | ReplicaLeft) -> TopicInfo:
        topic = self.topics[command.topic]
        before = topic.partitions[command.partition]
        if isinstance(command, ReplaceReplica):
            replicas = tuple(command.new if n == command.old else n for n in before.replicas)
            after = replace(before, replicas=replicas, initial=before.bootstrap_voters,
                            leaving=(*before.leaving, command.old))
        else:
            after = replace(before, leaving=tuple(n for n in before.leaving if n != command.node))
        partitions = tuple(after if p.partition == command.partition else p for p in topic.partitions)
        self.topics[command.topic] = updated = replace(topic, partitions=partitions)
        return updated

    # ---- queries ------------------------------------------------------------------

    def partition_info(self, topic: str, partition: int) -> PartitionInfo:
        partitions = self.topic(topic).partitions
        if not 0 <= partition < len(partitions):
            raise UnknownTopic(f"topic {topic!r} has no partition {partition}")
        return partitions[partition]

    def topic(self, name: str) -> TopicInfo:
        if name not in self.topics:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return self.topics[name]

    def live_nodes(self) -> list[NodeInfo]:
        return [n for _, n in sorted(self.nodes.items()) if n.status is NodeStatus.ALIVE]

    def placeable_nodes(self) -> list[NodeInfo]:
        """Live nodes that may take new replicas (not decommissioning)."""
        return [n for n in self.live_nodes() if not n.decommissioning]

    def snapshot(self) -> bytes:
        return encode_catalog(self)

    @classmethod
    def restore(cls, data: bytes) -> Catalog:
        return decode_catalog(data, cls)


def _as_create(command: CreateMirrorTopic) -> CreateTopic:
    """The plain topic a mirror is, for the checks and the creation it shares with one."""
    return CreateTopic(name=command.name, partitions=len(command.assignments),
                       replication_factor=command.replication_factor, config=command.config,
                       assignments=command.assignments)


def groups_for_node(catalog: Catalog, node_id: NodeId) -> dict[GroupId, LocalGroup]:
    """The partition groups `node_id` should host: what it reconciles its local
    groups against (create the missing, open on restart, delete the rest).
    Group 0 is not listed: its membership comes from the initial cluster."""
    hosted: dict[GroupId, LocalGroup] = {}
    for topic in catalog.topics.values():
        for partition in topic.partitions:
            if node_id in partition.hosts:
                hosted[partition.group_id] = LocalGroup(
                    topic.name, partition.partition, partition.replicas, partition.bootstrap_voters
                )
    return hosted
