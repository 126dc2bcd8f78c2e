"""Goal: the live-operation routes (issue 25) answer the contract over real HTTP on every
node: `POST /v1/topics/{topic}/partitions` grows a topic (the new partitions elect and
take records through the topic produce route) and refuses what is not an increase
with 400 INVALID_PARTITIONS, a bad body with 400, an unknown topic with 404;
`POST`/`DELETE /v1/admin/nodes/{node}/drain` mark and clear a drain, show in
`GET /v1/cluster` (per node `drained`, `partitions_led`), refuse an unknown node (404),
a malformed id (400) and the drain of the last node left to lead (400)."""

from __future__ import annotations

import asyncio

import pytest

from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def test_partitions_grow_and_only_grow(cluster: Cluster) -> None:
    await cluster.create_topic("grow-t", partitions=2, replication_factor=3)
    for body, code in (({"count": 2}, "INVALID_PARTITIONS"), ({"count": 1}, "INVALID_PARTITIONS"),
                       ({"count": 0}, "INVALID_PARTITIONS"), ({"count": 10_001}, "INVALID_PARTITIONS"),
                       ({"count": "3"}, "INVALID_PARTITIONS"), ({"count": True}, "INVALID_PARTITIONS"),
                       ({}, "INVALID_REQUEST"), ({"count": 3, "extra": 1}, "INVALID_REQUEST")):
        status, answer = await cluster.call("POST", 1, "/v1/topics/grow-t/partitions", json=body)
        assert (status, answer["error_code"]) == (400, code), (body, answer)
    status, answer = await cluster.call("POST", 1, "/v1/topics/grow-t/partitions", json={"count": 2})
    assert "has 2 partitions" in answer["message"] and "only be added" in answer["message"]
    status, answer = await cluster.call("POST", 0, "/v1/topics/nope-t/partitions", json={"count": 3})
    assert (status, answer["error_code"]) == (404, "UNKNOWN_TOPIC")
    status, answer = await cluster.call("POST", 0, "/v1/topics/grow-t/partitions", data=b"count=3")
    assert status in (400, 415), answer

    status, answer = await cluster.call("POST", 2, "/v1/topics/grow-t/partitions", json={"count": 4})
    assert status == 200, answer
    assert [p["partition"] for p in answer["partitions"]] == [0, 1, 2, 3]
    await cluster.create_topic_wait("grow-t")
    for i in range(3):
        status, listed = await cluster.call("GET", i, "/v1/topics")
        assert {"name": "grow-t", "partitions": 4, "replication_factor": 3} in listed["topics"]
    # Round-robin records reach the new partitions too.
    status, produced = await cluster.call("POST", 0, "/v1/topics/grow-t/records",
                                          json={"records": [{"value": i} for i in range(8)]})
    assert status == 200, produced
    assert {o["partition"] for o in produced["offsets"]} == {0, 1, 2, 3}
    status, read = await cluster.call("GET", 1, "/v1/topics/grow-t/partitions/3/records",
                                      params={"offset": 0, "wait_ms": 2000})
    assert status == 200 and read["records"], read


async def test_drain_and_undrain_over_http(cluster: Cluster) -> None:
    for path, status_code, code in (("/v1/admin/nodes/9/drain", 404, "UNKNOWN_NODE"),
                                    ("/v1/admin/nodes/0/drain", 400, "INVALID_REQUEST"),
                                    ("/v1/admin/nodes/x/drain", 400, "INVALID_REQUEST"),
                                    ("/v1/admin/nodes/99999999999/drain", 400, "INVALID_REQUEST")):
        for method in ("POST", "DELETE"):
            status, answer = await cluster.call(method, 0, path)
            assert (status, answer["error_code"]) == (status_code, code), (method, path, answer)
    try:
        status, answer = await cluster.call("POST", 1, "/v1/admin/nodes/3/drain")
        assert status == 200 and answer["node_id"] == 3 and answer["drained"] is True, answer
        assert set(answer) == {"node_id", "drained", "partitions_led", "leads_metadata"}
        status, answer = await cluster.call("POST", 0, "/v1/admin/nodes/3/drain")
        assert status == 200 and answer["drained"], "draining again is a no-op"
        status, answer = await cluster.call("POST", 0, "/v1/admin/nodes/2/drain")
        assert status == 200, answer
        status, answer = await cluster.call("POST", 2, "/v1/admin/nodes/1/drain")
        assert (status, answer["error_code"]) == (400, "INVALID_REQUEST") and "no node to lead" in answer["message"]
        await until(lambda: all(n.catalog.drained_nodes() == {2, 3} for n in cluster.nodes), "marks everywhere")
        for i in range(3):
            status, view = await cluster.call("GET", i, "/v1/cluster")
            nodes = {n["node_id"]: n for n in view["nodes"]}
            assert [nodes[n]["drained"] for n in (1, 2, 3)] == [False, True, True]
            assert all(isinstance(n["partitions_led"], int) for n in view["nodes"])
            assert sorted(view["metadata_voters"]) == [1, 2, 3]
    finally:
        for node_id in (2, 3):
            status, answer = await cluster.call("DELETE", 0, f"/v1/admin/nodes/{node_id}/drain")
            assert status == 200 and answer["drained"] is False, answer
    await until(lambda: all(not n.catalog.drained_nodes() for n in cluster.nodes), "undrained everywhere")


