"""Serving the app on a real socket, started and stopped with the node.

The connection bounds of multiraft/http/limits.py (`ConnectionLimits`) are
enforced here, per connection, in the request handler class aiohttp makes for
each socket:

- a connection beyond `connections_max`, or beyond `connections_per_address_max`
  from its client's address, is reset at once, before aiohttp sees it (no
  parser, no task) and counted;
- a new connection must deliver a request's line and headers within
  `header_read_timeout_s`, and so must a kept-alive one from the first byte of its
  next request (idle between requests, `keepalive_timeout_s` applies): a client that
  trickles its headers or sends none is dropped (aiohttp's own bound is the
  keep-alive timeout, which idles and trickles share);
- an answer whose socket stays above its write buffer's high-water mark for
  `write_stall_timeout_s` (the client stopped reading) is abandoned: the socket is
  reset, which frees its buffer and fails the handler's pending write, so the
  handler lets go of the answer too. This is one check for every answer: every
  write of aiohttp (a streamed consume's `write`, a JSON body's `write_eof`) waits
  for the transport through the protocol's pause_writing/resume_writing, which is
  where the deadline is armed and disarmed.

With TLS (`--tls-cert`, `--tls-key`) the same bounds hold, applied before the TLS
handshake: the server then accepts on a `multiraft.net.tls_listener.Listener`, admits
the connection by the same gate at once, and runs the TLS handshake within
`header_read_timeout_s` (a client that opens TCP and never finishes TLS is
dropped then, and counted) before aiohttp's handler starts on the TLS transport.
Passing the context to aiohttp's site instead would start the handler, and so
the gate, only after the handshake: connections stuck in it would escape every
bound.

One difference over TLS: asyncio's TLS layer tells the handler to pause only
when its own buffer fills, not when the socket's does, so an answer written in
one piece (one stored batch, a JSON body) goes below TLS at once and the write
deadline never starts for it; the handler is done and lets go of it, but its
bytes stay buffered for a client that stopped reading until the keep-alive
timeout closes the connection, whose TLS shutdown is cut after
`write_stall_timeout_s`: at most keep-alive plus write-stall (60 s by default),
rather than 30 s. An answer written in several pieces meets the deadline as
without TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from multiraft.errors import InvalidRequest, RequestTimeout, RequestTooLarge, error_body
from multiraft.http.app import create_app
from multiraft.http.connections import ConnectionGate, ConnectionStats
from multiraft.http.handlers.metrics import REGISTRY_KEY
from multiraft.http.limits import ConnectionLimits
from multiraft.http.metrics import ConnectionsCollector
from multiraft.net.tls import http_server_context
from multiraft.net.tls_listener import AcceptedSocket, Listener, upgrade
from raftlog.errors import ClientError

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi

SHUTDOWN_TIMEOUT_S = 5.0
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


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
    as text/plain. This keeps those answers in the one JSON error shape too.

    It also applies the connection bounds (module docstring): admission when the
    connection is made, the header deadline around the parser, the write deadline
    around the transport's flow control. aiohttp has no hooks for these, so they
    read its handler's internals (`_waiter`, `_messages`, `_request_count`,
    `_request_in_progress`, `_paused`); tests/http/test_connection_limits.py fails
    if an aiohttp upgrade changes them."""

    def __init__(self, manager: Server, *, connection_gate: ConnectionGate, admitted: _Admitted | None = None,
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = connection_gate
        # The connection's place in the gate, given back on close; over TLS, taken before the
        # handshake (then given here), otherwise in connection_made.
        self._admitted = admitted
        self._address: str | None = admitted.address if admitted is not None else None  # for logs
        self._socket: asyncio.Transport | None = None  # kept past aiohttp's force_close
        self._header_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ admission

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admitted is None:
            address = _client_address(transport.get_extra_info("peername"))
            if not _admit(self._gate, address):
                self._manager = None  # never registered: aiohttp's connection_lost is a no-op
                _reset(transport)
                return
            self._admitted = _Admitted(self._gate, address)
            self._address = address
        self._socket = transport  # type: ignore[assignment]
        super().connection_made(transport)
        self._arm_header_deadline()  # a new connection owes its first request's headers

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_header_deadline()
        self._cancel_write_deadline()
        self._socket = None
        if self._admitted is not None:
            self._admitted.release()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ header deadline

    def data_received(self, data: bytes) -> None:
        """The deadline starts with the first byte that arrives while the handler waits
        for a request (bytes that come while it is still busy with the previous one
        fall back to the keep-alive timeout) and ends when the parser has a request."""
        parsed = self._request_count
        idle = self._waiter is not None and not self._waiter.done() and not self._messages
        super().data_received(data)
        if self._request_count != parsed:  # a request's headers are complete (or refused)
            self._cancel_header_deadline()
        elif idle and data and self._header_deadline is None:  # a request has begun
            self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self._loop.call_later(
            self._gate.limits.header_read_timeout_s, self._header_timed_out
        )

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timed_out(self) -> None:
        self._header_deadline = None
        if self.transport is None or self._request_in_progress:  # never cut a request short
            return
        self._gate.header_timeouts += 1
        count = self._gate.header_timeouts
        _sampled(count)("http_header_timeout", client=self._address, dropped=count)
        self.force_close()  # nothing is being written: a plain close

    # ------------------------------------------------------------------ write deadline

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self._loop.call_later(
                self._gate.limits.write_stall_timeout_s, self._write_stalled
            )

    def resume_writing(self) -> None:
        self._cancel_write_deadline()
        super().resume_writing()

    def _cancel_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_stalled(self) -> None:
        self._write_deadline = None
        if self._socket is None or not self._paused:
            return
        self._gate.write_timeouts += 1
        count = self._gate.write_timeouts
        _sampled(count)("http_write_timeout", client=self._address, dropped=count)
        _reset(self._socket)  # fails the pending drain (ConnectionError)

    # ------------------------------------------------------------------ parser refusals

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, ConnectionError) and (self.transport is None or self.transport.is_closing()):
            raise ConnectionError("the client went away or was dropped; nothing to answer") from exc
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
    def __call__(self, admitted: _Admitted | None = None) -> RequestHandler:
        # connection_gate arrives in _kwargs, from the runner's keyword arguments.
        return _JsonErrorRequestHandler(self, loop=self._loop, admitted=admitted, **self._kwargs)


