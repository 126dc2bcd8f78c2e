"""Goal: an answer saying OUTCOME_UNKNOWN (a follower forwarded a produce to a leader
that died) is ambiguous, like a lost answer: an idempotent produce goes again (the
cluster deduplicates it), a plain one raises OutcomeUnknownError. Before, an
idempotent produce failed on it (the CLI's failover test flaked on this)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from multiraft.client.http import AsyncClient, RaftlogError

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def flaky_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Answers the first produce 504 OUTCOME_UNKNOWN, every later one 200."""
    calls: list[int] = []

    async def produce(request: web.Request) -> web.Response:
        calls.append(1)
        if len(calls) == 1:
            return web.json_response({"error_code": "OUTCOME_UNKNOWN", "message": "forwarded, no answer"},
                                     status=504)
        return web.json_response({"partition": 0, "base_offset": 7, "count": 1, "duplicate": len(calls) > 1})

    app = web.Application()
    app.router.add_post("/v1/topics/t/partitions/0/records", produce)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


async def test_an_idempotent_request_goes_again_after_outcome_unknown(flaky_server: tuple[str, list[int]]) -> None:
    server, calls = flaky_server
    client = AsyncClient(server, backoff_s=0.01)
    try:
        async with asyncio.timeout(10):
            status, body, _ = await client.request("POST", "/v1/topics/t/partitions/0/records",
                                                   json_body={"records": [{"value": 1}]}, ambiguous_retry=True)
    finally:
        await client.close()
    assert status == 200 and json.loads(body)["base_offset"] == 7 and len(calls) == 2


async def test_a_plain_request_reports_outcome_unknown(flaky_server: tuple[str, list[int]]) -> None:
    server, calls = flaky_server
    client = AsyncClient(server, backoff_s=0.01)
    try:
        with pytest.raises(RaftlogError) as raised:
            await client.request("POST", "/v1/topics/t/partitions/0/records", json_body={"records": [{"value": 1}]},
                                 ambiguous_retry=False)
    finally:
        await client.close()
    assert raised.value.code == "OUTCOME_UNKNOWN" and len(calls) == 1
