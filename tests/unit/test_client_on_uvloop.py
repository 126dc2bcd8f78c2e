"""Goal: the client works on uvloop. Nodes run on it (`raftlog serve`), and so may a
user's programme; uvloop's transports are no subclass of asyncio.Transport, which a
check in the connection pool once refused (found when the benchmark's client moved
to uvloop)."""

from __future__ import annotations

import asyncio

import uvloop

from multiraft.client.connection import ConnectionPool
from tests.unit.test_client_connection import Server, ok


def test_keep_alive_requests_on_uvloop() -> None:
    async def exchange() -> tuple[str, int, bytes, int]:
        server = Server(ok(b"uv"))
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        server.port = server.server.sockets[0].getsockname()[1]
        pool = ConnectionPool()
        try:
            for _ in range(2):
                response = await pool.request("POST", server.url + "/x", body=b"1", timeout_s=5)
            loop = type(asyncio.get_running_loop()).__module__
            return loop, response.status, response.body, server.connections
        finally:
            await pool.close()
            server.server.close()

    assert uvloop.run(exchange()) == ("uvloop", 200, b"uv", 1)
