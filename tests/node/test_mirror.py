"""Goal: a mirror follows a live source topic with identical offsets and bytes, across a
sink leader's death, a pause and a promotion (issue 24, docs/mirror.md).

Two real 3-node clusters in one event loop, each node on its own loopback address
(source 127.0.0.1-3, sink 127.0.0.4-6) with its HTTP API: the sink reads the source
over HTTP exactly as it would across regions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from multiraft.http import HttpServer
from multiraft.node.config import Address
from multiraft.node.node import Node
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import NodeId
from storage.batch import Record, encode_batch
from tests.node.test_node_cluster import at_build_level, configs, free_port, produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")


@dataclasses.dataclass
class Side:
    nodes: list[Node]
    servers: list[HttpServer]

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.id not in self.stopped]

    stopped: set[int] = dataclasses.field(default_factory=set)


async def _start(tmp: Path, first_host: int, tls: Callable[[str], ssl.SSLContext] | None = None) -> Side:
    """Three nodes on 127.0.0.{first_host}..+2, each serving its HTTP API (HTTPS with `tls(host)`'s
    context when given: tests/node/test_mirror_tls.py's source)."""
    raft = {NodeId(i): Address(f"127.0.0.{i + first_host - 1}", free_port(f"127.0.0.{i + first_host - 1}"))
            for i in range(1, 4)}
    cfgs = [dataclasses.replace(c, raft_addr=raft[c.node_id], initial_cluster=raft,
                                http_addr=Address(raft[c.node_id].host, free_port(raft[c.node_id].host)))
            for c in configs(tmp)]
    nodes = [Node(c) for c in cfgs]
    servers = [HttpServer(n.api, n.config.http_addr.host, n.config.http_addr.port,
                          tls=tls(n.config.http_addr.host) if tls is not None else None) for n in nodes]
    for node, server in zip(nodes, servers, strict=True):
        await node.start()
        await server.start()
    await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "3 nodes in every catalog", 30)
    await at_build_level(nodes)  # a kept-prefix resync and an HTTPS link need it (test_mirror_fullsync, _tls)
    return Side(nodes, servers)


async def _stop(side: Side) -> None:
    for node, server in zip(side.nodes, side.servers, strict=True):
        if node.id not in side.stopped:
            await server.stop()
            await node.stop()


@pytest_asyncio.fixture
async def clusters(tmp_path: Path) -> AsyncIterator[tuple[Side, Side]]:
    source = await _start(tmp_path / "source", 1)
    sink = await _start(tmp_path / "sink", 4)
    try:
        yield source, sink
    finally:
        await _stop(sink)
        await _stop(source)


def _batch(n: int, size: int = 5) -> bytes:
    return encode_batch([Record(b"k%d" % n, b"value-%d-%d" % (n, i)) for i in range(size)], first_timestamp_ms=n + 1)


async def _log(node: Node, topic: str, partition: int) -> tuple[int, int, str]:
    """(log start, high watermark, digest of every stored batch with its offset) as one replica serves it."""
    digest, offset, hw, start = hashlib.sha256(), None, 0, 0
    while True:
        result = await node.api.consume(topic, partition, offset or 0, max_bytes=1 << 20, keep_skipped=True)
        start, hw = result.log_start_offset, result.high_watermark
        offset = offset if offset is not None else start
        for base, _count, data in result.batches:
            if base >= offset:
                digest.update(base.to_bytes(8, "big") + data)
        if result.next_offset >= hw or not result.batches:
            return start, hw, digest.hexdigest()
        offset = result.next_offset


async def _same(source: Side, sink: Side, topic: str, partitions: int) -> list[int]:
    """Wait until the mirror holds exactly the source's log (every partition); its high watermarks."""
    hws = []
    for partition in range(partitions):
        async def equal(partition: int = partition) -> bool:
            try:
                want = await _log(source.live()[0], topic, partition)
                got = await _log(sink.live()[0], topic, partition)
            except ClientError:
                return False
            return want == got
        try:
            async with asyncio.timeout(30):
                while not await equal():
                    await asyncio.sleep(0.1)
        except TimeoutError:
            pulls = [s.view() for n in sink.live() for s in n.mirror_pulls.status.values()]
            raise AssertionError(f"the mirror of {topic}/{partition} did not catch up: {pulls}") from None
        hws.append((await _log(sink.live()[0], topic, partition))[1])
    return hws