async def test_decommission_routes_over_http(cluster: Cluster) -> None:
    # Goal: the routes' shapes and refusals on the shared three nodes (the accepted path,
    # four nodes, is tests/node/test_decommission.py): an RF-3 topic leaves a member's
    # replicas nowhere to go, so its decommission is refused and nothing is marked.
    for path, status_code, code in (("/v1/admin/nodes/9/decommission", 404, "UNKNOWN_NODE"),
                                    ("/v1/admin/nodes/0/decommission", 400, "INVALID_REQUEST"),
                                    ("/v1/admin/nodes/x/decommission", 400, "INVALID_REQUEST")):
        for method in ("GET", "POST", "DELETE"):
            status, answer = await cluster.call(method, 0, path)
            assert (status, answer["error_code"]) == (status_code, code), (method, path, answer)
    await cluster.create_topic("decommission-guard", partitions=1, replication_factor=3)
    status, answer = await cluster.call("POST", 1, "/v1/admin/nodes/3/decommission")
    assert (status, answer["error_code"]) == (409, "CLUSTER_TOO_SMALL") and "replication factor" in answer["message"]
    for i in range(3):
        status, answer = await cluster.call("GET", i, "/v1/admin/nodes/3/decommission")
        assert status == 200 and answer["replicas"] >= 1, answer  # other tests' topics may add some
        assert answer == {"node_id": 3, "decommissioning": False, "stage": None, "replicas": answer["replicas"],
                          "partitions_led": answer["partitions_led"], "metadata_member": "voter",
                          "waiting_for": ""}, answer
        status, view = await cluster.call("GET", i, "/v1/cluster")
        assert not any(n["decommissioning"] for n in view["nodes"]), view
    status, answer = await cluster.call("DELETE", 2, "/v1/admin/nodes/3/decommission")  # a no-op recommission
    assert status == 200 and answer["decommissioning"] is False, answer
    status, _ = await cluster.call("DELETE", 0, "/v1/topics/decommission-guard")
    assert status == 204


async def test_the_move_throttle_is_a_cluster_setting(cluster: Cluster) -> None:
    # Goal: GET shows each node's own rate with no cluster setting; PATCH sets it for every
    # node (each answers it as its value), null gives each node its own back; unknown keys,
    # wrong types and out-of-range values are INVALID_CONFIG, and change nothing.
    own = cluster.nodes[0].config.replica_move_bytes_per_s
    status, answer = await cluster.call("GET", 1, "/v1/admin/config")
    assert status == 200 and answer == {"replica_move_bytes_per_s": {"value": own, "cluster": None}}, answer
    for body in ({}, {"replica_move_bytes_per_s": -1}, {"replica_move_bytes_per_s": "fast"},
                 {"replica_move_bytes_per_s": True}, {"replica_move_bytes_per_s": 2**41}, {"retention_ms": 5},
                 {"replica_move_bytes_per_s": 1.5}):
        status, refused = await cluster.call("PATCH", 0, "/v1/admin/config", json=body)
        assert (status, refused["error_code"]) == (400, "INVALID_CONFIG"), (body, refused)
    try:
        status, answer = await cluster.call("PATCH", 2, "/v1/admin/config", json={"replica_move_bytes_per_s": 1234})
        assert status == 200 and answer["replica_move_bytes_per_s"] == {"value": 1234, "cluster": 1234}, answer
        await until(lambda: all(n.move_throttle._rate() == 1234 for n in cluster.nodes), "every node's throttle")
    finally:
        status, answer = await cluster.call("PATCH", 0, "/v1/admin/config", json={"replica_move_bytes_per_s": None})
        assert status == 200 and answer["replica_move_bytes_per_s"] == {"value": own, "cluster": None}, answer
    await until(lambda: all(n.move_throttle._rate() == own for n in cluster.nodes), "each node's own again")


async def test_the_client_grows_a_topic_and_its_producer_sees_the_new_partitions(cluster: Cluster) -> None:
    # Goal: the client method, and a running producer taking the new count: at once for a
    # record naming a new partition, and after its metadata age for unkeyed records.
    from multiraft.client import AsyncClient, AsyncProducer

    async with asyncio.timeout(60):
        async with AsyncClient([s.url for s in cluster.servers], backoff_s=0.01) as client:
            await client.create_topic("grow-client-t", partitions=1, replication_factor=3)
            await cluster.create_topic_wait("grow-client-t")
            async with AsyncProducer(client, "grow-client-t", linger_ms=0, metadata_max_age_ms=200) as producer:
                assert producer.partitions == 1
                assert (await (await producer.send(b"before")))[0] == 0
                grown = await client.create_partitions("grow-client-t", 3)
                assert len(grown["partitions"]) == 3
                await cluster.create_topic_wait("grow-client-t")
                assert (await (await producer.send(b"named", partition=2)))[0] == 2, "refreshed for it"
                await client.create_partitions("grow-client-t", 4)
                await cluster.create_topic_wait("grow-client-t")
                await asyncio.sleep(0.3)  # past the metadata age: the next send refreshes in the background
                seen = {(await (await producer.send(b"spread")))[0] for _ in range(12)}
                assert seen == {0, 1, 2, 3} and producer.partitions == 4
