"""Goal: health, cluster and topic administration answer the contract's shapes on
every node, and a topic created through one node is visible through all."""

from __future__ import annotations

import pytest

from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def test_health_and_cluster_on_every_node(cluster: Cluster) -> None:
    for i in range(3):
        status, body = await cluster.call("GET", i, "/v1/health")
        assert status == 200 and body["status"] == "ok" and body["node_id"] == i + 1
        status, body = await cluster.call("GET", i, "/v1/cluster")
        assert status == 200
        assert [n["node_id"] for n in body["nodes"]] == [1, 2, 3]
        assert body["metadata_leader"] in (1, 2, 3)
        assert {"raft_addr", "http_addr", "rack", "status"} <= set(body["nodes"][0])


async def test_topic_create_list_describe_delete(cluster: Cluster) -> None:
    created = await cluster.create_topic("admin-t", partitions=2, replication_factor=3,
                                         config={"min_insync_replicas": 2})
    assert created["name"] == "admin-t" and created["config"] == {"min_insync_replicas": 2}
    assert [p["partition"] for p in created["partitions"]] == [0, 1]
    status, body = await cluster.call("POST", 1, "/v1/topics", json={"name": "admin-t", "partitions": 1})
    assert (status, body["error_code"]) == (409, "TOPIC_EXISTS")

    for i in range(3):
        status, body = await cluster.call("GET", i, "/v1/topics")
        assert status == 200 and {"name": "admin-t", "partitions": 2, "replication_factor": 3} in body["topics"]
    leaders = set()
    for i in range(3):
        status, body = await cluster.call("GET", i, "/v1/topics/admin-t")
        assert status == 200
        for partition in body["partitions"]:
            assert sorted(partition["replicas"]) == [1, 2, 3]
            assert partition["log_start_offset"] == 0 and partition["high_watermark"] == 0
            assert partition["log_end_offset"] == 0
            leaders.add((partition["partition"], partition["leader"]))
            if partition["leader"] == i + 1:
                assert partition["isr"] and i + 1 in partition["isr"]
    assert len(leaders) == 2, "every node agrees on each partition's leader"

    status, _ = await cluster.call("DELETE", 2, "/v1/topics/admin-t")
    assert status == 204
    await until(lambda: all("admin-t" not in n.catalog.topics for n in cluster.nodes), "topic gone everywhere")
    status, body = await cluster.call("GET", 0, "/v1/topics/admin-t")
    assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC")
    status, body = await cluster.call("DELETE", 0, "/v1/topics/admin-t")
    assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC")


async def test_producer_ids_are_unique_from_any_node(cluster: Cluster) -> None:
    seen = set()
    for i in range(3):
        status, body = await cluster.call("POST", i, "/v1/producers")
        assert status == 200 and body["producer_epoch"] == 0
        seen.add(body["producer_id"])
    assert len(seen) == 3


async def test_leadership_balance_answers_for_every_node(cluster: Cluster) -> None:
    status, body = await cluster.call("POST", 0, "/v1/admin/leadership/balance")
    assert status == 200 and body["transfers_started"] >= 0
    assert sorted(body["by_node"]) == ["1", "2", "3"] and all(c >= 0 for c in body["by_node"].values())


async def test_metrics_expose_group_and_node_figures(cluster: Cluster) -> None:
    status, body = await cluster.call("GET", 0, "/metrics")
    assert status == 200
    text = body.decode()
    for name in ("raftlog_group_role", "raftlog_group_term", "raftlog_group_commit_index",
                 "raftlog_group_applied_index", "raftlog_node_groups", "raftlog_transport_bytes_out_total"):
        assert name in text, name
    assert 'raftlog_group_role{group_id="0"' in text
    for name in ("raftlog_group_elections_total", "raftlog_group_leader_changes_total"):
        assert name in text, name
    # The metadata group committed and fsynced things by now: the histograms have observations.
    for name in ("raftlog_fsync_seconds", "raftlog_replicate_seconds", "raftlog_apply_seconds"):
        count = next(line for line in text.splitlines() if line.startswith(f"{name}_count"))
        assert float(count.split()[-1]) > 0, count
        assert f'{name}_bucket{{le="+Inf"}}' in text
