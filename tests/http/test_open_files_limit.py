"""Goal (issue 21, family 6): a topic creation that would put more replicas on a node
than its open-files limit can hold is refused over HTTP with 400 INVALID_PARTITIONS
naming the limit, and nothing is created; one that fits is created.

The node's own setting (`Node.open_files_limit`, the soft RLIMIT_NOFILE it raised at
start) is lowered on every node of the package's cluster, whichever is controller,
to leave room for ROOM new replicas; it is restored afterwards. Deleting the check
in the controller's creation path (`metadata_ops._create_topic_as_controller`) fails
this test.
"""

from __future__ import annotations

import pytest

from multiraft.node import open_files
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

ROOM = 20


async def test_a_creation_beyond_the_open_files_limit_is_invalid_partitions(cluster: Cluster) -> None:
    saved = [node.open_files_limit for node in cluster.nodes]
    try:
        for node in cluster.nodes:
            node.open_files_limit = open_files.RESERVED_FDS + open_files.open_now() + ROOM
        status, body = await cluster.call("POST", 1, "/v1/topics", json={
            "name": "too-many-files", "partitions": 2 * ROOM, "replication_factor": 3})
        assert status == 400 and body["error_code"] == "INVALID_PARTITIONS", body
        assert "open-files limit" in body["message"] and "ulimit" in body["message"], body
        status, body = await cluster.call("GET", 1, "/v1/topics/too-many-files")
        assert status == 404, body
        await cluster.create_topic("few-enough-files", partitions=2)
    finally:
        for node, limit in zip(cluster.nodes, saved, strict=True):
            node.open_files_limit = limit
