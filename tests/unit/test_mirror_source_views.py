"""Goal: the source client's reads that confirm a resync after the source truncated past a
mirror (multiraft/node/mirror_source.py, docs/mirror.md "The source truncated past a mirror")
hold against hostile or failing source nodes: each of the link's addresses names its node
and describes the partition; any answer the client cannot parse (deeply nested JSON included)
is a `SourceError` of that address alone, never an exception that escapes the pull; and a
resync is confirmed only when every replica the source's description names is described by
the node hosting it (a node down, hostile, or not among the link's addresses: not confirmed).
Bounded: one read of a topic's description per address serves all its partitions for a short
window, and few topics are read at once. Real sockets on loopback, one small server per source node.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import structlog
from aiohttp import web

from multiraft.node import mirror_source
from multiraft.node.mirror_source import (
    PartitionView,
    SourceClient,
    SourceError,
    parse_partition_view,
)
from multiraft.node.mirror_truncated import CONFIRM_AFTER_S, TruncatedResyncs
from tests.node.test_node_cluster import free_port
from tests.unit.test_mirror_catalog import _catalog
from tests.unit.test_mirror_link_tls import _link
from tests.unit.test_mirror_truncated import (
    MIRROR,
    CatalogProposer,
    SimpleHolder,
    _behind,
    _truncation,
)

asynchronous = pytest.mark.asyncio(loop_scope="function")
HOSTILE = b"[" * 5000  # json.loads raises RecursionError, not ValueError


def partition_entry(partition: int, group: object = 7, start: object = None, high: object = None,
                    replicas: object = (1, 2, 3)) -> dict[str, Any]:
    """A partition of a source topic's description as a source node answers it."""
    return {"partition": partition, "group_id": group, "log_start_offset": start, "high_watermark": high,
            "replicas": list(replicas) if isinstance(replicas, tuple) else replicas}


class SourceNode:
    """One source node on loopback: `GET /v1/cluster` names `node_id`, `GET /v1/topics/{topic}`
    answers `body` (bytes as is, else JSON) after `delay_s`; every request is recorded in
    `asked` (path and query, and the Authorization header), and the most topic reads it had
    under way at once in `most_in_flight`."""

    def __init__(self, node_id: int, body: Any, delay_s: float = 0.0) -> None:
        self.node_id = node_id
        self.body = body
        self.delay_s = delay_s
        self.asked: list[tuple[str, str | None]] = []
        self.in_flight = self.most_in_flight = 0
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.asked.append((request.path_qs, request.headers.get("Authorization")))
        if request.path == "/v1/cluster":
            return web.json_response({"node_id": self.node_id})
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if isinstance(self.body, bytes):
            return web.Response(body=self.body, content_type="application/json")
        return web.json_response(self.body)

    async def start(self) -> SourceNode:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port("127.0.0.1")
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def described(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "partitions": list(entries)}


# Goal: the client asks each of the link's addresses which node it is and for the topic's
# description (linearizable: a lagging source catalog would give an older identity), and keeps the partition's view from each that answers well (a node down, an
# answer malformed or impossible left out), never another address; none answering is a
# SourceError.
@asynchronous
async def test_the_client_reads_each_source_address_view_of_the_partition() -> None:
    other = partition_entry(0, 5, 0, 0)
    nodes = [await SourceNode(1, described(other, partition_entry(1, 7, 40, 90))).start(),
             await SourceNode(2, described(other, partition_entry(1))).start(),
             await SourceNode(3, described(other, partition_entry(1, 7, 95, 90))).start(),
             await SourceNode(4, described(other)).start()]
    down = f"127.0.0.1:{free_port('127.0.0.1')}"
    client = SourceClient((*(n.address for n in nodes), down), "tok")
    try:
        async with asyncio.timeout(20):
            assert await client.partition_views("t", 1) == [PartitionView(7, 40, 90, (1, 2, 3), 1),
                                                            PartitionView(7, None, None, (1, 2, 3), 2)]
            nowhere = SourceClient((nodes[2].address, down), "tok")
            with pytest.raises(SourceError, match="impossible values"):
                await nowhere.partition_views("t", 1)
            await nowhere.close()
    finally:
        await client.close()
        for node in nodes:
            await node.stop()
    calls = [("/v1/cluster", "Bearer tok"), ("/v1/topics/t?consistency=linearizable", "Bearer tok")]
    assert [n.asked for n in nodes] == [calls, calls, calls * 2, calls]
    for bad in ({"partitions": [partition_entry(1, 0, 1, 2)]}, {"partitions": [partition_entry(1, 7, 1, None)]},
                {"partitions": []}, {"partitions": [partition_entry(1, 7, -1, 2)]},
                {"partitions": [partition_entry(1, 7, True, 2)]}, {"partitions": "x"},
                {"partitions": [partition_entry(1, 7, 1, 2), partition_entry(1, 7, 1, 2)]},
                {"partitions": [partition_entry(1, 2**63, 1, 2)]}, {"partitions": [partition_entry(1, replicas=())]},
                {"partitions": [partition_entry(1, replicas=(1, 1))]}, {"partitions": [partition_entry(1, replicas=(0,))]},
                {"partitions": [partition_entry(1, replicas=None)]}, {"partitions": [partition_entry(1, replicas=["1"])]}):
        with pytest.raises(SourceError):
            parse_partition_view(bad, 1)


