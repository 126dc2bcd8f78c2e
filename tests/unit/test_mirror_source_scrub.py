"""Goal: whatever a source sends back, the errors a `SourceClient` raises never hold the
link's token: a source that echoes the request's Authorization header in an error
body, or in a header the sink must parse, is scrubbed; a redirect is not followed (it
could take the token to another host). Real sockets on loopback.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from multiraft.node.mirror_source import LOG_CONTENT_TYPE, SourceClient, SourceError, redact
from tests.node.test_node_cluster import free_port

TOKEN = "echo-me-7d1e"


async def _echoing_source(followed: list[str]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.StreamResponse:
        seen = request.headers.get("Authorization", "")
        if request.path == "/v1/topics":  # an error body quoting the request
            return web.Response(status=403, text=f"refused: {seen}")
        if request.path == "/elsewhere":
            followed.append(seen)
            return web.json_response({"topics": []})
        if request.path.endswith("/log"):  # a header the sink parses, holding the token
            return web.Response(body=b"", content_type=LOG_CONTENT_TYPE, headers={
                "Raftlog-Next-Offset": seen, "Raftlog-High-Watermark": "0", "Raftlog-Log-Start-Offset": "0"})
        raise web.HTTPFound(location="/elsewhere")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"127.0.0.1:{port}"


@pytest.mark.asyncio(loop_scope="function")
async def test_errors_from_an_echoing_or_redirecting_source_never_hold_the_token() -> None:
    followed: list[str] = []
    runner, address = await _echoing_source(followed)
    client = SourceClient((address,), TOKEN)
    try:
        async with asyncio.timeout(10):
            for call in (client.get_json("/v1/topics"), client.get_json("/v1/topics/moved"),
                         client.read_log("t", 0, 0, 1024, 0)):
                with pytest.raises(SourceError) as raised:
                    await call
                assert TOKEN not in str(raised.value) and TOKEN not in repr(raised.value), raised.value
    finally:
        await client.close()
        await runner.cleanup()
    assert followed == []  # the redirect answered 302 to the sink, which did not follow it


def test_redact_removes_every_copy_of_the_token() -> None:
    assert redact(f"a {TOKEN} b {TOKEN}", TOKEN) == "a <redacted> b <redacted>"
    assert redact("nothing here", None) == "nothing here"
