"""Consumer group offsets over real in-process nodes: retention and deletion.

Three nodes in one event loop with their HTTP APIs on loopback (real sockets, files,
fsync), as tests/node/test_node_cluster.py. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.node.node import Node
from raftlog.messages import EntryKind, Role
from raftlog.types import GroupId, Index
from tests.node.test_node_cluster import running_cluster_with_http, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
RETENTION_MS = 1500
CHECK_MS = 100
PARTITIONS = 2


async def call(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with asyncio.timeout(20), session.request(method, url, **kwargs) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.read()


async def topic_with_records(session: aiohttp.ClientSession, url: str, nodes: list[Node], topic: str) -> None:
    """A topic of PARTITIONS partitions, RF 3, each holding 3 records, led everywhere."""
    status, body = await call(session, "POST", url + "/v1/topics",
                              json={"name": topic, "partitions": PARTITIONS, "replication_factor": 3})
    assert status == 201, body
    for partition in range(PARTITIONS):
        async with asyncio.timeout(20):
            while True:
                status, body = await call(session, "POST", f"{url}/v1/topics/{topic}/partitions/{partition}/records",
                                          json={"records": [{"value": i} for i in range(3)]})
                if status == 200:
                    break
                assert body["error_code"] in ("LEADER_NOT_AVAILABLE", "NOT_LEADER", "PROPOSAL_DROPPED"), body
                await asyncio.sleep(0.05)


async def commit(session: aiohttp.ClientSession, url: str, group: str, topic: str, offset: int = 1) -> None:
    offsets = [{"topic": topic, "partition": p, "offset": offset} for p in range(PARTITIONS)]
    status, body = await call(session, "POST", f"{url}/v1/groups/{group}/offsets", json={"offsets": offsets})
    assert status == 200, body


async def committed(session: aiohttp.ClientSession, url: str, group: str, topic: str) -> list[int]:
    status, body = await call(session, "GET", f"{url}/v1/groups/{group}/offsets", params={"topic": topic})
    assert status == 200, body
    return sorted(o["partition"] for o in body["offsets"])


def replicas_of(nodes: list[Node], topic: str, partition: int) -> list[Node]:
    group_id = nodes[0].catalog.topic(topic).partitions[partition].group_id
    return [n for n in nodes if group_id in n.partitions]


def replicas_agree(nodes: list[Node], topic: str) -> bool:
    """Every replica of every partition applied the leader's commit index, with equal groups."""
    for partition in range(PARTITIONS):
        group_id = nodes[0].catalog.topic(topic).partitions[partition].group_id
        hosts = replicas_of(nodes, topic, partition)
        leader = next((n for n in hosts if n.groups[group_id].core.role is Role.LEADER), None)
        if leader is None or len(hosts) != 3:
            return False
        target = leader.groups[group_id].core.commit_index
        if any(n.groups[group_id].core.applied_index != target for n in hosts):
            return False
        if len({tuple(n.partitions[group_id].state.consumer_offsets.items()) for n in hosts}) != 1:
            return False
    return True


async def test_offsets_idle_past_the_retention_expire_on_every_replica(tmp_path: Path) -> None:
    # Goal: with a short consumer_offsets_retention_ms, a group that stopped committing
    # loses its offsets in every partition (GET answers none, from any node) no sooner
    # than the retention after its last commit, while a group that keeps committing keeps
    # them; every replica of each partition ends with the same groups and commit times.
    async with running_cluster_with_http(tmp_path, consumer_offsets_retention_ms=RETENTION_MS,
                                         consumer_offsets_retention_check_ms=CHECK_MS) as (nodes, servers):
        urls = [s.url for s in servers]
        async with aiohttp.ClientSession() as session:
            await topic_with_records(session, urls[0], nodes, "ret")
            await commit(session, urls[1], "stale", "ret")
            await commit(session, urls[2], "live", "ret")
            last_stale_commit = time.monotonic()
            assert await committed(session, urls[0], "stale", "ret") == [0, 1]
            async with asyncio.timeout(RETENTION_MS / 1000 + 15):
                while await committed(session, urls[0], "stale", "ret"):
                    await commit(session, urls[2], "live", "ret")
                    await asyncio.sleep(0.2)
            assert time.monotonic() - last_stale_commit >= RETENTION_MS / 1000, "not before the retention"
            for url in urls:
                await commit(session, url, "live", "ret")  # keeps committing
                assert await committed(session, url, "stale", "ret") == [], url
                assert await committed(session, url, "live", "ret") == [0, 1], url
            await until(lambda: replicas_agree(nodes, "ret"), "replicas agree on the groups")
            for partition in range(PARTITIONS):
                for node in replicas_of(nodes, "ret", partition):
                    group_id = node.catalog.topic("ret").partitions[partition].group_id
                    assert "stale" not in node.partitions[group_id].state.consumer_offsets


