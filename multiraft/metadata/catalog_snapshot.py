"""Catalog snapshots: versioned JSON, validated on restore.

A snapshot travels to a lagging or new node, so its bytes are checked as any
input is: node and topic records are re-validated through the command
dataclasses' own checks (one rule set, not two), and the id counters must lie
above every id in use. Failures raise `SnapshotFormatError`.

The catalog (multiraft/metadata/catalog.py) encodes and restores itself through
this module, so the codec does not import it: it names the catalog's shape
(`CatalogFields`) and is handed the class to build.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from multiraft.errors import SnapshotFormatError
from multiraft.metadata.catalog_records import (
    FIRST_PARTITION_GROUP,
    NodeInfo,
    PartitionInfo,
    TokenInfo,
    TopicInfo,
)
from multiraft.metadata.commands import (
    Command,
    ConfigValue,
    CreateTopic,
    DeleteToken,
    NodeStatus,
    PutToken,
    RegisterNode,
    SetClusterConfig,
)
from multiraft.metadata.features import FinalizeFeatureLevel
from multiraft.metadata.mirror_commands import (
    OFFSET_MAX,
    CreateMirrorLink,
    LinkState,
    MirrorLink,
    OnSourceTruncated,
    SetMirrorLinkState,
    check_link_name,
)
from multiraft.metadata.record_filter import spec_from_json
from raftlog.errors import ClientError
from raftlog.types import GroupId, Index, NodeId

CATALOG_SNAPSHOT_VERSION = 1


class CatalogFields(Protocol):
    """What the codec reads and fills of a `Catalog`."""

    applied_index: Index
    nodes: dict[NodeId, NodeInfo]
    topics: dict[str, TopicInfo]
    next_group_id: GroupId
    next_producer_id: int
    cluster_config: dict[str, ConfigValue]
    tokens: dict[str, TokenInfo]
    mirror_links: dict[str, MirrorLink]
    feature_level: int

    def validate(self, command: Command) -> None: ...

    def apply_token(self, command: PutToken | DeleteToken) -> None: ...


C = TypeVar("C", bound=CatalogFields)


def encode_catalog(catalog: CatalogFields) -> bytes:
    document = {
        "v": CATALOG_SNAPSHOT_VERSION,
        "applied_index": catalog.applied_index,
        "next_group_id": catalog.next_group_id,
        "next_producer_id": catalog.next_producer_id,
        "cluster_config": catalog.cluster_config,
        "nodes": [
            [n.node_id, n.raft_addr, n.http_addr, n.rack, n.status.value]
            for _, n in sorted(catalog.nodes.items())
        ],
        "topics": [_topic_row(t) for _, t in sorted(catalog.topics.items())],
        # Drained nodes (absent in snapshots from before drains: none drained).
        "drained": [n.node_id for _, n in sorted(catalog.nodes.items()) if n.drained],
        # Decommissioning nodes (absent before decommissions: none).
        "decommissioning": [n.node_id for _, n in sorted(catalog.nodes.items()) if n.decommissioning],
        "tokens": [[t.name, t.digest, list(t.rights)] for _, t in sorted(catalog.tokens.items())],
    }
    if catalog.mirror_links:  # absent without links, so such a catalog snapshots as before them
        document["mirror_links"] = [_link_row(link) for _, link in sorted(catalog.mirror_links.items())]
    if catalog.feature_level:  # absent at 0, so a catalog not finalized snapshots as before the gate
        document["feature_level"] = catalog.feature_level
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def _link_row(link: MirrorLink) -> list[Any]:
    """A link as six elements; a scheduled full sync's interval is a seventh, only when set or
    when an eighth follows (snapshots before it: six); the link's later settings an eighth, an
    object holding those not at their defaults: TLS to the source as `"tls": true` and `"ca":
    PEM` (`ca` only when set), `on_source_truncated` when not `stop` (snapshots before them:
    six or seven), `record_filter` (its clauses as lists) when set. So a catalog whose links
    keep those defaults snapshots as before them."""
    row: list[Any] = [link.name, list(link.sources), link.pattern, link.priority.value, link.state.value, link.token]
    extras: dict[str, Any] = {}
    if link.source_tls:
        extras.update(tls=True, **({"ca": link.source_ca} if link.source_ca is not None else {}))
    if link.on_source_truncated != OnSourceTruncated.STOP:
        extras["on_source_truncated"] = link.on_source_truncated.value
    if link.record_filter is not None:
        extras["record_filter"] = [list(clause) for clause in link.record_filter]
    if link.verify_interval_s is not None or extras:
        row.append(link.verify_interval_s)
    if extras:
        row.append(extras)
    return row


def _link_extras(extras: Any) -> dict[str, Any]:
    """A link row's eighth element back into `CreateMirrorLink` arguments (the command checks
    their values)."""
    if not isinstance(extras, dict) or not extras or not set(extras) <= {"tls", "ca", "on_source_truncated",
                                                                         "record_filter"}:
        raise ValueError("a mirror link row's eighth element is malformed")
    if ("tls" in extras or "ca" in extras) and extras.get("tls") is not True:
        raise ValueError("a mirror link row's TLS element is malformed")
    arguments = {"source_tls": True, "source_ca": extras.get("ca")} if "tls" in extras else {}
    if "record_filter" in extras:
        arguments["record_filter"] = spec_from_json(extras["record_filter"])
    return {**arguments, **({"on_source_truncated": extras["on_source_truncated"]}
                            if "on_source_truncated" in extras else {})}


def _topic_row(topic: TopicInfo) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": topic.name,
        "replication_factor": topic.replication_factor,
        "config": topic.config,
        "group_ids": [p.group_id for p in topic.partitions],
        "assignments": [list(p.replicas) for p in topic.partitions],
        # Replica moves (absent in snapshots from before them: none moved).
        "initial": [list(p.initial) for p in topic.partitions],
        "leaving": [list(p.leaving) for p in topic.partitions],
    }
    if topic.mirror_link is not None:  # mirrors only (absent before mirrors: none)
        row["mirror_link"] = topic.mirror_link
        if topic.mirror_promoted:
            row["mirror_promoted"] = True
        # Only a mirror grown after its promotion has other partitions than mirror ones (one grown
        # following its source has only mirror ones): absent, it is the partition count, as before.
        if topic.mirror_partitions != len(topic.partitions):
            row["mirror_partitions"] = topic.mirror_partitions
    if any(p.start_offset for p in topic.partitions):
        row["start_offsets"] = [p.start_offset for p in topic.partitions]
    if any(p.prefix for p in topic.partitions):  # absent before prefix resyncs: none kept
        row["prefixes"] = [list(p.prefix) for p in topic.partitions]
    if any(p.source_group is not None for p in topic.partitions):  # absent before identities: none recorded
        row["source_groups"] = [p.source_group for p in topic.partitions]
    return row


def decode_catalog(data: bytes, new_catalog: Callable[[], C]) -> C:
    """The catalog `data` holds, built from an empty one made by `new_catalog`."""
    try:
        document = json.loads(data)
        return _build(document, new_catalog)
    except (UnicodeDecodeError, KeyError, TypeError, ValueError, ClientError) as error:
        raise SnapshotFormatError(f"catalog snapshot is malformed: {error!r}") from None


def _int(value: Any, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {value!r}")
    return value


def _build(document: Any, new_catalog: Callable[[], C]) -> C:
    if not isinstance(document, dict) or document.get("v") != CATALOG_SNAPSHOT_VERSION:
        raise ValueError("unknown catalog snapshot version")
    catalog = new_catalog()
    catalog.applied_index = Index(_int(document["applied_index"]))
    catalog.next_group_id = GroupId(_int(document["next_group_id"], FIRST_PARTITION_GROUP))
    catalog.next_producer_id = _int(document["next_producer_id"])
    catalog.feature_level = FinalizeFeatureLevel(level=document["feature_level"]).level \
        if "feature_level" in document else 0  # absent before the gate, and at 0
    for key, value in document["cluster_config"].items():
        catalog.cluster_config[SetClusterConfig(key=key, value=value).key] = value
    for node_id, raft_addr, http_addr, rack, status in document["nodes"]:
        RegisterNode(node_id=node_id, raft_addr=raft_addr, http_addr=http_addr, rack=rack)
        if node_id in catalog.nodes:
            raise ValueError(f"node {node_id} appears twice")
        catalog.nodes[NodeId(node_id)] = NodeInfo(
            NodeId(node_id), raft_addr, http_addr, rack, NodeStatus(status)
        )
    for node_id in document.get("drained", []):
        node = catalog.nodes.get(NodeId(_int(node_id, 1)))
        if node is None or node.drained:
            raise ValueError(f"drained node {node_id} is unknown or listed twice")
        catalog.nodes[node.node_id] = NodeInfo(node.node_id, node.raft_addr, node.http_addr, node.rack,
                                               node.status, True)
    for node_id in document.get("decommissioning", []):
        node = catalog.nodes.get(NodeId(_int(node_id, 1)))
        if node is None or node.decommissioning:
            raise ValueError(f"decommissioning node {node_id} is unknown or listed twice")
        catalog.nodes[node.node_id] = replace(node, decommissioning=True)
    seen_groups: set[int] = set()
    for row in document["topics"]:
        topic = _topic(row)
        groups = {p.group_id for p in topic.partitions}
        if groups & seen_groups or max(groups) >= catalog.next_group_id:
            raise ValueError(f"group ids of {topic.name!r} collide or pass the counter")
        if topic.name in catalog.topics:
            raise ValueError(f"topic {topic.name!r} appears twice")
        seen_groups |= groups
        catalog.topics[topic.name] = topic
    for row in document.get("mirror_links", []):
        if len(row) not in (6, 7, 8):
            raise ValueError("a mirror link row has 6 to 8 elements")
        name, sources, pattern, priority, state, token = row[:6]
        extras = _link_extras(row[7]) if len(row) == 8 else {}
        command = CreateMirrorLink(name=name, sources=tuple(sources), pattern=pattern, priority=priority,
                                   token=token, verify_interval_s=row[6] if len(row) >= 7 else None, **extras)
        SetMirrorLinkState(name=name, state=state)
        if name in catalog.mirror_links:
            raise ValueError(f"mirror link {name!r} appears twice")
        catalog.mirror_links[name] = replace(command.link(), state=LinkState(state))
    for topic in catalog.topics.values():
        if topic.is_mirror and topic.mirror_link not in catalog.mirror_links:
            raise ValueError(f"topic {topic.name!r} mirrors over an unknown link")
    for name, digest, rights in document.get("tokens", []):  # absent in snapshots from before tokens
        command = PutToken(name=name, digest=digest, rights=tuple(rights))
        catalog.validate(command)
        if name in catalog.tokens:
            raise ValueError(f"token {name!r} appears twice")
        catalog.apply_token(command)
    return catalog


def _node_lists(rows: Any, count: int) -> list[tuple[NodeId, ...]]:
    """Per partition, a list of distinct node ids (absent: all empty)."""
    if rows is None:
        return [()] * count
    if not isinstance(rows, list) or len(rows) != count:
        raise ValueError("one node list per partition")
    lists = [tuple(NodeId(_int(n, 1)) for n in row) for row in rows]
    if any(len(set(nodes)) != len(nodes) for nodes in lists):
        raise ValueError("a node appears twice in one partition's list")
    return lists


def _topic(row: dict[str, Any]) -> TopicInfo:
    assignments = tuple(tuple(NodeId(n) for n in replicas) for replicas in row["assignments"])
    command = CreateTopic(
        name=row["name"],
        partitions=len(assignments),
        replication_factor=row["replication_factor"],
        config=row["config"],
        assignments=assignments,
    )
    group_ids = [GroupId(_int(g, FIRST_PARTITION_GROUP)) for g in row["group_ids"]]
    if len(group_ids) != command.partitions or len(set(group_ids)) != len(group_ids):
        raise ValueError(f"group ids of {command.name!r} do not match its partitions")
    initial = _node_lists(row.get("initial"), len(group_ids))
    leaving = _node_lists(row.get("leaving"), len(group_ids))
    for p, replicas in enumerate(assignments):
        if initial[p] and len(initial[p]) != len(replicas):
            raise ValueError(f"initial replicas of {command.name!r}/{p} do not match its replication factor")
        if set(leaving[p]) & set(replicas):
            raise ValueError(f"a replica of {command.name!r}/{p} is also leaving it")
    starts = row.get("start_offsets", [0] * len(group_ids))
    if not isinstance(starts, list) or len(starts) != len(group_ids):
        raise ValueError(f"start offsets of {command.name!r} do not match its partitions")
    prefixes = row.get("prefixes", [[]] * len(group_ids))
    if not isinstance(prefixes, list) or len(prefixes) != len(group_ids) or not all(
            isinstance(k, list) and len(k) in (0, 4) for k in prefixes):
        raise ValueError(f"prefixes of {command.name!r} do not match its partitions")
    sources = row.get("source_groups", [None] * len(group_ids))
    if not isinstance(sources, list) or len(sources) != len(group_ids) or not all(
            g is None or (_int(g, 1) and g <= OFFSET_MAX) for g in sources):
        raise ValueError(f"source groups of {command.name!r} do not match its partitions")
    partitions = tuple(
        PartitionInfo(p, group_ids[p], replicas, initial[p], leaving[p], _int(starts[p]),
                      tuple(_int(v) for v in prefixes[p]), sources[p])  # type: ignore[arg-type]
        for p, replicas in enumerate(assignments)
    )
    link = row.get("mirror_link")
    if link is not None:
        check_link_name(link)
    if link is None and "source_groups" in row:
        raise ValueError(f"source groups of {command.name!r} without a mirror link")
    promoted = row.get("mirror_promoted", False)
    if not isinstance(promoted, bool) or (promoted and link is None):
        raise ValueError(f"mirror_promoted of {command.name!r} is malformed")
    mirrored = row.get("mirror_partitions", len(partitions) if link is not None else 0)
    if link is not None and (type(mirrored) is not int or not 1 <= mirrored <= len(partitions)):
        raise ValueError(f"mirror_partitions of {command.name!r} is malformed")
    if link is None and mirrored != 0:
        raise ValueError(f"mirror_partitions of {command.name!r} without a mirror link")
    # A mirror not promoted has only mirror partitions (made or grown with its source's count;
    # partitions by hand come only after the promotion): no command writes another row, and
    # applying a growth to one would stop every replica of group 0 (mirror_growth.py).
    if link is not None and not promoted and mirrored != len(partitions):
        raise ValueError(f"mirror {command.name!r} is not promoted, yet {mirrored} of its {len(partitions)} "
                         "partitions are mirror partitions")
    return TopicInfo(command.name, command.replication_factor, dict(command.config), partitions, link, promoted,
                     mirrored)
