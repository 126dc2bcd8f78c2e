"""Goal (issue 26 B): `GET /v1/health?ready=cluster` answers 200 only when the node sees a
metadata leader and every known node live, 503 CLUSTER_NOT_READY (the one error shape,
naming what is missing) otherwise, and 400 for a `ready` value it does not know; plain
`GET /v1/health` stays a liveness answer. A topic created while a node of the initial
cluster is still starting waits for it (bounded) instead of being refused at once, and
is refused as before once the wait is over.

The ready answer runs against the package's cluster; the start-up cases start their
own three nodes one by one on the same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.http import HttpServer
from multiraft.node import metadata_ops
from multiraft.node.node import Node
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import configs, free_port, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def _get(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with asyncio.timeout(20), session.request("GET", url, **kwargs) as response:
        return response.status, await response.json()


async def test_a_ready_cluster_answers_ready(cluster: Cluster) -> None:
    for index in range(3):
        status, body = await cluster.call("GET", index, "/v1/health?ready=cluster")
        assert status == 200, body
        assert body["ready"] == "cluster" and body["nodes"] == [1, 2, 3]
        assert body["metadata_leader"] in (1, 2, 3) and body["registered"] is True
        status, body = await cluster.call("GET", index, "/v1/health")
        assert status == 200 and "ready" not in body, "plain health is liveness only"


@pytest.mark.parametrize("value", ["", "node", "CLUSTER", "cluster,node"])
async def test_an_unknown_ready_value_is_refused(cluster: Cluster, value: str) -> None:
    status, body = await cluster.call("GET", 0, "/v1/health", params={"ready": value})
    assert status == 400
    assert set(body) == {"error_code", "message"} and body["error_code"] == "INVALID_REQUEST"
    assert "ready" in body["message"]


class Starting:
    """Three node configs of one cluster on this loop; nodes start when a test says."""

    def __init__(self, tmp_path: Path, **overrides: int) -> None:
        self.configs = configs(tmp_path, **overrides)
        self.nodes: list[Node] = []
        self.servers: list[HttpServer] = []

    async def start(self, index: int) -> str:
        """Start node `index` (0-based) and its HTTP server; its base URL."""
        config = self.configs[index]
        node = Node(config)
        server = HttpServer(node.api, config.http_addr.host, free_port(config.http_addr.host))
        await node.start()
        await server.start()
        self.nodes.append(node)
        self.servers.append(server)
        return server.url

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()
        for node in self.nodes:
            await node.stop()


@contextlib.asynccontextmanager
async def starting(tmp_path: Path) -> AsyncIterator[tuple[Starting, aiohttp.ClientSession]]:
    cluster = Starting(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            yield cluster, session
    finally:
        await cluster.stop()


async def test_not_ready_names_what_is_missing_until_every_node_is_live(tmp_path: Path) -> None:
    async with asyncio.timeout(60), starting(tmp_path) as (cluster, session):
        first = await cluster.start(0)
        status, body = await _get(session, first + "/v1/health?ready=cluster")
        assert status == 503
        assert set(body) == {"error_code", "message"} and body["error_code"] == "CLUSTER_NOT_READY"
        assert "no metadata leader" in body["message"] and "2, 3" in body["message"], body
        assert (await _get(session, first + "/v1/health"))[0] == 200, "alive all the same"

        await cluster.start(1)  # a quorum: a leader, nodes 1 and 2 register; node 3 never started
        await until(lambda: all(len(n.catalog.nodes) == 2 for n in cluster.nodes), "two registered")
        status, body = await _get(session, first + "/v1/health?ready=cluster")
        assert (status, body["error_code"]) == (503, "CLUSTER_NOT_READY")
        assert "not registered yet: 3" in body["message"] and "no metadata leader" not in body["message"], body

        await cluster.start(2)

        async def ready_everywhere() -> bool:
            for server in cluster.servers:
                if (await _get(session, server.url + "/v1/health?ready=cluster"))[0] != 200:
                    return False
            return True

        async with asyncio.timeout(30):
            while not await ready_everywhere():
                await asyncio.sleep(0.05)


async def test_a_create_during_start_up_waits_for_the_nodes_it_needs(tmp_path: Path) -> None:
    # RF 3 asked while node 3 is still starting: the create waits and succeeds once it is in.
    async with asyncio.timeout(60), starting(tmp_path) as (cluster, session):
        first = await cluster.start(0)
        await cluster.start(1)

        async def create() -> tuple[int, Any]:
            async with session.post(first + "/v1/topics", json={"name": "early", "replication_factor": 3,
                                                                 "partitions": 2}) as response:
                return response.status, await response.json()

        creating = asyncio.create_task(create())
        await asyncio.sleep(0.5)
        assert not creating.done(), "waiting for node 3, not refused at once"
        await cluster.start(2)
        status, body = await creating
        assert status == 201, body
        assert all(len(p["replicas"]) == 3 for p in body["partitions"])


async def test_a_create_during_start_up_is_refused_after_the_wait(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Node 3 never comes: after the bounded wait the refusal is today's.
    monkeypatch.setattr(metadata_ops, "CREATE_START_UP_WAIT_S", 1.0)
    async with asyncio.timeout(60), starting(tmp_path) as (cluster, session):
        first = await cluster.start(0)
        await cluster.start(1)
        await until(lambda: all(len(n.catalog.nodes) == 2 for n in cluster.nodes), "two registered")
        started = time.monotonic()
        async with session.post(first + "/v1/topics", json={"name": "never", "replication_factor": 3}) as response:
            status, body = response.status, await response.json()
        assert (status, body["error_code"]) == (400, "INVALID_REPLICATION_FACTOR"), body
        assert "exceeds the 2 live nodes" in body["message"]
        assert time.monotonic() - started >= 1.0, "waited first"
        async with session.post(first + "/v1/topics", json={"name": "fits", "replication_factor": 2}) as response:
            assert response.status == 201, "what the live nodes can hold is created without waiting"