# Goal: a source answering `[` * 5000 (the review's reproduction) is a SourceError from
# `get_json`, not a RecursionError; asked for the partition's views beside an honest node, it
# fails alone: the honest node's view is read, the client goes on working.
@asynchronous
async def test_deeply_nested_json_is_a_source_error_of_that_address_alone() -> None:
    hostile = await SourceNode(2, HOSTILE).start()
    honest = await SourceNode(1, described(partition_entry(0, 7, 40, 90))).start()
    client = SourceClient((hostile.address, honest.address), None)
    try:
        async with asyncio.timeout(20):
            with pytest.raises(SourceError, match="not JSON"):
                await client.get_json("/v1/topics/t", source=hostile.address)
            assert await client.partition_views("t", 0) == [PartitionView(7, 40, 90, (1, 2, 3), 1)]
            alone = SourceClient((hostile.address,), None)
            with pytest.raises(SourceError, match="not JSON"):
                await alone.partition_views("t", 0)
            await alone.close()
    finally:
        await client.close()
        for node in (hostile, honest):
            await node.stop()


# Goal: the source's description names replicas on nodes 1, 2 and 3, each lacking the mirror's
# position: the resync is confirmed only when all three are described by their own nodes. One
# node down, one answering `[` * 5000, or one the link does not name: not confirmed, nothing
# proposed, the status naming the replicas not described; nodes naming other replicas (one's
# catalog lags a reassignment): not confirmed; all three agreeing: one resync.
@asynchronous
async def test_a_replica_not_described_by_its_node_confirms_nothing() -> None:
    nodes = [await SourceNode(n, described(partition_entry(0, 900, 100, 110))).start() for n in (1, 2, 3)]
    hostile = await SourceNode(3, HOSTILE).start()
    lagging = await SourceNode(3, described(partition_entry(0, 900, 100, 110, replicas=(1, 2, 4)))).start()
    down = f"127.0.0.1:{free_port('127.0.0.1')}"
    first, second, third = (n.address for n in nodes)
    try:
        for addresses, shown, proposed in (
                ((first, second, down), "on nodes [3] are not described", 0),
                ((first, second, hostile.address), "on nodes [3] are not described", 0),
                ((first, second), "on nodes [3] are not described", 0),
                ((first, second, lagging.address), "the source's nodes disagree on the partition's replicas", 0),
                ((first, second, third), "replaced by a new incarnation from offset 100", 1)):
            catalog = _catalog(_link(on_source_truncated="resync"), MIRROR)
            group = int(catalog.topic("orders").partitions[0].group_id)
            group0 = CatalogProposer(catalog)
            clock = itertools.count(0.0, CONFIRM_AFTER_S)
            resyncs = TruncatedResyncs(SimpleHolder(catalog), group0, structlog.get_logger(),  # type: ignore[arg-type]
                                       monotonic=lambda clock=clock: next(clock))  # type: ignore[misc]
            client = SourceClient(addresses, None)
            try:
                async with asyncio.timeout(20):
                    await resyncs.on_truncated(_truncation(group), client, _behind)
                    _, said = await resyncs.on_truncated(_truncation(group), client, _behind)
            finally:
                await client.close()
            assert shown in said and len(group0.proposed) == proposed, (addresses, said)
    finally:
        for node in (*nodes, hostile, lagging):
            await node.stop()


# Goal: the confirmations of many truncated partitions of one topic share one read of its
# description per source address (a single flight, then fresh for DESCRIPTION_FRESH_S); past
# that window, the next confirmation reads it again; a large answer is parsed off the event
# loop (in a thread).
@asynchronous
async def test_partitions_of_one_topic_share_one_description_read_per_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    count = 4000  # about 420 KB of description: parsed in a thread
    nodes = [await SourceNode(n, described(*(partition_entry(p, 7 + p, 100, 110) for p in range(count))),
                              delay_s=0.05).start() for n in (1, 2, 3)]
    threaded: list[int] = []
    to_thread = asyncio.to_thread

    async def counted(function: Any, body: bytes) -> Any:
        threaded.append(len(body))
        return await to_thread(function, body)

    monkeypatch.setattr(mirror_source.asyncio, "to_thread", counted)
    client = SourceClient(tuple(n.address for n in nodes), None)
    calls = [("/v1/cluster", None), ("/v1/topics/t?consistency=linearizable", None)]
    try:
        async with asyncio.timeout(20):
            views = await asyncio.gather(*(client.partition_views("t", p) for p in range(count)))
            assert [n.asked for n in nodes] == [calls] * 3, "one read per address for all the partitions"
            assert [v.group_id for v, _, _ in views] == [7 + p for p in range(count)]
            assert len(threaded) == 3 and min(threaded) > mirror_source.JSON_ON_LOOP_BYTES_MAX
            await client.partition_views("t", 5)  # within the window: the same read
            assert [n.asked for n in nodes] == [calls] * 3
            monkeypatch.setattr(mirror_source, "DESCRIPTION_FRESH_S", 0.0)
            await client.partition_views("t", 5)
            assert [n.asked for n in nodes] == [calls * 2] * 3, "past the window: read again"
    finally:
        await client.close()
        for node in nodes:
            await node.stop()


# Goal: the descriptions of many topics are read at most DESCRIPTIONS_IN_FLIGHT_MAX at once
# per link; all are read.
@asynchronous
async def test_at_most_a_few_topic_descriptions_are_read_at_once() -> None:
    node = await SourceNode(1, described(partition_entry(0, 7, 100, 110, replicas=(1,))), delay_s=0.1).start()
    client = SourceClient((node.address,), None)
    try:
        async with asyncio.timeout(20):
            views = await asyncio.gather(*(client.partition_views(f"t{n}", 0) for n in range(10)))
    finally:
        await client.close()
        await node.stop()
    assert len(views) == 10 and len([a for a in node.asked if a[0].startswith("/v1/topics/")]) == 10
    assert node.most_in_flight == 4, node.most_in_flight  # DESCRIPTIONS_IN_FLIGHT_MAX
