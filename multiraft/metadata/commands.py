"""Commands of the metadata group (group 0) and their explicit encoding.

Each command is a frozen dataclass that validates its own shape on construction
(types, ranges, name patterns): whatever builds one — the controller, the HTTP
layer, the decoder of a committed entry — gets the same checks. Checks against
catalog state (does the topic exist, are the nodes registered) live in
`Catalog.validate`, which runs before proposing and again on apply.

Encoding: one JSON object with a version `v` and a `type` tag, then exactly the
command's fields. Decoding refuses unknown versions, unknown types, missing or
extra fields, and wrong types. One exception keeps group 0's log readable across an
upgrade: a field added to a command later is left out while it holds its default, and
filled with it when absent (`ResyncMirrorPartition`'s prefix fields:
mirror_commands.py `RESYNC_PREFIX_DEFAULTS`), so each version decodes what the other
wrote as long as the new field is not used; whether it may be used is the cluster's feature
level (multiraft/metadata/features.py). JSON because catalog commands are rare and small,
and a log that a person can read is worth the bytes. Never pickle.

Placement is decided by the controller before proposing and carried in
`CreateTopic.assignments`: apply must be deterministic, and placement depends on
node liveness, which only the controller observes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from multiraft.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
)
from multiraft.metadata.checks import (
    ADDRESS_CHARS_MAX,
    CONFIG_ENTRIES_MAX,
    CONFIG_KEY_PATTERN,
    CONFIG_STRING_CHARS_MAX,
    PARTITIONS_MAX,
    PRODUCER_ID_BLOCK_MAX,
    RACK_CHARS_MAX,
    REPLICATION_FACTOR_MAX,
    TOPIC_CONFIG_KEYS,
    TYPED_CONFIG,
    ConfigValue,
    NodeStatus,
    check_config,
    check_config_entry,
    check_known_config,
    check_topic_name,
)
from multiraft.metadata.checks import check_node_id as _check_node_id
from multiraft.metadata.checks import check_text as _check_text
from multiraft.metadata.checks import is_int as _is_int
from multiraft.metadata.features import FinalizeFeatureLevel
from multiraft.metadata.mirror_commands import (
    MIRROR_COMMAND_TYPES,
    CreateMirrorLink,
    CreateMirrorTopic,
    DeleteMirrorLink,
    GrowMirrorTopic,
    PromoteMirrorTopic,
    ResyncMirrorPartition,
    SetMirrorLinkPolicy,
    SetMirrorLinkState,
    decoded_mirror_arguments,
    omitted_mirror_fields,
)
from multiraft.metadata.patterns import check_rights, check_token_name
from raftlog.types import NodeId

__all__ = [
    "ADDRESS_CHARS_MAX", "COMMAND_TYPES", "COMMAND_VERSION", "CONFIG_ENTRIES_MAX", "CONFIG_KEY_PATTERN",
    "CONFIG_STRING_CHARS_MAX", "PARTITIONS_MAX", "PRODUCER_ID_BLOCK_MAX", "RACK_CHARS_MAX",
    "REPLICATION_FACTOR_MAX", "TOPIC_CONFIG_KEYS", "TYPED_CONFIG", "AllocateProducerIds", "AlterTopicConfig",
    "Command", "ConfigValue", "CreateMirrorLink", "CreateMirrorTopic", "CreatePartitions", "CreateTopic",
    "DeleteMirrorLink", "DeleteToken", "DeleteTopic", "FinalizeFeatureLevel", "GrowMirrorTopic", "NodeStatus",
    "PromoteMirrorTopic", "PutToken", "RegisterNode", "ReplaceReplica", "ReplicaLeft", "ResyncMirrorPartition",
    "SetClusterConfig", "SetMirrorLinkPolicy", "SetMirrorLinkState", "SetNodeDecommissioning", "SetNodeDrained",
    "SetNodeStatus", "check_config", "check_config_entry",
    "check_known_config", "check_topic_name", "decode_command", "encode_command",
]

COMMAND_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNode:
    """A node joins (or re-registers after a restart, possibly with new addresses)."""

    node_id: NodeId
    raft_addr: str
    http_addr: str
    rack: str | None = None

    def __post_init__(self) -> None:
        _check_node_id(self.node_id)
        _check_text(self.raft_addr, "raft_addr", ADDRESS_CHARS_MAX)
        _check_text(self.http_addr, "http_addr", ADDRESS_CHARS_MAX)
        if self.rack is not None:
            _check_text(self.rack, "rack", RACK_CHARS_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNodeStatus:
    node_id: NodeId
    status: NodeStatus

    def __post_init__(self) -> None:
        _check_node_id(self.node_id)
        if not isinstance(self.status, NodeStatus):
            raise InvalidRequest(f"unknown node status {self.status!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopic:
    """`assignments[p]` lists partition p's replicas, preferred leader first."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, ConfigValue]
    assignments: tuple[tuple[NodeId, ...], ...]

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if not _is_int(self.partitions) or not 1 <= self.partitions <= PARTITIONS_MAX:
            raise InvalidPartitions(f"partitions must be 1..{PARTITIONS_MAX}")
        rf = self.replication_factor
        if not _is_int(rf) or not 1 <= rf <= REPLICATION_FACTOR_MAX:
            raise InvalidReplicationFactor(
                f"replication factor must be 1..{REPLICATION_FACTOR_MAX}"
            )
        check_config(self.config)
        if not isinstance(self.assignments, tuple) or len(self.assignments) != self.partitions:
            raise InvalidReplicaAssignment("one replica list per partition")
        for replicas in self.assignments:
            if not isinstance(replicas, tuple) or len(replicas) != rf:
                raise InvalidReplicaAssignment(f"each partition has {rf} replicas")
            for node_id in replicas:
                _check_node_id(node_id)
            if len(set(replicas)) != rf:
                raise InvalidReplicaAssignment("a node holds at most one replica of a partition")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopic:
    name: str

    def __post_init__(self) -> None:
        check_topic_name(self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocateProducerIds:
    """Reserve `count` producer ids (a node hands them out without asking group 0 each time)."""

    count: int

    def __post_init__(self) -> None:
        if not _is_int(self.count) or not 1 <= self.count <= PRODUCER_ID_BLOCK_MAX:
            raise InvalidRequest(f"producer id block must be 1..{PRODUCER_ID_BLOCK_MAX}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SetClusterConfig:
    """Set `key` to `value`; a None value removes the key."""

    key: str
    value: ConfigValue | None

    def __post_init__(self) -> None:
        if self.value is None:
            check_config_entry(self.key, "")
        else:
            check_config_entry(self.key, self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlterTopicConfig:
    """Change a topic's settings after creation, as Kafka's incremental alter-configs:
    each key of `changes` is set to its value, or removed (back to the default) when
    the value is None."""

    name: str
    changes: dict[str, ConfigValue | None]

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if not isinstance(self.changes, dict) or not 1 <= len(self.changes) <= CONFIG_ENTRIES_MAX:
            raise InvalidConfig(f"config changes are an object of 1..{CONFIG_ENTRIES_MAX} entries")
        for key, value in self.changes.items():
            if value is None:
                if not isinstance(key, str) or not CONFIG_KEY_PATTERN.fullmatch(key):
                    raise InvalidConfig(f"config key {key!r} must match {CONFIG_KEY_PATTERN.pattern}")
            else:
                check_config_entry(key, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PutToken:
    """Create or replace the bearer token `name`: its SHA-256 `digest` (never the token)
    and its `rights` (multiraft/metadata/auth.py)."""

    name: str
    digest: str
    rights: tuple[str, ...]

    def __post_init__(self) -> None:
        check_token_name(self.name)
        if not isinstance(self.digest, str) or not re.fullmatch(r"[0-9a-f]{64}", self.digest):
            raise InvalidRequest("token digest is 64 lowercase hex digits (SHA-256)")
        if check_rights(self.rights) != self.rights:
            raise InvalidRequest("token rights are sorted and distinct")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteToken:
    name: str

    def __post_init__(self) -> None:
        check_token_name(self.name)


def _check_partition(topic: object, partition: object) -> None:
    check_topic_name(topic)
    if not _is_int(partition) or not 0 <= partition < PARTITIONS_MAX:  # type: ignore[operator]
        raise InvalidPartitions(f"partition must be 0..{PARTITIONS_MAX - 1}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaceReplica:
    """Move one replica of a partition from `old` (a dead node) to `new`.

    The catalog lists `new` in `old`'s place at once (same position, so the order of
    preferred leaders stays) and keeps `old` as *leaving*: its node keeps its copy
    until the group itself has removed it (`ReplicaLeft`), so no copy is deleted
    while the group may still need it. The partition's leader does the Raft side
    (multiraft/node/reassignment.py).
    """

    topic: str
    partition: int
    old: NodeId
    new: NodeId

    def __post_init__(self) -> None:
        _check_partition(self.topic, self.partition)
        _check_node_id(self.old)
        _check_node_id(self.new)
        if self.old == self.new:
            raise InvalidReplicaAssignment("a replica moves to another node")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaLeft:
    """The partition's group has committed the removal of `node`: its copy may go."""

    topic: str
    partition: int
    node: NodeId

    def __post_init__(self) -> None:
        _check_partition(self.topic, self.partition)
        _check_node_id(self.node)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatePartitions:
    """Grow topic `name` to `count` partitions (Kafka's CreatePartitions: the new total,
    never fewer). `assignments` lists the replicas of the new partitions only (partition
    `count - len(assignments)` first), preferred leader first, placed by the controller
    as a new topic's are. The total rides along so a second, racing request for the same
    growth is refused on apply instead of growing the topic twice."""

    name: str
    count: int
    assignments: tuple[tuple[NodeId, ...], ...]

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if not _is_int(self.count) or not 2 <= self.count <= PARTITIONS_MAX:
            raise InvalidPartitions(f"partitions must be 2..{PARTITIONS_MAX}")
        if not isinstance(self.assignments, tuple) or not 1 <= len(self.assignments) < self.count:
            raise InvalidReplicaAssignment("one replica list per new partition, at least one")
        sizes = {len(r) if isinstance(r, tuple) else -1 for r in self.assignments}
        if len(sizes) != 1 or not 1 <= min(sizes) <= REPLICATION_FACTOR_MAX:
            raise InvalidReplicaAssignment("every new partition has the same number of replicas")
        for replicas in self.assignments:
            for node_id in replicas:
                _check_node_id(node_id)
            if len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignment("a node holds at most one replica of a partition")


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNodeDrained:
    """Mark a node drained (leadership only, for a rolling restart) or clear the mark: a
    drained node leads nothing (multiraft/node/draining.py). Kept in the catalog so it
    outlives the node's restart, which is what it is for."""

    node_id: NodeId
    drained: bool

    def __post_init__(self) -> None:
        _check_node_id(self.node_id)
        if not isinstance(self.drained, bool):
            raise InvalidRequest("drained is true or false")


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNodeDecommissioning:
    """Start taking a node out of the cluster, or cancel that (recommission): a
    decommissioning node leads nothing, takes no new replica, has its replicas moved to
    the other nodes and, once it holds none, leaves the metadata group
    (multiraft/node/decommission.py). Kept in the catalog: it outlives restarts."""

    node_id: NodeId
    decommissioning: bool

    def __post_init__(self) -> None:
        _check_node_id(self.node_id)
        if not isinstance(self.decommissioning, bool):
            raise InvalidRequest("decommissioning is true or false")


Command = (
    RegisterNode
    | SetNodeStatus
    | CreateTopic
    | DeleteTopic
    | AllocateProducerIds
    | SetClusterConfig
    | ReplaceReplica
    | ReplicaLeft
    | AlterTopicConfig
    | PutToken
    | DeleteToken
    | CreatePartitions
    | SetNodeDrained
    | SetNodeDecommissioning
    | CreateMirrorLink
    | SetMirrorLinkState
    | SetMirrorLinkPolicy
    | DeleteMirrorLink
    | CreateMirrorTopic
    | PromoteMirrorTopic
    | ResyncMirrorPartition
    | GrowMirrorTopic
    | FinalizeFeatureLevel
)

COMMAND_TYPES: dict[str, type] = {
    "register_node": RegisterNode,
    "set_node_status": SetNodeStatus,
    "create_topic": CreateTopic,
    "delete_topic": DeleteTopic,
    "allocate_producer_ids": AllocateProducerIds,
    "set_cluster_config": SetClusterConfig,
    "replace_replica": ReplaceReplica,
    "replica_left": ReplicaLeft,
    "alter_topic_config": AlterTopicConfig,
    "put_token": PutToken,
    "delete_token": DeleteToken,
    "create_partitions": CreatePartitions,
    "set_node_drained": SetNodeDrained,
    "set_node_decommissioning": SetNodeDecommissioning,
    **MIRROR_COMMAND_TYPES,
    "finalize_feature_level": FinalizeFeatureLevel,  # multiraft/metadata/features.py
}
_TAGS = {cls: tag for tag, cls in COMMAND_TYPES.items()}


def encode_command(command: Command) -> bytes:
    document: dict[str, Any] = {"v": COMMAND_VERSION, "type": _TAGS[type(command)]}
    omitted = omitted_mirror_fields(command)
    for field in fields(command):
        if field.name in omitted:
            continue
        value = getattr(command, field.name)
        if isinstance(value, NodeStatus):
            value = value.value
        document[field.name] = value
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode_command(payload: bytes) -> Command:
    """Decode and validate one committed command. Raises `InvalidRequest` (or a subclass)."""
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidRequest(f"metadata command is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("v") != COMMAND_VERSION:
        raise InvalidRequest("metadata command has an unknown version")
    cls = COMMAND_TYPES.get(document.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise InvalidRequest(f"unknown metadata command {document.get('type')!r}")
    names = {field.name for field in fields(cls)}
    arguments = {key: value for key, value in document.items() if key not in ("v", "type")}
    if cls in MIRROR_COMMAND_TYPES.values():
        arguments = decoded_mirror_arguments(cls, arguments)
    if set(arguments) != names:
        raise InvalidRequest(f"{document['type']} has fields {sorted(names)}")
    if cls is SetNodeStatus:
        try:
            arguments["status"] = NodeStatus(arguments["status"])
        except ValueError:
            raise InvalidRequest(f"unknown node status {arguments['status']!r}") from None
    if cls is PutToken and isinstance(arguments["rights"], list):
        arguments["rights"] = tuple(arguments["rights"])
    if cls in (CreateTopic, CreatePartitions) and isinstance(arguments["assignments"], list):
        arguments["assignments"] = tuple(
            tuple(r) if isinstance(r, list) else r for r in arguments["assignments"]
        )
    return cls(**arguments)
