"""HTTP/1.1 keep-alive connections for the client: one exchange at a time on each.

Why not aiohttp's client: one request through `aiohttp.ClientSession` cost this
client about 0.8 ms of CPU on this machine (a sequential single-record produce:
1.10 ms of client CPU through aiohttp, 0.32 ms through a plain asyncio protocol),
more than the node spent serving it, and a client shares the cores with the nodes.
The server is ours and answers every request with a `Content-Length` (or no body
for 204/304), so the client needs only this small subset of HTTP/1.1: a request
line, headers and a sized body out; a status line, headers and a sized body in.
A response framed any other way (chunked) is refused with a clear error.

Errors say whether the request may have reached the server:
`ConnectFailed` (nothing was sent: always safe to retry) or `ExchangeFailed`
(sent, answer lost or malformed: the outcome is unknown). `CertificateRefused`,
a `ConnectFailed`, means the server's certificate did not verify: nothing was
sent, and trying again will not help.

`https://` servers are reached over TLS with the pool's context (the client's
`--ca`, or the system's trust store), verifying the certificate and that it
names the host dialled.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import quote, urlencode, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from multiraft.client.credentials import client_context

HEAD_BYTES_MAX = 64 * 1024  # status line + headers of one response
# The largest answer: a consume of 64 MiB (partition_ops.MAX_BYTES_MAX) as JSON (base64).
BODY_BYTES_MAX = 256 * 1024 * 1024
CONNECTIONS_PER_SERVER_MAX = 100  # aiohttp's default connector limit
# Idle connections are dropped well before the server closes them (aiohttp's server:
# 75 s keep-alive), so a request is not sent on a connection the server is closing.
IDLE_KEEP_S = 15.0
# How long `close` waits for connections to finish closing: a TLS connection's close is a
# round trip (close_notify) that must end before its loop does; after this, it is cut.
CLOSE_WAIT_S = 1.0
_NO_BODY_STATUSES = frozenset((204, 304))


class ConnectFailed(Exception):
    """No connection could be made; the request was not sent."""


class CertificateRefused(ConnectFailed):
    """The server's TLS certificate did not verify (unknown CA, another host's name, expired)."""


class ExchangeFailed(Exception):
    """The request was (perhaps) sent, and no complete answer came back."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


