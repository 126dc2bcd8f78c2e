"""Goal: a source's tree routes (a mirror's full sync, docs/mirror.md) answer the contract's
shape from every node, agree with each other, are bounded, and refuse what they cannot
mean with the state's codes; the sink's verify route refuses an unknown link, a topic
that is not its mirror and unknown fields (the full sync itself: tests/node/test_mirror_fullsync.py)."""

from __future__ import annotations

import pytest

from storage.tictac import DIGEST_BYTES
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def test_every_node_serves_the_same_tree_and_its_nodes(cluster: Cluster) -> None:
    await cluster.create_topic("trees-t", partitions=1, replication_factor=3)
    await cluster.create_topic_wait("trees-t")
    for _ in range(3):
        status, body = await cluster.call("POST", 0, "/v1/topics/trees-t/partitions/0/records",
                                          json={"format": "string", "records": [{"value": "v"}] * 10})
        assert status == 200, body
    roots = set()
    for node in range(3):
        status, tree = await cluster.call("GET", node, "/v1/topics/trees-t/partitions/0/tree?hi=30")
        assert status == 200, tree
        if tree["hi"] < 30:  # a follower answers what it applied: "behind", not different
            continue
        assert (tree["lo"], tree["hi"], tree["depth"], tree["damaged"]) == (0, 30, 1, []), tree
        assert tree["log_start_offset"] == 0 and tree["high_watermark"] >= 30
        roots.add(tree["root"])
        status, nodes = await cluster.call("GET", node, "/v1/topics/trees-t/partitions/0/tree/nodes"
                                                        "?lo=0&hi=30&level=0&positions=0,1,5")
        assert status == 200, nodes
        root, *rest = nodes["digests"]
        assert root == tree["root"] and rest == ["00" * DIGEST_BYTES] * 2  # one leaf; absent ones read zero
        status, above = await cluster.call("GET", node, "/v1/topics/trees-t/partitions/0/tree/nodes"
                                                        "?lo=0&hi=30&level=63&positions=0")
        assert status == 200 and above["digests"] == [tree["root"]]  # above the root: the root
    assert len(roots) == 1, "every replica holding the span has one root"


async def test_tree_routes_refuse_what_they_cannot_mean(cluster: Cluster) -> None:
    await cluster.create_topic("trees-r", partitions=1, replication_factor=3)
    await cluster.create_topic_wait("trees-r")
    base = "/v1/topics/trees-r/partitions/0/tree"
    for path, expected in (
        ("/v1/topics/no-such/partitions/0/tree", (404, "UNKNOWN_TOPIC")),
        (f"{base}?lo=5", (416, "OFFSET_OUT_OF_RANGE")),  # past the high watermark (0)
        (f"{base}/nodes?lo=0&hi=5&level=0&positions=0", (416, "OFFSET_OUT_OF_RANGE")),  # not a span it holds
        (f"{base}/nodes?lo=0&hi=0&level=0&positions=" + ",".join(["0"] * 257), (400, "INVALID_REQUEST")),
        (f"{base}/nodes?lo=0&hi=0&level=0&positions=-1", (400, "INVALID_REQUEST")),
        (f"{base}/nodes?lo=0&hi=0&level=64&positions=0", (400, "INVALID_REQUEST")),
        (f"{base}/nodes?lo=0&hi=0&level=0", (400, "INVALID_REQUEST")),
        (f"{base}?lo=-1", (400, "INVALID_REQUEST")),
    ):
        status, body = await cluster.call("GET", 0, path)
        assert (status, body["error_code"]) == expected, (path, body)
    status, empty = await cluster.call("GET", 1, f"{base}?lo=0&hi={2**63 - 1}")
    assert status == 200 and (empty["lo"], empty["hi"], empty["depth"]) == (0, 0, 1), empty
    status, nodes = await cluster.call("GET", 1, f"{base}/nodes?lo=0&hi=0&level=0&positions=0")
    assert status == 200 and nodes["digests"] == ["00" * DIGEST_BYTES]


async def test_verify_refuses_an_unknown_link_a_topic_not_its_mirror_and_unknown_fields(cluster: Cluster) -> None:
    status, body = await cluster.call("POST", 0, "/v1/admin/mirrors/nobody/verify", json={})
    assert (status, body["error_code"]) == (404, "UNKNOWN_MIRROR_LINK")
    status, body = await cluster.call("POST", 0, "/v1/admin/mirrors/nobody/verify", json={"topics": ["x"]})
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")
    status, body = await cluster.call("POST", 0, "/v1/admin/mirrors/nobody/verify", json={"repair": "yes"})
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")
    status, link = await cluster.call("POST", 0, "/v1/admin/mirrors", json={
        "name": "trees-link", "sources": ["127.0.0.1:1"], "topics": "no-topic-matches-this"})
    assert status == 201, link
    try:
        status, body = await cluster.call("POST", 1, "/v1/admin/mirrors/trees-link/verify", json={})
        assert status == 200 and (body["total"], body["next_start"], body["all_identical"]) == (0, None, True), body
        await cluster.create_topic("trees-plain", partitions=1, replication_factor=1)
        status, body = await cluster.call("POST", 1, "/v1/admin/mirrors/trees-link/verify",
                                          json={"topic": "trees-plain"})
        assert (status, body["error_code"]) == (409, "NOT_A_MIRROR"), body
        status, body = await cluster.call("POST", 1, "/v1/admin/mirrors/trees-link/verify", json={"start": 1})
        assert (status, body["error_code"]) == (416, "OFFSET_OUT_OF_RANGE"), body
    finally:
        status, _ = await cluster.call("DELETE", 0, "/v1/admin/mirrors/trees-link")
        assert status == 204
