"""Goal: a node rolled back below the cluster's finalized feature level (restarted with
`ChaosHooks(feature_level=0)`, as a build from before the gate would run) still runs the
partition replicas it holds: its reconciler opens them again from its own data, as any
restart does, and they catch up. It creates and deletes none while it is below (a topic
deleted meanwhile keeps its copy here), and the metadata leader places no new replica on
it (its heartbeats say the level it supports): a topic of RF 2 goes to the other two
nodes, one of RF 3 is refused. Upgraded, it is placeable again (docs/node.md "Upgrading").

Three real nodes in one event loop (tests/node/test_node_cluster.py's).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from multiraft.metadata.commands import CreateTopic
from multiraft.metadata.features import SUPPORTED_LEVEL
from multiraft.node.node import Node
from multiraft.node.unsafe import ChaosHooks
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import NodeId
from tests.node.test_node_cluster import (
    at_build_level,
    batch,
    produce_retrying,
    running_cluster,
    until,
    values_at,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _partition_groups(node: Node) -> set[int]:
    return set(node.groups) - {0}


def _files(node: Node, group_id: int) -> bool:
    return (node.storage.groups_directory / str(group_id)).exists()


def _below_at_the_leader(nodes: list[Node]) -> frozenset[int] | None:
    leader = next((n for n in nodes if 0 in n.groups and n.groups[0].core.role is Role.LEADER), None)
    return leader.features.below_level() if leader is not None else None


async def test_a_node_below_the_level_runs_its_replicas_and_takes_no_new_one(tmp_path: Path) -> None:
    async with running_cluster(tmp_path, timeout_s=150) as nodes:
        await at_build_level(nodes)
        await nodes[0].create_topic("kept", 3, 3, {})
        await until(lambda: all(len(_partition_groups(n)) == 3 for n in nodes), "3 replicas open on every node")
        await produce_retrying(nodes[0], "kept", 0, batch(b"before"))
        held = _partition_groups(nodes[2])

        await nodes[2].stop()  # rolled back: a build that supports level 0 only
        nodes[2] = older = Node(nodes[2].config, hooks=ChaosHooks(feature_level=0))
        await older.start()
        await until(lambda: older.catalog.feature_level == SUPPORTED_LEVEL and not older.catalog_holder.readable,
                    "node 3 to replay the finalized level it does not support")
        await until(lambda: _partition_groups(older) == held, "node 3 to open the replicas it holds again", 30)
        await produce_retrying(nodes[0], "kept", 0, batch(b"after"))
        await until(lambda: values_at(older, "kept", 0) == [b"before", b"after"], "node 3's replica to catch up")

        await until(lambda: _below_at_the_leader(nodes) == {3}, "the metadata leader to hear node 3's level")
        await nodes[0].create_topic("placed", 4, 2, {})
        assert {r for p in nodes[0].catalog.topics["placed"].partitions for r in p.replicas} == {1, 2}
        with pytest.raises(ClientError) as refused:
            await nodes[1].create_topic("refused", 1, 3, {})
        assert refused.value.code == "INVALID_REPLICATION_FACTOR", refused.value
        assert "2 live nodes" in refused.value.message

        # Placed on it all the same (a proposal naming it): created by the others, not by it.
        await nodes[0].metadata.propose(CreateTopic(name="new", partitions=1, replication_factor=3, config={},
                                                    assignments=((NodeId(1), NodeId(2), NodeId(3)),)))
        await until(lambda: "new" in older.catalog.topics, "node 3 to apply the new topic")
        new = older.partition_group("new", 0)
        await until(lambda: new in nodes[0].groups and new in nodes[1].groups, "nodes 1 and 2 to create theirs")
        await asyncio.sleep(1.0)  # node 3's reconciler had its pass
        assert new not in older.groups and not _files(older, new)

        await nodes[0].delete_topic("kept")
        await until(lambda: not held & (_partition_groups(nodes[0]) | _partition_groups(nodes[1])),
                    "nodes 1 and 2 to delete their copies")
        assert held <= _partition_groups(older) and all(_files(older, g) for g in held)  # nor deletes

        await older.stop()  # upgraded
        nodes[2] = upgraded = Node(older.config)
        await upgraded.start()
        await until(lambda: upgraded.catalog_holder.readable and _below_at_the_leader(nodes) == frozenset(),
                    "node 3 upgraded, at the leader too")
        await nodes[0].create_topic("after", 1, 3, {})
        assert nodes[0].catalog.topics["after"].partitions[0].replicas.count(3) == 1
