"""Goal: health, cluster and topic administration answer the contract's shapes on
every node, and a topic created through one node is visible through all."""

from __future__ import annotations

import asyncio

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
            assert partition["log_end_offset"] == 0 and partition["leaving"] == []  # no copy moving
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


async def test_follower_lag_seconds_grows_while_a_follower_gets_no_entries(cluster: Cluster) -> None:
    # Goal: the leader's /metrics shows the time lag of its furthest-behind follower
    # (DESIGN.md section 10): it grows while one follower receives no new entries,
    # and falls back once that follower catches up.
    from raftlog.messages import Message, MessageType, Role

    await cluster.create_topic("lag-t", partitions=1)
    group = cluster.nodes[0].partition_group("lag-t", 0)
    leader = next(i for i, n in enumerate(cluster.nodes) if n.groups[group].core.role is Role.LEADER)
    follower = next(i for i in range(3) if i != leader)
    runtime = cluster.nodes[follower].groups[group]
    held: list = []
    deliver = runtime.deliver

    def hold_entries(message: Message) -> None:
        (held.append if message.type is MessageType.APPEND and message.entries else deliver)(message)

    async def lag_s() -> float:
        _, body = await cluster.call("GET", leader, "/metrics")
        prefix = "raftlog_group_follower_lag_seconds{"
        line = next(x for x in body.decode().splitlines() if x.startswith(prefix) and f'group_id="{group}"' in x)
        return float(line.split()[-1])

    runtime.deliver = hold_entries
    try:
        status, _ = await cluster.call("POST", leader, "/v1/topics/lag-t/partitions/0/records",
                                       json={"records": [{"value": 1}]})
        assert status == 200
        async with asyncio.timeout(20):
            while await lag_s() < 0.3:
                await asyncio.sleep(0.05)
    finally:
        runtime.deliver = deliver
        for message in held:
            deliver(message)
    async with asyncio.timeout(20):
        while await lag_s() >= 0.3:
            await asyncio.sleep(0.05)


async def test_linearizable_catalog_reads_wait_for_changes_made_elsewhere(cluster: Cluster) -> None:
    # Goal: a node whose catalog trails (its metadata replica gets no messages for a
    # while) answers a plain read from what it has, but a `consistency=linearizable`
    # read first catches up with every change completed elsewhere; a delete's answer
    # waits until the deleting node's own catalog agrees; a bad value is a 400.
    from multiraft.node.replicas import METADATA_GROUP
    from raftlog.messages import Message, MessageType

    leader_id = cluster.nodes[0].groups[METADATA_GROUP].core.leader
    lagging = next(i for i, n in enumerate(cluster.nodes) if n.id != leader_id)
    writer = next(i for i, n in enumerate(cluster.nodes) if i != lagging)
    runtime = cluster.nodes[lagging].groups[METADATA_GROUP]
    held: list = []
    deliver = runtime.deliver

    def hold_entries(message: Message) -> None:  # heartbeats pass: it still follows its leader
        if message.type is MessageType.APPEND and message.entries:
            held.append(message)
        else:
            deliver(message)

    runtime.deliver = hold_entries  # the lagging replica receives no new entries for now
    try:
        status, _ = await cluster.call("POST", writer, "/v1/topics", json={"name": "lin-t", "partitions": 1})
        assert status == 201
        status, body = await cluster.call("GET", lagging, "/v1/topics/lin-t")
        assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC"), "a local read answers from what it has"
        read = asyncio.ensure_future(cluster.call("GET", lagging, "/v1/topics/lin-t?consistency=linearizable"))
        listed = asyncio.ensure_future(cluster.call("GET", lagging, "/v1/topics?consistency=linearizable"))
        await asyncio.sleep(0.3)
        assert not read.done() and not listed.done(), "a linearizable read waits for the change"
    finally:
        runtime.deliver = deliver
        for message in held:
            deliver(message)
    status, body = await read
    assert status == 200 and body["name"] == "lin-t"
    status, body = await listed
    assert status == 200 and "lin-t" in [t["name"] for t in body["topics"]]
    status, body = await cluster.call("GET", lagging, "/v1/cluster?consistency=linearizable")
    assert status == 200 and body["metadata_leader"] == leader_id

    status, _ = await cluster.call("DELETE", lagging, "/v1/topics/lin-t")
    assert status == 204
    assert "lin-t" not in cluster.nodes[lagging].catalog.topics, "the delete's answer waited for this node"
    status, body = await cluster.call("GET", writer, "/v1/topics/lin-t?consistency=linearizable")
    assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC")
    status, body = await cluster.call("GET", writer, "/v1/topics?consistency=fresh")
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")


