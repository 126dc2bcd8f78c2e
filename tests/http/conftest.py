"""A real 3-node cluster in one event loop, each node serving its HTTP API on loopback.

Nodes run on 127.0.0.1-3 with real sockets, files and fsync; each node's app
listens on its own address (a free port). One cluster serves the whole package
(forming one takes about a second), so tests use their own topics.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio

from multiraft.http import HttpServer
from multiraft.node.config import Address
from multiraft.node.node import Node
from raftlog.messages import Role
from tests.node.test_node_cluster import at_build_level, configs, free_port, until

STARTUP_TIMEOUT_S = 30.0


@dataclass
class Cluster:
    nodes: list[Node]
    servers: list[HttpServer]
    session: aiohttp.ClientSession

    def url(self, node_index: int, path: str) -> str:
        return self.servers[node_index].url + path

    async def call(self, method: str, node_index: int, path: str, **kwargs: Any) -> tuple[int, Any]:
        """One request; the decoded JSON body (or text for non-JSON answers) and the status."""
        async with asyncio.timeout(20):
            async with self.session.request(method, self.url(node_index, path), **kwargs) as response:
                if response.content_type == "application/json":
                    return response.status, await response.json()
                return response.status, await response.read()

    async def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                           config: dict[str, Any] | None = None) -> dict[str, Any]:
        status, body = await self.call("POST", 0, "/v1/topics", json={
            "name": name, "partitions": partitions, "replication_factor": replication_factor,
            "config": config or {}})
        assert status == 201, body
        await until(lambda: all(self._has_leaders(n, name) for n in self.nodes), f"leaders of {name}")
        return body

    async def create_topic_wait(self, name: str) -> None:
        """Wait until a topic created elsewhere has leaders seen by every node."""
        await until(lambda: all(self._has_leaders(n, name) for n in self.nodes), f"leaders of {name}")

    def _has_leaders(self, node: Node, topic: str) -> bool:
        info = node.catalog.topics.get(topic)
        if info is None:
            return False
        for partition in info.partitions:
            runtime = node.groups.get(partition.group_id)
            if runtime is None and node.id in partition.replicas:
                return False  # still opening it (groups open in chunks, each made durable first)
            if runtime is not None and runtime.core.leader == 0:
                return False
            if runtime is not None and runtime.core.role is Role.LEADER and (
                runtime.core.applied_index < runtime.core.commit_index
                # Until it commits an entry of its own term it refuses produces (retriable).
                or runtime.core.log.term_or_none(runtime.core.commit_index) != runtime.core.term
            ):
                return False
        return True


@pytest_asyncio.fixture(loop_scope="package", scope="package")
async def cluster(tmp_path_factory: Any) -> AsyncIterator[Cluster]:
    tmp_path: Path = tmp_path_factory.mktemp("http-cluster")
    cfgs = [dataclasses.replace(c, http_addr=Address(c.raft_addr.host, free_port(c.raft_addr.host)))
            for c in configs(tmp_path)]
    nodes = [Node(c) for c in cfgs]
    servers = [HttpServer(n.api, n.config.http_addr.host, n.config.http_addr.port) for n in nodes]
    session = aiohttp.ClientSession()
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            for node, server in zip(nodes, servers, strict=True):
                await node.start()
                await server.start()
            await until(lambda: all(n.registered.is_set() for n in nodes), "every node registered")
            await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "3 nodes in every catalog")
            await at_build_level(nodes)  # what the gated commands' tests (HTTPS links, the fuzz pass) need
        yield Cluster(nodes, servers, session)
    finally:
        await session.close()
        for server in servers:
            await server.stop()
        for node in nodes:
            await node.stop()
