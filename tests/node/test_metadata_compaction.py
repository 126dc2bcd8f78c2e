"""Goal: the metadata group's log is compacted like a partition's, with the catalog as
its state, so it stays bounded however long a cluster runs. The start point carries
the catalog as of its index; a node that was down while the log moved on catches up
by installing the leader's catalog snapshot; after a restart of every node the
catalog is whole (topics, nodes) and no producer id is handed out twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from multiraft.metadata.catalog_snapshot import encode_catalog
from multiraft.metadata.commands import NodeStatus
from multiraft.node import replicas
from multiraft.node.compaction import compact_group
from multiraft.node.node import METADATA_GROUP, Node
from raftlog.messages import Role
from tests.node.test_node_cluster import (
    joiner_config,
    restart_all,
    running_cluster,
    running_cluster_with_http,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def first_index(node: Node) -> int:
    return int(node.stores[METADATA_GROUP].first_index())


def metadata_leader(nodes: list[Node]) -> Node | None:
    return next((n for n in nodes if n.db is not None and n.groups[METADATA_GROUP].core.role is Role.LEADER), None)


def catalog_without_index(node: Node) -> bytes:
    """The catalog's content; `applied_index` differs between replicas that applied
    the same commands plus a different number of no-ops."""
    catalog = node.catalog
    applied, catalog.applied_index = catalog.applied_index, 0
    try:
        return encode_catalog(catalog)
    finally:
        catalog.applied_index = applied


def all_alive_and_agreed(nodes: list[Node]) -> bool:
    """Every replica holds the same catalog and it has every node alive: the controller's
    liveness marks (a node down for longer than node_dead_after_ms is marked dead, then
    alive again when it beats) are settled."""
    first = catalog_without_index(nodes[0])
    return (all(catalog_without_index(n) == first for n in nodes)
            and all(info.status is NodeStatus.ALIVE for info in nodes[0].catalog.nodes.values()))


async def test_the_metadata_log_is_compacted_with_the_catalog(tmp_path: Path, monkeypatch) -> None:
    # 4 KiB segments, 8 KiB kept: a few hundred small commands roll many segments.
    monkeypatch.setattr(replicas, "METADATA_LOG_CONFIG",
                        {"segment_bytes": 4096, "retention_bytes": 8192, "retention_ms": -1})
    async with running_cluster(tmp_path, timeout_s=180) as nodes:
        await nodes[0].create_topic("kept", 2, 3, {})
        for node in nodes:
            await node.wait_for_topic("kept")
        await until(lambda: metadata_leader(nodes) is not None, "a metadata leader")
        leader = metadata_leader(nodes)
        assert leader is not None
        lagging = next(n for n in nodes if n is not leader)
        await lagging.stop()  # it comes back after the metadata log's start moved past it
        live = [n for n in nodes if n is not lagging]

        handed_out = [(await leader.allocate_producer_id())[0] for _ in range(400)]
        assert len(set(handed_out)) == len(handed_out)
        await until(lambda: all(first_index(n) > 1 for n in live), "the metadata log's start moved", 30)
        segments = len(leader.stores[METADATA_GROUP].segments)
        assert segments <= 4, f"retention keeps about 8 KiB of 4 KiB segments, not {segments}"

        # The lagging node returns: the leader's log starts past its own, so it installs
        # the catalog snapshot and then follows the log from there.
        index = nodes.index(lagging)
        nodes[index] = back = Node(lagging.config)
        await back.start()
        await until(lambda: catalog_without_index(back) == catalog_without_index(leader), "the catalog caught up", 30)
        assert first_index(back) > 1, "it installed the leader's snapshot"
        assert "kept" in back.catalog.topics and len(back.catalog.nodes) == 3

        # Restart every node: each restores the catalog from its start point. The lagging
        # node may have been marked dead while it was down (a slow box takes more than
        # node_dead_after_ms for the 400 allocations): compare from the settled state.
        await until(lambda: all_alive_and_agreed(nodes), "every node alive in every catalog", 30)
        before = catalog_without_index(leader)
        await restart_all(nodes)
        for node in nodes:
            assert first_index(node) > 1, "restored from a start point, not replayed from entry 1"
        await until(lambda: metadata_leader(nodes) is not None, "a metadata leader", 30)
        await until(lambda: all_alive_and_agreed(nodes) and catalog_without_index(nodes[0]) == before,
                    "the catalog restored", 30)
        for node in nodes:
            await node.wait_for_topic("kept")
        await until(lambda: nodes[0].groups[METADATA_GROUP].core.leader != 0, "node 1 knows the metadata leader", 30)
        again = (await nodes[0].allocate_producer_id())[0]
        assert again > max(handed_out), "a producer id is never handed out twice"


async def test_a_node_joining_after_compaction_gets_the_catalog_and_stays_a_member(tmp_path: Path, monkeypatch) -> None:
    # The joiner's learner entry is a configuration change in the metadata log. A start
    # point names the configuration as of its own index: one captured before the join
    # has no learner (the entry after it adds one on replay), one past it has.
    # Compaction runs by hand here, so that a capture from before the join is used after it.
    from multiraft.node import node as node_module

    async def no_background_compaction(*args: object) -> None:
        return None

    monkeypatch.setattr(node_module, "compaction_loop", no_background_compaction)
    monkeypatch.setattr(replicas, "METADATA_LOG_CONFIG",
                        {"segment_bytes": 4096, "retention_bytes": 8192, "retention_ms": -1})

    def compact(node: Node) -> int:
        runtime = node.groups[METADATA_GROUP]
        return int(compact_group(node.stores[METADATA_GROUP], runtime.boundaries, runtime.core.applied_index,
                                 int(time.time() * 1000)))

    def start_learners(node: Node) -> frozenset[int]:
        return node.stores[METADATA_GROUP].snapshot().meta.membership.learners

    joiner: Node | None = None
    async with running_cluster_with_http(tmp_path, timeout_s=180) as (nodes, servers):
        try:
            await nodes[0].create_topic("before", 1, 3, {})
            for _ in range(300):
                await nodes[1].allocate_producer_id()
            await until(lambda: all(n.groups[METADATA_GROUP].boundaries.captured for n in nodes), "captures", 30)

            joiner = Node(joiner_config(tmp_path, servers[1].url))
            await joiner.start()
            await joiner.wait_for_topic("before", timeout_s=30)
            await until(lambda: all(len(n.catalog.nodes) == 4 for n in [*nodes, joiner]), "4 nodes everywhere", 30)
            for node in nodes:
                assert compact(node) > 1
                assert 4 not in start_learners(node), "captured before the join: no learner yet"

            joined_at = max(int(n.stores[METADATA_GROUP].last_index()) for n in nodes)
            for _ in range(300):  # roll the log well past the learner's entry
                await nodes[1].allocate_producer_id()
            await until(lambda: all(max(n.groups[METADATA_GROUP].boundaries.captured, default=0) > joined_at
                                    for n in nodes), "captures past the join", 30)
            for node in nodes:
                assert compact(node) > joined_at
                assert 4 in start_learners(node), "captured after the join: the learner is in"

            for server in servers:
                await server.stop()
            await restart_all(nodes)
            for node in nodes:
                assert 4 in node.groups[METADATA_GROUP].core.membership.learners, "the learner is still a member"
            await until(lambda: metadata_leader(nodes) is not None, "a metadata leader", 30)
            await nodes[0].create_topic("after", 4, 1, {})  # one replica on each of the 4 nodes
            await joiner.wait_for_topic("after", timeout_s=30)
            await until(lambda: len(joiner.partitions) == 1, "the joiner hosts a replica", 30)
        finally:
            if joiner is not None and joiner.db is not None:
                await joiner.stop()
