"""Goal (issue 21, family 4): no HTTP client can change where the cluster finds a node.

An unsigned admission, or one signed with another secret, or an old one, is 403 and
the catalog keeps every node's addresses; the node itself (holding the cluster
secret) re-registers as before."""

from __future__ import annotations

import json
import time

import pytest

from multiraft.node import admission
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
PATH = "/v1/admin/nodes"


def _addresses(cluster: Cluster) -> list[dict[int, tuple[str, str]]]:
    return [{n.node_id: (n.raft_addr, n.http_addr) for n in node.catalog.nodes.values()} for node in cluster.nodes]


async def test_an_unsigned_admission_cannot_move_a_node(cluster: Cluster) -> None:
    before = _addresses(cluster)
    hijack = json.dumps({"node_id": 2, "raft_addr": "127.0.0.9:1", "http_addr": "127.0.0.9:2"}).encode()
    newcomer = json.dumps({"node_id": 77, "raft_addr": "127.0.0.9:1", "http_addr": "127.0.0.9:2"}).encode()
    now = time.time()
    secret = cluster.nodes[0].config.cluster_secret
    attempts = [
        (hijack, {}), (newcomer, {}),
        (hijack, admission.sign(b"another secret of at least 32 bytes!", hijack, now)),
        (hijack, admission.sign(secret, hijack, now - 3600)),  # a capture an hour old
        (hijack, admission.sign(secret, newcomer, now)),  # signed for another body
    ]
    for body, headers in attempts:
        status, answer = await cluster.call("POST", 1, PATH, data=body,
                                            headers={"Content-Type": "application/json", **headers})
        assert (status, answer["error_code"]) == (403, "NOT_AUTHORIZED"), (headers, answer)
    assert _addresses(cluster) == before


async def test_the_node_itself_re_registers_with_its_own_signature(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    body = json.dumps({"node_id": node.id, "raft_addr": str(node.config.raft_addr),
                       "http_addr": str(node.config.http_addr)}).encode()
    headers = {"Content-Type": "application/json", **admission.sign(node.config.cluster_secret, body, time.time())}
    status, answer = await cluster.call("POST", 0, PATH, data=body, headers=headers)
    assert status == 200 and set(answer["nodes"]) == {"1", "2", "3"}, answer
