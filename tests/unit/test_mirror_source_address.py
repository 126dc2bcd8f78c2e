"""Goal: a sink reads its source from its own node's address, as its Raft links do, so
firewall rules between two clusters on one host (the chaos runner's link partitions,
chaos/mirror.py) match its connections; without an address the OS picks one (on
loopback 127.0.0.1, another node's address in a local cluster). Real sockets.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from multiraft.node.mirror_source import SourceClient
from tests.node.test_node_cluster import free_port


async def _source(seen: list[str]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        seen.append(str(request.remote))
        return web.json_response({"topics": []})

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"127.0.0.1:{port}"


@pytest.mark.asyncio(loop_scope="function")
async def test_the_source_is_read_from_the_local_host_given() -> None:
    seen: list[str] = []
    runner, address = await _source(seen)
    bound, unbound = SourceClient((address,), None, local_host="127.0.0.42"), SourceClient((address,), None)
    try:
        async with asyncio.timeout(10):
            await bound.get_json("/v1/topics")
            await unbound.get_json("/v1/topics")
    finally:
        await bound.close()
        await unbound.close()
        await runner.cleanup()
    assert seen == ["127.0.0.42", "127.0.0.1"]
