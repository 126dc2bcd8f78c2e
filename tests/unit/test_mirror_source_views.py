"""Goal: the source client's reads that confirm a resync after the source truncated past a
mirror (multiraft/node/mirror_source.py, docs/mirror.md "The source truncated past a mirror")
hold against hostile or failing source nodes: any answer it cannot parse (deeply nested
JSON included) is a `SourceError` of that address alone, never an exception that escapes the
pull. Real sockets on loopback, one small server per source node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from multiraft.node.mirror_source import PartitionView, SourceClient, SourceError
from tests.node.test_node_cluster import free_port

asynchronous = pytest.mark.asyncio(loop_scope="function")
HOSTILE = b"[" * 5000  # json.loads raises RecursionError, not ValueError


def partition_entry(partition: int, group: object = 7, start: object = None, high: object = None) -> dict[str, Any]:
    """A partition of a source topic's description as a source node answers it."""
    return {"partition": partition, "group_id": group, "log_start_offset": start, "high_watermark": high}


class SourceNode:
    """One source node on loopback: `GET /v1/topics/{topic}` answers `body` (bytes as is, else
    JSON); every request is recorded in `asked` (path and query)."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.asked: list[str] = []
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.asked.append(request.path_qs)
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


# Goal: a source answering `[` * 5000 (the review's reproduction) is a SourceError from
# `get_json`, not a RecursionError; asked for the partition's views beside an honest node, it
# fails alone: the honest node's view is read, the client goes on working.
@asynchronous
async def test_deeply_nested_json_is_a_source_error_of_that_address_alone() -> None:
    hostile = await SourceNode(HOSTILE).start()
    honest = await SourceNode({"name": "t", "partitions": [partition_entry(0, 7, 40, 90)]}).start()
    client = SourceClient((hostile.address, honest.address), None)
    try:
        async with asyncio.timeout(20):
            with pytest.raises(SourceError, match="not JSON"):
                await client.get_json("/v1/topics/t", source=hostile.address)
            assert await client.partition_views("t", 0) == [PartitionView(7, 40, 90)]
            alone = SourceClient((hostile.address,), None)
            with pytest.raises(SourceError, match="not JSON"):
                await alone.partition_views("t", 0)
            await alone.close()
    finally:
        await client.close()
        for node in (hostile, honest):
            await node.stop()
