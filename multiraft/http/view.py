"""JSON views of the node's state (cluster, topics, partitions), from the local view.

A node answers what it knows: the catalog is the same everywhere once applied,
but leaders, ISR and offsets are the view of this node's own replicas (for a
partition it hosts no replica of, the leader its leader's pings named, at most
about a second old). The ISR
is known only where the partition leader is (null elsewhere); offsets only
where a replica is hosted (null elsewhere). `raftlog cluster status` merges the
views of every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multiraft.metadata.catalog import PartitionInfo, TopicInfo
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi

METADATA_GROUP = 0


def cluster_view(node: NodeApi) -> dict[str, Any]:
    metadata = node.group_status(GroupId(METADATA_GROUP))
    assert metadata is not None, "every node hosts the metadata group"
    led: dict[int, int] = {}  # partitions each node leads, as this node sees it (a drain's progress)
    for topic in node.catalog.topics.values():
        for partition in topic.partitions:
            leader = node.leader_of(partition.group_id)
            led[leader] = led.get(leader, 0) + 1
    return {
        "node_id": node.id,
        "metadata_leader": metadata.leader or None,
        "term": metadata.term,
        "commit_index": metadata.commit_index,
        "metadata_voters": sorted(metadata.voters),
        "feature_level": node.catalog.feature_level,  # the finalized one (GET /v1/admin/features: each node's)
        "nodes": [
            {"node_id": n.node_id, "raft_addr": n.raft_addr, "http_addr": n.http_addr, "rack": n.rack,
             "status": n.status.value, "drained": n.drained, "decommissioning": n.decommissioning,
             "partitions_led": led.get(n.node_id, 0)}
            for _, n in sorted(node.catalog.nodes.items())
        ],
    }


def partition_view(node: NodeApi, partition: PartitionInfo) -> dict[str, Any]:
    view: dict[str, Any] = {
        "partition": partition.partition, "group_id": partition.group_id, "replicas": list(partition.replicas),
        "leaving": list(partition.leaving),  # copies being moved away: kept until the group drops them
        "leader": None, "isr": None, "log_start_offset": None, "high_watermark": None, "log_end_offset": None,
    }
    status = node.group_status(partition.group_id)
    if status is None:
        view["leader"] = node.leader_of(partition.group_id) or None  # from the leader's pings
        return view
    view["leader"] = status.leader or None
    view["role"] = status.role.value
    view["term"] = status.term
    if status.in_sync is not None:
        view["isr"] = sorted(status.in_sync)
    offsets = node.partition_status(partition.group_id)
    if offsets is not None:
        view["log_start_offset"] = offsets.log_start_offset
        view["high_watermark"] = offsets.high_watermark
        view["log_end_offset"] = offsets.log_end_offset
    return view


def topic_view(node: NodeApi, topic: TopicInfo) -> dict[str, Any]:
    return {
        "name": topic.name,
        "replication_factor": topic.replication_factor,
        "config": dict(topic.config),
        "partitions": [partition_view(node, p) for p in topic.partitions],
    }