async def _http(session: aiohttp.ClientSession, node: Node, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    url = f"http://{node.config.http_addr.host}:{node.config.http_addr.port}{path}"
    async with session.request(method, url, **kw) as answer:
        body = await answer.json() if answer.content_type == "application/json" else await answer.read()
        return answer.status, body


async def test_a_mirror_follows_a_live_source_across_a_leader_kill_a_pause_and_a_promotion(
        clusters: tuple[Side, Side]) -> None:
    source, sink = clusters
    await source.nodes[0].api.create_topic("orders", 2, 3, {})
    await source.nodes[0].api.wait_for_topic("orders")
    for n in range(10):
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
    session = aiohttp.ClientSession()
    try:
        sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
        status, link = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors", json={
            "name": "dr", "sources": sources, "topics": "ord*", "priority": "high", "token": "not-needed-here"})
        assert status == 201, link
        assert link["credentials"] is True and "not-needed-here" not in str(link)

        stop = asyncio.Event()

        async def producer() -> None:  # a live producer on the source while the mirror copies
            n = 100
            while not stop.is_set():
                await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n, 3))
                n += 1
                await asyncio.sleep(0.01)

        live = asyncio.create_task(producer())
        await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
        await asyncio.sleep(1.0)
        stop.set()
        await live
        hws = await _same(source, sink, "orders", 2)
        assert all(hw > 0 for hw in hws)

        status, refused = await _http(session, sink.nodes[0], "POST", "/v1/topics/orders/partitions/0/records",
                                      json={"records": [{"value": "x"}]})
        assert status == 403 and refused["error_code"] == "MIRROR_READ_ONLY", refused

        # The sink leader of partition 0 dies; the others take over from the replicated position.
        group = sink.nodes[0].catalog.topic("orders").partitions[0].group_id
        leader = next(n for n in sink.nodes if n.groups[group].core.role is Role.LEADER)
        index = sink.nodes.index(leader)
        await sink.servers[index].stop()
        await leader.stop()
        sink.stopped.add(leader.id)
        for n in range(200, 230):
            await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n, 2))
        hws_after = await _same(source, sink, "orders", 2)
        assert hws_after[0] > hws[0]

        # Paused: nothing more is copied; resumed: it catches up.
        status, paused = await _http(session, sink.live()[0], "POST", "/v1/admin/mirrors/dr/pause")
        assert status == 200 and paused["state"] == "paused"
        await asyncio.sleep(0.5)  # running pulls see the pause within a scan
        frozen = [(await _log(sink.live()[0], "orders", p))[1] for p in range(2)]
        for n in range(300, 310):
            await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n, 2))
        await asyncio.sleep(1.0)
        assert [(await _log(sink.live()[0], "orders", p))[1] for p in range(2)] == frozen
        status, _ = await _http(session, sink.live()[0], "POST", "/v1/admin/mirrors/dr/resume")
        assert status == 200
        hws_resumed = await _same(source, sink, "orders", 2)

        status, report = await _http(session, sink.live()[0], "GET", "/v1/admin/mirrors/dr")
        assert status == 200 and report["topics"][0]["topic"] == "orders", report
        states = {p["state"] for p in report["topics"][0]["partitions"]}
        assert states <= {"running"}, report

        # Promoted: writable, continuing at the next offset.
        status, promoted = await _http(session, sink.live()[0], "POST", "/v1/admin/mirrors/dr/promote",
                                       json={"topic": "orders"})
        assert status == 200 and promoted["promoted"], promoted
        async with asyncio.timeout(10):  # MIRROR_READ_ONLY until the partition's leader applied its promotion
            while True:
                try:
                    result = await produce_retrying(sink.live()[0], "orders", 0, _batch(999, 1))
                    break
                except ClientError as error:
                    assert error.code == "MIRROR_READ_ONLY", error
                    await asyncio.sleep(0.05)
        assert result.base_offset == hws_resumed[0]
        status, gone = await _http(session, sink.live()[0], "DELETE", "/v1/admin/mirrors/dr")
        assert status == 204, gone
    finally:
        await session.close()
