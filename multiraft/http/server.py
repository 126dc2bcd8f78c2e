"""Serving the app on a real socket, started and stopped with the node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from multiraft.errors import InvalidRequest, error_body
from multiraft.http.app import create_app
from multiraft.http.errors import RequestTimeout, RequestTooLarge
from raftlog.errors import ClientError

if TYPE_CHECKING:
    from multiraft.node import Node

# aiohttp closes idle keep-alive connections after this (its default is 75 s);
# shorter frees sockets of abandoned clients sooner.
KEEPALIVE_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0


_logger = structlog.get_logger("multiraft.http")


def protocol_error(status: int, exc: BaseException | None) -> ClientError:
    """The typed error for a request aiohttp refused before the app saw it."""
    if status >= 500:
        return ClientError("internal error; see the node's log")
    detail = "malformed request" if exc is None else (getattr(exc, "message", None) or type(exc).__name__)
    if status == 413:
        return RequestTooLarge(f"request refused by the HTTP parser: {detail}")
    if status == 408:
        return RequestTimeout(f"request refused by the HTTP parser: {detail}")
    return InvalidRequest(f"malformed HTTP request: {detail}")


class _JsonErrorRequestHandler(RequestHandler):
    """aiohttp answers requests its parser refuses (bad request line, oversized
    header, bad Content-Length, TLS on a plain port) itself, before any middleware,
    as text/plain. This keeps those answers in the one JSON error shape too."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            _logger.error("http_protocol_failure", status=status, error=repr(exc))
        else:
            _logger.debug("http_request_refused", status=status, error=repr(exc))
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already under way; the connection is dropped")
        error = protocol_error(status, exc)
        response = web.json_response(error_body(error), status=status)
        response.force_close()
        return response


class _JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class _JsonErrorRunner(web.AppRunner):
    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state, our handler class (aiohttp has no hook)
        return server


class HttpServer:
    """The HTTP API of one node on `host:port` (port 0 picks a free one)."""

    def __init__(self, node: Node, host: str, port: int) -> None:
        self.node = node
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = _JsonErrorRunner(create_app(self.node), access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT_S,
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
