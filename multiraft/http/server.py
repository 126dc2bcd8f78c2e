"""Serving the app on a real socket, started and stopped with the node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from multiraft.http.app import create_app

if TYPE_CHECKING:
    from multiraft.node import Node

# aiohttp closes idle keep-alive connections after this (its default is 75 s);
# shorter frees sockets of abandoned clients sooner.
KEEPALIVE_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0


class HttpServer:
    """The HTTP API of one node on `host:port` (port 0 picks a free one)."""

    def __init__(self, node: Node, host: str, port: int) -> None:
        self.node = node
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(create_app(self.node), access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT_S,
                                     shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            address = self._runner.addresses[0]
            self.port = int(address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
