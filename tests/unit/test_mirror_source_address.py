"""Goal: a sink reads its source from its own node's address, as its Raft links do, so
firewall rules between two clusters on one host (the chaos runner's link partitions,
chaos/mirror.py) match its connections; without an address the OS picks one (on
loopback 127.0.0.1, another node's address in a local cluster). Real sockets.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from multiraft.node.mirror_source import SourceClient, binds_to
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


def test_only_loopback_clusters_bind_their_connections() -> None:
    # Goal: binding is for clusters sharing one host; a node serving HTTP on loopback
    # behind a proxy, a remote or named source, or IPv6 must connect unbound (bound, it
    # would fail on every call and the pull would back off forever).
    assert binds_to("127.0.0.11", ("127.0.0.1:9000", "127.0.0.2:9000")) == "127.0.0.11"
    assert binds_to("127.0.0.1", ("10.0.0.5:9000",)) is None, "a remote source"
    assert binds_to("127.0.0.1", ("127.0.0.2:9000", "source.example:9000")) is None, "a name"
    assert binds_to("10.0.0.7", ("10.0.0.5:9000",)) is None, "the OS picks on a real network"
    assert binds_to("::1", ("[::1]:9000",)) is None
    assert binds_to("node-1", ("127.0.0.2:9000",)) is None
    assert binds_to(None, ("127.0.0.2:9000",)) is None