def delete_entries(node: Node, group_id: int) -> list[dict[str, Any]]:
    """The offsets_delete entries in this replica's log of the group."""
    log = node.groups[GroupId(group_id)].core.log
    entries = log.slice(log.first_index(), Index(log.last_index() + 1), 1 << 30)
    decoded = [json.loads(e.payload) for e in entries if e.kind is EntryKind.META]
    return [d for d in decoded if d["type"] == "offsets_delete"]


async def test_delete_removes_a_group_from_every_partition_and_a_second_delete_is_404(tmp_path: Path) -> None:
    # Goal: DELETE /v1/groups/{g} (through a node that leads only some partitions) answers
    # 204 and removes g's offsets in every partition of every topic, on every replica, with
    # one offsets_delete entry in each partition that held g and none elsewhere; another
    # group's offsets stay; a second DELETE, and one of a group that never committed, is
    # 404 UNKNOWN_GROUP and proposes nothing; a malformed name is 400.
    async with running_cluster_with_http(tmp_path) as (nodes, servers):
        urls = [s.url for s in servers]
        async with aiohttp.ClientSession() as session:
            await topic_with_records(session, urls[0], nodes, "del")
            await topic_with_records(session, urls[1], nodes, "also")
            await topic_with_records(session, urls[2], nodes, "bystander")
            await commit(session, urls[0], "g", "del")
            await commit(session, urls[1], "g", "also")
            await commit(session, urls[2], "keep", "del")
            await commit(session, urls[2], "keep", "bystander")

            holders = [p.group_id for t in ("del", "also") for p in nodes[0].catalog.topic(t).partitions]
            assert any(nodes[2].leader_of(g) != nodes[2].id for g in holders), "some deletes are forwarded"
            status, body = await call(session, "DELETE", urls[2] + "/v1/groups/g")
            assert (status, body) == (204, b""), body
            for url in urls:
                for topic in ("del", "also"):
                    assert await committed(session, url, "g", topic) == [], (url, topic)
                assert await committed(session, url, "keep", "del") == [0, 1]
                assert await committed(session, url, "keep", "bystander") == [0, 1]
            for topic in ("del", "also", "bystander"):
                await until(lambda t=topic: replicas_agree(nodes, t), f"replicas of {topic} agree")
                for partition in range(PARTITIONS):
                    group_id = nodes[0].catalog.topic(topic).partitions[partition].group_id
                    for node in replicas_of(nodes, topic, partition):
                        assert "g" not in node.partitions[group_id].state.consumer_offsets
                        expected = [] if topic == "bystander" else [{"v": 2, "type": "offsets_delete", "group": "g"}]
                        assert delete_entries(node, group_id) == expected, (topic, partition, node.id)

            for url, group in ((urls[0], "g"), (urls[1], "never-committed")):
                status, body = await call(session, "DELETE", f"{url}/v1/groups/{group}")
                assert (status, body["error_code"]) == (404, "UNKNOWN_GROUP"), body
                assert set(body) == {"error_code", "message"}
            status, body = await call(session, "DELETE", urls[0] + "/v1/groups/bad%20name")
            assert (status, body["error_code"]) == (400, "INVALID_REQUEST"), body
            for node in nodes:
                for gid in node.partitions:
                    assert len(delete_entries(node, gid)) <= 1, "the refused deletes proposed nothing"
