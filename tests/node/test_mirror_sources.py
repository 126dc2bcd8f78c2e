"""Goal: a sink facing a source that misbehaves keeps the source's token to itself,
trusts none of the source's names or sizes, keeps a mirror's partition count against a
hand-made increase and a source count that shrinks or passes the bound, and follows one
that grows.

One real 3-node sink cluster (127.0.0.4-6, its HTTP API) and two sources on loopback
sockets: a TCP server that answers garbage to anything (not HTTP), and a small aiohttp
server that describes topics but redirects every long-poll read of a partition to
itself (a redirect loop). Both links carry a token; the status of each, asked of every
sink node over HTTP (so also through the other nodes' `mirror.status` RPC), must name
the errors and never contain the token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from multiraft.metadata.commands import PARTITIONS_MAX
from multiraft.node.mirror_source import LOG_CONTENT_TYPE
from tests.node.test_mirror import Side, _http, _start, _stop
from tests.node.test_node_cluster import free_port

pytestmark = pytest.mark.asyncio(loop_scope="function")
TOKEN = "tok-3f9a1c-never-shown"


@pytest_asyncio.fixture
async def sink(tmp_path: Path) -> AsyncIterator[Side]:
    side = await _start(tmp_path / "sink", 4)
    try:
        yield side
    finally:
        await _stop(side)


async def _garbage_server() -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(b"SSH-2.0-OpenSSH_9.6 definitely not HTTP\r\n\x00\x01\x02\r\n\r\n")
        await writer.drain()
        writer.close()

    port = free_port("127.0.0.1")
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    return server, f"127.0.0.1:{port}"


async def _redirecting_source(requests: list[str], topics: dict[str, int],
                              unreadable: set[str]) -> tuple[web.AppRunner, str]:
    """`topics` (name: partition count, as listed and described; the test changes them); an
    immediate read answers an empty log (503 for a `TOPIC/PARTITION` in `unreadable`), a long
    poll is redirected to itself."""

    async def handle(request: web.Request) -> web.StreamResponse:
        requests.append(request.path)
        parts = request.path.strip("/").split("/")
        if parts == ["v1", "topics"]:
            return web.json_response({"topics": [{"name": name, "partitions": count, "replication_factor": 3}
                                                 for name, count in topics.items()]})
        if len(parts) == 3 and parts[2] in topics:
            return web.json_response({"name": parts[2], "partitions": [{}] * topics[parts[2]], "config": {},
                                      "replication_factor": 3})
        if len(parts) == 6 and parts[5] == "log":
            if request.query.get("wait_ms", "0") != "0":
                raise web.HTTPFound(location=str(request.rel_url))
            if f"{parts[2]}/{parts[4]}" in unreadable:
                raise web.HTTPServiceUnavailable()
            return web.Response(body=b"", content_type=LOG_CONTENT_TYPE, headers={
                "Raftlog-Next-Offset": "0", "Raftlog-High-Watermark": "0", "Raftlog-Log-Start-Offset": "0"})
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"127.0.0.1:{port}"


async def _status(session: aiohttp.ClientSession, sink: Side, name: str) -> list[str]:
    """The link's status as each sink node answers it, as raw text."""
    texts = []
    for node in sink.nodes:
        url = f"http://{node.config.http_addr.host}:{node.config.http_addr.port}/v1/admin/mirrors/{name}"
        async with session.get(url) as answer:
            assert answer.status == 200
            texts.append(await answer.text())
    return texts


async def _until_status(session: aiohttp.ClientSession, sink: Side, name: str, done: Any) -> dict[str, Any]:
    try:
        async with asyncio.timeout(20):
            while True:
                report = json.loads((await _status(session, sink, name))[0])
                if done(report):
                    return report  # type: ignore[no-any-return]
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"the status of {name} did not get there: {report}") from None