class _Admitted:
    """One admitted connection's place in the gate, given back once, by whoever is
    first: its handler when it closes, or the TLS handshake that failed before the
    handler ever started (or raced its start)."""

    __slots__ = ("_gate", "address")

    def __init__(self, gate: ConnectionGate, address: str) -> None:
        self._gate: ConnectionGate | None = gate
        self.address = address

    def release(self) -> None:
        if self._gate is not None:
            self._gate.release(self.address)
            self._gate = None


def _admit(gate: ConnectionGate, address: str) -> bool:
    """Count a new connection in, or log (sampled) why it may not stay."""
    refusal = gate.admit(address)
    if refusal is None:
        return True
    count = gate.refused_by_reason[refusal]
    _sampled(count)("http_connection_refused", reason=str(refusal), refused=count, client=address)
    return False


class _JsonErrorRunner(web.AppRunner):
    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state, our handler class (aiohttp has no hook)
        return server


class HttpServer:
    """The HTTP API of one node on `host:port` (port 0 picks a free one), within
    `limits` (the defaults of multiraft/http/limits.py unless given)."""

    def __init__(self, node: NodeApi, host: str, port: int, *, limits: ConnectionLimits | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """HTTPS with `tls`, else when the node's config has `tls_cert` and `tls_key`
        (TlsError: unusable files); plain HTTP otherwise."""
        self.node = node
        self.host = host
        self.port = port
        self._gate = ConnectionGate(limits or ConnectionLimits())
        self._runner: web.AppRunner | None = None
        config = node.config
        self._tls = tls
        if tls is None and config.tls_cert is not None and config.tls_key is not None:
            self._tls = http_server_context(config.tls_cert, config.tls_key)
        self._listener: Listener | None = None  # with TLS, instead of aiohttp's site
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes under way

    async def start(self) -> None:
        app = create_app(self.node)
        app[REGISTRY_KEY].register(ConnectionsCollector(self._gate))
        self._runner = _JsonErrorRunner(app, access_log=None,
                                        keepalive_timeout=self._gate.limits.keepalive_timeout_s,
                                        shutdown_timeout=SHUTDOWN_TIMEOUT_S, connection_gate=self._gate)
        await self._runner.setup()
        if self._tls is not None:
            self._listener = Listener(self.host, self.port, self._accept_tls, logger=_logger, name="http")
            await self._listener.start()
            self.port = self._listener.address[1]
            return
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            address = self._runner.addresses[0]
            self.port = int(address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def _accept_tls(self, accepted: AcceptedSocket) -> None:
        """The gate's bounds before the handshake; the handshake in a task of ours."""
        if not _admit(self._gate, accepted.address):
            accepted.reset()
            return
        task = asyncio.create_task(self._handshake(accepted, _Admitted(self._gate, accepted.address)),
                                   name="http-tls-handshake")
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)
        task.add_done_callback(lambda _: accepted.reset())  # a no-op once a transport has the socket

    async def _handshake(self, accepted: AcceptedSocket, admitted: _Admitted) -> None:
        """TLS within the header deadline, then aiohttp's handler on the TLS transport."""
        assert self._tls is not None and self._runner is not None and self._runner.server is not None
        server = self._runner.server
        timeout_s = self._gate.limits.header_read_timeout_s
        started = False
        try:
            async with asyncio.timeout(timeout_s):
                await upgrade(accepted, lambda: server(admitted=admitted), self._tls, timeout_s,  # type: ignore[call-arg]
                              shutdown_timeout_s=self._gate.limits.write_stall_timeout_s)
            started = True
        except (OSError, TimeoutError) as error:  # not TLS, a client that refused our certificate, silence
            gate = self._gate
            gate.tls_handshakes_failed += 1
            if isinstance(error, TimeoutError):
                gate.tls_handshake_timeouts += 1
            _sampled(gate.tls_handshakes_failed)("http_tls_handshake_failed", client=accepted.address,
                                                 error=repr(error), failed=gate.tls_handshakes_failed)
        except Exception as error:  # ours, not the client's: said, and the connection goes
            _logger.error("http_tls_handshake_error", client=accepted.address, error=repr(error))
        finally:
            if not started:  # the handler never started, or its close will find this done already
                admitted.release()

    def connection_stats(self) -> ConnectionStats:
        """Open connections, and those refused or dropped on a deadline (also in /metrics)."""
        return self._gate.stats()

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close at once with a TCP reset, dropping whatever is still buffered, ours and
    the kernel's. A plain close would wait for the buffers to drain to a client that
    does not read (asyncio's, forever; the kernel's, until it gives the socket up)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()  # type: ignore[attr-defined]


def _client_address(peername: object) -> str:
    """The client's IP ("" when the socket no longer knows it)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""


def _sampled(count: int) -> Any:
    """A flood of hostile connections must not become a flood of log lines: every
    one is counted, but only the 1st, 2nd, 4th, 8th... of a kind is a warning
    (the count is in the line); the rest are at debug."""
    return _logger.warning if count & (count - 1) == 0 else _logger.debug