class _Exchange(asyncio.Protocol):
    """One TCP connection; parses the answer to the one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done once fully closed
        self.idle_since = time.monotonic()
        self.answered = False  # a byte came back on this connection, ever
        self._buffer = bytearray()  # the head, until it is complete
        self._body: list[bytes] = []  # then the body's chunks, joined once at the end
        self._body_bytes = 0
        self._waiter: asyncio.Future[Response] | None = None
        self._head: tuple[int, CIMultiDict[str], int] | None = None  # status, headers, body length

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always a subclass of asyncio.Transport (uvloop's
        # is not), so it is taken for one rather than checked.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        self._fail(ExchangeFailed(f"the connection closed before the answer was complete ({exc!r})"))

    def eof_received(self) -> bool:
        self.closed = True
        self._fail(ExchangeFailed("the server closed the connection before the answer was complete"))
        return False

    def send(self, request: bytes) -> asyncio.Future[Response]:
        assert self._waiter is None and self.transport is not None and not self.closed
        self._waiter = asyncio.get_running_loop().create_future()
        self._reset()
        self.transport.write(request)
        return self._waiter

    def transport_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self._waiter is None:
            self._fail_unsolicited()
            return
        try:
            self._parse(data)
        except ExchangeFailed as error:
            self._fail(error)
            self.close()

    def _parse(self, data: bytes) -> None:
        if self._head is None:
            self._buffer += data
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > HEAD_BYTES_MAX:
                    raise ExchangeFailed(f"response head longer than {HEAD_BYTES_MAX} bytes")
                return
            self._head = _parse_head(bytes(self._buffer[:end]))
            data = bytes(self._buffer[end + 4 :])
        if data:
            self._body.append(data)
            self._body_bytes += len(data)
        status, headers, length = self._head
        if self._body_bytes < length:
            return
        if self._body_bytes > length:
            raise ExchangeFailed("the server sent more bytes than its Content-Length")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        keep = headers.get("Connection", "").lower() != "close"
        waiter, self._waiter = self._waiter, None
        self._reset()
        self.idle_since = time.monotonic()
        if not keep:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(status, CIMultiDictProxy(headers), body))

    def _reset(self) -> None:
        self._buffer.clear()
        self._body = []
        self._body_bytes = 0
        self._head = None

    def _fail(self, error: ExchangeFailed) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _fail_unsolicited(self) -> None:
        self.close()  # bytes nobody asked for: this connection can no longer be trusted


def _parse_head(head: bytes) -> tuple[int, CIMultiDict[str], int]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ExchangeFailed(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ExchangeFailed(f"malformed response header line: {line[:80]!r}")
        headers.add(name.strip(), value.strip())
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        raise ExchangeFailed("chunked responses are not supported by this client")
    length = 0
    if status not in _NO_BODY_STATUSES:
        raw = headers.get("Content-Length")
        if raw is None or not raw.isdigit():
            raise ExchangeFailed(f"response without a valid Content-Length (status {status})")
        length = int(raw)
        if length > BODY_BYTES_MAX:
            raise ExchangeFailed(f"response body of {length} bytes exceeds {BODY_BYTES_MAX}")
    return status, headers, length


# A client sends the same few URLs over and over (a producer: one per partition);
# splitting and quoting each anew cost about a tenth of a small request's client CPU.
@functools.lru_cache(maxsize=1024)
def _split(url: str) -> tuple[str, str | None, int | None, str, str]:
    """(scheme, hostname, port, netloc, quoted path) of `url`."""
    parts = urlsplit(url)
    path = quote(parts.path or "/", safe="/:@!$&'()*+,;=-._~")
    return parts.scheme, parts.hostname, parts.port, parts.netloc, path


@functools.lru_cache(maxsize=1024)
def _query(items: tuple[tuple[str, str], ...]) -> str:
    return urlencode(items)


@dataclass(slots=True)
class _Server:
    key: str
    host: str
    port: int
    host_header: str
    tls: ssl.SSLContext | None  # https
    idle: list[_Exchange] = field(default_factory=list)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CONNECTIONS_PER_SERVER_MAX))


class ConnectionPool:
    """Keep-alive connections per server, at most CONNECTIONS_PER_SERVER_MAX each."""

    def __init__(self, local_host: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._local_host = local_host  # source address of every connection (fault rules match it)
        self._tls = tls  # for https:// servers; None: the system's trust store, made when needed
        self._servers: dict[str, _Server] = {}
        self._open: set[_Exchange] = set()  # connections not yet fully closed

    async def request(self, method: str, url: str, *, body: bytes = b"",
                      query: dict[str, str] | tuple[tuple[str, str], ...] | None = None,
                      headers: dict[str, str] | None = None, timeout_s: float) -> Response:
        """One exchange. Raises ConnectFailed, ExchangeFailed or TimeoutError (outcome unknown).
        `query`: a dict, or (name, value) pairs when a name repeats."""
        server = self._server(url)
        target = _split(url)[4]
        if query:
            target += "?" + _query(query if isinstance(query, tuple) else tuple(query.items()))
        lines = [f"{method} {target} HTTP/1.1", f"Host: {server.host_header}", f"Content-Length: {len(body)}"]
        lines.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        sent = False
        try:
            async with asyncio.timeout(timeout_s), server.slots:  # the wait for a slot is bounded too
                exchange = await self._connection(server)
                sent = True
                try:
                    response = await exchange.send(request)
                except ExchangeFailed as error:
                    exchange.close()
                    if server.tls is None and not exchange.answered:
                        raise ExchangeFailed(f"{error}; if the node serves HTTPS (it closes plain HTTP connections "
                                             "this way), use https://HOST:PORT or --ca FILE") from None
                    raise
                except BaseException:
                    exchange.close()  # an exchange cut off midway leaves the connection unusable
                    raise
        except TimeoutError:
            if not sent:
                raise ConnectFailed(f"no connection to {server.host_header} within {timeout_s} s") from None
            raise
        if not exchange.closed:
            if self._servers.get(server.key) is server:
                server.idle.append(exchange)
            else:
                exchange.close()  # the pool was closed while this exchange ran
        return response

    async def close(self) -> None:
        """Close the idle connections (a later request opens new ones, as after a restart),
        and wait, briefly, for those closing to finish (TLS's close takes a round trip)."""
        servers, self._servers = self._servers, {}
        for server in servers.values():
            for exchange in server.idle:
                exchange.close()
            server.idle.clear()
        closing = [exchange for exchange in self._open if exchange.closed]
        await asyncio.sleep(0)  # let the transports finish closing
        if closing:
            await asyncio.wait([exchange.lost for exchange in closing], timeout=CLOSE_WAIT_S)
            for exchange in closing:
                if not exchange.lost.done() and exchange.transport is not None:
                    exchange.transport.abort()

    def _server(self, url: str) -> _Server:
        scheme, hostname, port, netloc, _ = _split(url)
        key = f"{scheme}://{hostname}:{port}"
        server = self._servers.get(key)
        if server is None:
            if scheme not in ("http", "https") or hostname is None:
                raise ConnectFailed(f"{url}: only http://host:port and https://host:port servers are supported")
            tls = None
            if scheme == "https":
                if self._tls is None:
                    self._tls = client_context(None)  # the system's trust store
                tls = self._tls
            server = _Server(key, hostname, port or (443 if tls else 80), netloc, tls)
            self._servers[key] = server
        return server

    async def _connection(self, server: _Server) -> _Exchange:
        now = time.monotonic()
        while server.idle:
            exchange = server.idle.pop()
            # `closed` comes from a callback; a reset the loop just saw closes the transport
            # first (uvloop then refuses writes with a RuntimeError): check both.
            if not exchange.closed and not exchange.transport_closing() and now - exchange.idle_since < IDLE_KEEP_S:
                return exchange
            exchange.close()
        loop = asyncio.get_running_loop()
        local = (self._local_host, 0) if self._local_host else None
        try:
            _, exchange = await loop.create_connection(
                _Exchange, server.host, server.port, local_addr=local, ssl=server.tls,
                server_hostname=server.host if server.tls is not None else None)
        except ssl.SSLCertVerificationError as error:
            raise CertificateRefused(f"{server.host_header}: the server's certificate did not verify "
                                     f"({error.verify_message}); give the CA that signed it with --ca FILE "
                                     "or $RAFTLOG_CA") from error
        except OSError as error:
            raise ConnectFailed(f"cannot connect to {server.host_header}: {error}") from error
        self._open.add(exchange)
        exchange.lost.add_done_callback(lambda _: self._open.discard(exchange))
        return exchange