async def test_status_answers_never_show_the_token_and_the_source_is_not_trusted(sink: Side) -> None:
    requests: list[str] = []
    garbage, garbage_address = await _garbage_server()
    # `huge`: one more partition than a topic may have; `bad name`: no valid topic name.
    topics = {"orders": 2, "huge": PARTITIONS_MAX + 1, "bad name": 1}
    unreadable: set[str] = set()
    runner, source_address = await _redirecting_source(requests, topics, unreadable)
    session = aiohttp.ClientSession()
    try:
        for name, address in (("garbage", garbage_address), ("redirect", source_address)):
            status, link = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors", json={
                "name": name, "sources": [address], "topics": "*", "token": TOKEN})
            assert status == 201, link

        report = await _until_status(session, sink, "garbage",
                                     lambda r: r["discovery"] and r["discovery"]["last_error"])
        assert "did not answer" in report["discovery"]["last_error"], report

        def pulls_failed(report: dict[str, Any], count: int = 2) -> bool:
            partitions = [p for t in report["topics"] for p in t["partitions"]]
            return len(partitions) == count and all(p.get("last_error") for p in partitions)

        report = await _until_status(session, sink, "redirect", pulls_failed)
        assert {p["state"] for p in report["topics"][0]["partitions"]} == {"backing_off"}, report
        # The source's sizes and names: refused before any read of them, the reason shown.
        refused = report["discovery"]["refused"]
        assert any(r.startswith("huge: ") for r in refused) and any(r.startswith("bad name: ") for r in refused)
        assert not [p for p in requests if p.startswith(("/v1/topics/huge/", "/v1/topics/bad"))], requests
        assert "huge" not in sink.nodes[0].catalog.topics

        for name in ("garbage", "redirect"):
            for text in await _status(session, sink, name):
                assert TOKEN not in text, text

        # A mirror keeps its source's partition count until promoted.
        status, body = await _http(session, sink.nodes[1], "POST", "/v1/topics/orders/partitions", json={"count": 3})
        assert status == 409 and body["error_code"] == "MIRROR_PARTITIONS_FIXED", body
        assert len(sink.nodes[1].catalog.topic("orders").partitions) == 2

        # The source's count for it: fewer (a topic made again), then past the bound, refused and
        # named, never applied, and none of the partitions past the mirror's read; then a real
        # increase whose new partition cannot be read yet, named; once it can, followed: the new
        # partition pulled as the others (backing off on this source).
        def refusal(count: int, why: str) -> Any:
            return lambda r: any(f.startswith("orders: ") and f" {count} partitions" in f and why in f
                                 for f in r["discovery"]["refused"])

        for count, why in ((1, "fewer than the mirror's 2"), (PARTITIONS_MAX + 1, f"1..{PARTITIONS_MAX}")):
            topics["orders"] = count
            report = await _until_status(session, sink, "redirect", refusal(count, why))
            assert [len(t["partitions"]) for t in report["topics"]] == [2], report
            assert all(len(n.catalog.topic("orders").partitions) == 2 for n in sink.nodes)
        assert not [p for p in requests if p.startswith("/v1/topics/orders/partitions/2/")], requests
        unreadable.add("orders/2")  # grown, but its new partition not readable yet (no leader at the source)
        topics["orders"] = 3
        await _until_status(session, sink, "redirect", refusal(3, "a new one's log start was not read"))
        assert all(len(n.catalog.topic("orders").partitions) == 2 for n in sink.nodes)
        unreadable.clear()
        report = await _until_status(session, sink, "redirect", lambda r: [len(t["partitions"]) for t in r["topics"]] == [3] and pulls_failed(r, 3) and not any(
            f.startswith("orders: ") for f in r["discovery"]["refused"]))
        assert {p["state"] for p in report["topics"][0]["partitions"]} == {"backing_off"}, report
        assert all(n.catalog.topic("orders").mirror_partitions == 3 for n in sink.nodes)
    finally:
        await session.close()
        await runner.cleanup()
        garbage.close()
        await garbage.wait_closed()
