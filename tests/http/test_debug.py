"""Goal: the debug routes the chaos runner's end-of-run checks read exist only when the
node was started with RAFTLOG_CHAOS_DEBUG=1 (404 NOT_FOUND in the one error shape
otherwise), and answer what docs/http.md says: every hosted group's Raft and log state,
and a SHA-256 of a replica's entries 1..upto that is identical on every replica of a
group and follows the documented encoding.

The package's shared cluster runs without the variable (the disabled case). For the
enabled case each node gets a second app built as the variable would build it (the
routes are fixed when an app is built), on a free port, over the same nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from multiraft.http import HttpServer
from raftlog.types import Index
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


@contextlib.asynccontextmanager
async def debug_servers(cluster: Cluster) -> AsyncIterator[list[str]]:
    """The base URL of a debug-enabled app on every node."""
    servers: list[HttpServer] = []
    try:
        for node in cluster.nodes:
            saved = node.api.hooks  # what the app reads when it is built (its routes)
            node.api.hooks = dataclasses.replace(saved, debug_endpoints=True)
            try:
                server = HttpServer(node.api, node.config.http_addr.host, 0)
                await server.start()
            finally:
                node.api.hooks = saved
            servers.append(server)
        yield [server.url for server in servers]
    finally:
        for server in servers:
            await server.stop()


async def get(session: aiohttp.ClientSession, url: str, **params: Any) -> tuple[int, Any]:
    async with session.get(url, params=params) as response:
        return response.status, await response.json()


async def test_debug_routes_are_not_found_unless_enabled(cluster: Cluster) -> None:
    for path in ("/v1/debug/groups", "/v1/debug/groups/0/digest", "/v1/debug/groups/0/digest?upto=1"):
        status, body = await cluster.call("GET", 0, path)
        assert status == 404 and body["error_code"] == "NOT_FOUND" and set(body) == {"error_code", "message"}


async def _partition_group(cluster: Cluster, topic: str, values: int) -> int:
    await cluster.create_topic(topic, partitions=1, replication_factor=3)
    for i in range(values):
        status, body = await cluster.call("POST", 0, f"/v1/topics/{topic}/records",
                                          json={"records": [{"value": i, "partition": 0}]})
        assert status == 200, body
    return cluster.nodes[0].partition_group(topic, 0)


async def test_groups_view(cluster: Cluster) -> None:
    group_id = await _partition_group(cluster, "debug-view", 3)
    await until(lambda: all(n.partitions[group_id].state.high_watermark == 3 for n in cluster.nodes),
                "every replica applied the records")
    async with debug_servers(cluster) as urls, aiohttp.ClientSession() as session:
        for node, url in zip(cluster.nodes, urls, strict=True):
            status, body = await get(session, url + "/v1/debug/groups")
            assert status == 200 and body["node_id"] == node.id, body
            found = {g["group_id"]: g for g in body["groups"]}
            assert sorted(found) == sorted(node.groups), "every group hosted here, no other"
            metadata, partition = found[0], found[group_id]
            assert (metadata["topic"], metadata["partition"], metadata["high_watermark"],
                    metadata["skipped_ranges"]) == (None, None, None, None)
            assert (partition["topic"], partition["partition"]) == ("debug-view", 0)
            assert partition["high_watermark"] == 3 and partition["log_end_offset"] == 3
            assert partition["skipped_ranges"] == []
            assert partition["log_start_index"] == 1 and partition["log_start_offset"] == 0
            assert partition["last_index"] >= partition["commit_index"] >= partition["applied_index"]
            assert partition["voters"] == [1, 2, 3] and partition["needs_repair"] is False
            # Leadership may move meanwhile (the balancer): checked for shape, not for agreement.
            assert partition["role"] in ("leader", "follower") and partition["term"] >= 1
            assert partition["leader"] in (1, 2, 3) and partition["vote"] in (None, 1, 2, 3)


def _reference_digest(cluster: Cluster, group_id: int, upto: int, start: int = 1) -> str:
    # The encoding docs/http.md documents, computed here from node 1's store.
    hashed = hashlib.sha256()
    store = cluster.nodes[0].stores[group_id]
    for info, payload in store.frames(Index(start), Index(upto + 1)):
        hashed.update(struct.pack(">QQBQII", info.index, info.term, info.kind, info.base_offset,
                                  info.record_count, len(payload)))
        hashed.update(payload)
    return hashed.hexdigest()


async def test_digest_agrees_across_replicas(cluster: Cluster) -> None:
    group_id = await _partition_group(cluster, "debug-digest", 4)
    async with debug_servers(cluster) as urls, aiohttp.ClientSession() as session:
        await until(lambda: all(n.partitions[group_id].state.high_watermark == 4 for n in cluster.nodes),
                    "every replica applied the records")
        upto = min(n.groups[group_id].core.commit_index for n in cluster.nodes)
        answers = [(await get(session, url + f"/v1/debug/groups/{group_id}/digest", upto=upto))[1] for url in urls]
        assert len({a["sha256"] for a in answers}) == 1, answers
        assert answers[0]["sha256"] == _reference_digest(cluster, group_id, upto)
        for node, answer in zip(cluster.nodes, answers, strict=True):
            assert answer["node_id"] == node.id and answer["group_id"] == group_id and answer["upto"] == upto
            assert answer["committed"] is True and answer["commit_index"] >= upto

        status, answer = await get(session, urls[1] + f"/v1/debug/groups/{group_id}/digest")
        assert status == 200 and answer["upto"] == answer["commit_index"], "upto defaults to the commit index"
        _, earlier = await get(session, urls[1] + f"/v1/debug/groups/{group_id}/digest", upto=upto - 1)
        assert earlier["sha256"] != answers[0]["sha256"]
        _, empty = await get(session, urls[1] + f"/v1/debug/groups/{group_id}/digest", upto=0)
        assert empty["sha256"] == hashlib.sha256().hexdigest()
        _, since = await get(session, urls[1] + f"/v1/debug/groups/{group_id}/digest", upto=upto, **{"from": 2})
        assert (since["from"], since["sha256"]) == (2, _reference_digest(cluster, group_id, upto, 2))
        _, metadata = await get(session, urls[2] + "/v1/debug/groups/0/digest")
        assert metadata["group_id"] == 0 and len(metadata["sha256"]) == 64

        for path, params, status_expected, code in (
            (f"/v1/debug/groups/{group_id}/digest", {"upto": 10**9}, 400, "INVALID_REQUEST"),
            (f"/v1/debug/groups/{group_id}/digest", {"upto": "-1"}, 400, "INVALID_REQUEST"),
            (f"/v1/debug/groups/{group_id}/digest", {"from": "x"}, 400, "INVALID_REQUEST"),
            ("/v1/debug/groups/x/digest", {}, 400, "INVALID_REQUEST"),
            ("/v1/debug/groups/999999/digest", {}, 404, "NOT_FOUND"),
        ):
            status, body = await get(session, urls[0] + path, **params)
            assert (status, body["error_code"]) == (status_expected, code), (path, params, body)