async def test_the_cluster_page_shows_nodes_topics_and_leaders(cluster: Cluster) -> None:
    # Goal: GET /ui is an HTML page of this node's view: the nodes with their status,
    # each topic's partitions with their leader and replicas, the metadata leader.
    await cluster.create_topic("ui-t", partitions=2)
    _, described = await cluster.call("GET", 1, "/v1/topics/ui-t")
    async with cluster.session.get(cluster.url(1, "/ui")) as response:
        assert response.status == 200 and response.content_type == "text/html"
        page = await response.text()
    assert "<h3>ui-t</h3>" in page and "node 2 sees it" in page
    for partition in described["partitions"]:
        row = (f"<tr><td>{partition['partition']}</td><td>{partition['leader']}</td>"
               f"<td>{', '.join(map(str, partition['replicas']))}</td>")
        assert row in page, row
    assert page.count("<td>alive</td>") == 3



async def test_topic_settings_change_after_creation_and_reach_every_replica(cluster: Cluster) -> None:
    # Goal: PATCH /v1/topics/{t} sets and removes settings; every node's catalog and every
    # replica's store take them (retention and segment size), a removed key is back to its
    # default; bad input is refused before anything is proposed.
    from storage.config import StoreConfig

    await cluster.create_topic("alter-t", partitions=1, config={"segment_bytes": 8192})
    status, body = await cluster.call("PATCH", 2, "/v1/topics/alter-t", json={"config": {
        "retention_ms": 60_000, "retention_bytes": 1 << 20, "segment_bytes": None, "min_insync_replicas": 2}})
    assert status == 200, body
    assert body["config"] == {"retention_ms": 60_000, "retention_bytes": 1 << 20, "min_insync_replicas": 2}
    group = cluster.nodes[0].partition_group("alter-t", 0)

    def stores_have(retention_ms, retention_bytes, segment_bytes_max) -> bool:
        return all((n.stores[group].config.retention_ms, n.stores[group].config.retention_bytes,
                    n.stores[group].config.segment_bytes_max) == (retention_ms, retention_bytes, segment_bytes_max)
                   for n in cluster.nodes)

    default_segment = cluster.nodes[0].config.segment_bytes_max
    await until(lambda: stores_have(60_000, 1 << 20, default_segment), "every replica took the settings")
    status, body = await cluster.call("PATCH", 0, "/v1/topics/alter-t", json={"config": {"retention_ms": None}})
    assert status == 200 and "retention_ms" not in body["config"], body
    await until(lambda: stores_have(StoreConfig().retention_ms, 1 << 20, default_segment), "the default is back")
    for payload, expected in [({"config": {"retention_ms": 0}}, (400, "INVALID_CONFIG")),
                              ({"config": {}}, (400, "INVALID_REQUEST")),
                              ({"config": {"retention_ms": 1}, "x": 1}, (400, "INVALID_REQUEST"))]:
        status, body = await cluster.call("PATCH", 1, "/v1/topics/alter-t", json=payload)
        assert (status, body["error_code"]) == expected, (payload, body)
    status, body = await cluster.call("PATCH", 1, "/v1/topics/nope", json={"config": {"retention_ms": 1}})
    assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC")


async def test_a_topic_has_its_own_flush_policy_and_segment_age(cluster: Cluster) -> None:
    # Goal: `flush` and `segment_ms` per topic (DESIGN.md section 4): at creation and by
    # PATCH, every replica's store takes them, a removed key is back to the node's
    # setting, records still flow, and a malformed policy is refused.
    from storage.config import FlushMode, FlushPolicy, StoreConfig

    await cluster.create_topic("flush-t", partitions=1, config={"flush": "none", "segment_ms": 60_000})
    group = cluster.nodes[0].partition_group("flush-t", 0)

    def stores(flush: FlushPolicy, segment_ms: int) -> bool:
        return all((n.stores[group].config.flush, n.stores[group].config.segment_ms_max) == (flush, segment_ms)
                   for n in cluster.nodes)

    await until(lambda: stores(FlushPolicy(FlushMode.NONE), 60_000), "created with the topic's policy")
    status, body = await cluster.call("POST", 0, "/v1/topics/flush-t/records", json={"records": [{"value": 1}]})
    assert status == 200, body
    status, body = await cluster.call("PATCH", 1, "/v1/topics/flush-t",
                                      json={"config": {"flush": "interval_ms=50", "segment_ms": None}})
    assert status == 200 and body["config"] == {"flush": "interval_ms=50"}, body
    default_ms = StoreConfig().segment_ms_max
    await until(lambda: stores(FlushPolicy(FlushMode.INTERVAL, 50), default_ms), "the new policy everywhere")
    status, body = await cluster.call("PATCH", 1, "/v1/topics/flush-t", json={"config": {"flush": None}})
    assert status == 200
    await until(lambda: stores(cluster.nodes[0].config.flush, default_ms), "the node's policy again")
    status, body = await cluster.call("POST", 2, "/v1/topics/flush-t/records", json={"records": [{"value": 2}]})
    assert status == 200 and body["offsets"][0]["offset"] == 1, body
    for bad in ("sometimes", "interval_ms=0", "interval_ms=x", 5):
        status, body = await cluster.call("PATCH", 0, "/v1/topics/flush-t", json={"config": {"flush": bad}})
        assert (status, body["error_code"]) == (400, "INVALID_CONFIG"), (bad, body)
