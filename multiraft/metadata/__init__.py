"""The metadata group (group 0): catalog commands, the catalog state machine, placement.

See docs/node.md. Everything here is pure: the group runtime feeds committed
commands to `Catalog.apply`; the controller runs `Catalog.validate` and
`place_replicas` before proposing.
"""

from multiraft.metadata.catalog import (
    METADATA_GROUP,
    Catalog,
    CatalogResult,
    LocalGroup,
    NodeInfo,
    PartitionInfo,
    ProducerIdBlock,
    TopicInfo,
    groups_for_node,
)
from multiraft.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfig,
    Command,
    CreatePartitions,
    CreateTopic,
    DeleteToken,
    DeleteTopic,
    NodeStatus,
    PutToken,
    RegisterNode,
    ReplaceReplica,
    ReplicaLeft,
    SetClusterConfig,
    SetNodeDecommissioning,
    SetNodeDrained,
    SetNodeStatus,
    decode_command,
    encode_command,
)
from multiraft.metadata.placement import PlacementNode, place_replicas, replacement_for

__all__ = [
    "METADATA_GROUP",
    "AllocateProducerIds",
    "AlterTopicConfig",
    "Catalog",
    "CatalogResult",
    "Command",
    "CreatePartitions",
    "CreateTopic",
    "DeleteToken",
    "DeleteTopic",
    "LocalGroup",
    "NodeInfo",
    "NodeStatus",
    "PartitionInfo",
    "PlacementNode",
    "ProducerIdBlock",
    "PutToken",
    "RegisterNode",
    "ReplaceReplica",
    "ReplicaLeft",
    "SetClusterConfig",
    "SetNodeDecommissioning",
    "SetNodeDrained",
    "SetNodeStatus",
    "TopicInfo",
    "decode_command",
    "encode_command",
    "groups_for_node",
    "place_replicas",
    "replacement_for",
]
