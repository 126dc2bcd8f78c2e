"""A listening socket for TLS: admission before the handshake, the handshake before the protocol.

Used by the HTTP server and the raft transport when TLS is on (plain listeners
are unchanged). Why not `loop.create_server(ssl=...)`: there a connection's
protocol hears of it (`connection_made`) only once its TLS handshake is done,
and the connection bounds live in `connection_made` (multiraft/http/server.py,
multiraft/transport/transport.py): strangers that open TCP and never finish TLS would hold
sockets outside every bound, for the loop's own 60 s handshake timeout. Nor
`loop.start_tls` on an accepted transport: uvloop starts reading right after
`connection_made`, so a client's first TLS bytes can reach the plain protocol
before the upgrade (seen on this machine, uvloop 0.23).

So: `Listener` accepts on a socket of its own (`sock_accept`) and hands each
`AcceptedSocket` to its owner, which admits or refuses the address at once (a
refusal is a reset, nothing more) and upgrades an admitted one in a task of its
own with `upgrade` (`loop.connect_accepted_socket(..., ssl=)`) under its own
deadline. The protocol then starts on the TLS transport as usual. Only public
APIs of asyncio and uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["AcceptedSocket", "Listener", "upgrade"]

P = TypeVar("P", bound=asyncio.BaseProtocol)
# After an accept fails for want of resources (EMFILE: out of file descriptors), wait
# before the next one rather than spin; asyncio's own listener waits the same second.
ACCEPT_RETRY_S = 1.0
BACKLOG = 100  # asyncio's create_server default
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


class AcceptedSocket:
    """An accepted socket, its owner's until a transport takes it (`hand_over`). `reset`
    closes it with a TCP reset, unless a transport has it: call it when done, whatever
    happened (say from the done-callback of the task that upgrades it, which covers a
    task cancelled before it ever ran)."""

    __slots__ = ("_handed", "address", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer  # the client's (host, port, ...) as accept gave it
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._handed = False

    def hand_over(self) -> socket.socket:
        self._handed = True
        return self.sock

    def reset(self) -> None:
        if self._handed:
            return
        self._handed = True
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.sock.close()


async def upgrade(accepted: AcceptedSocket, factory: Callable[[], P], context: ssl.SSLContext,
                  timeout_s: float, *, shutdown_timeout_s: float | None = None) -> tuple[asyncio.BaseTransport, P]:
    """Run the server side of the TLS handshake on `accepted`, then start `factory()`'s
    protocol on the TLS transport. The caller bounds this with its own deadline of
    `timeout_s` (asyncio.timeout); the loop's handshake timeout, just past it, is only
    a backstop. `shutdown_timeout_s` bounds a close's TLS shutdown (flushing what is
    buffered to a client that may not read; the loop's default is 30 s), after which
    the connection is cut. Raises OSError (ssl.SSLError: a client that is not TLS, or
    whose certificate the context refuses) or TimeoutError; the socket is closed then."""
    loop = asyncio.get_running_loop()
    made: list[P] = []

    def make() -> P:
        protocol = factory()
        made.append(protocol)
        return protocol

    # The protocol is taken from the factory, not from the answer: uvloop answers with its
    # SSLProtocol, asyncio with ours.
    transport, _ = await loop.connect_accepted_socket(make, accepted.hand_over(), ssl=context,
                                                      ssl_handshake_timeout=timeout_s + 1.0,
                                                      ssl_shutdown_timeout=shutdown_timeout_s)
    assert len(made) == 1
    return transport, made[0]


class Listener:
    """Listens on `host:port` (0: a free port) and calls `on_socket` for each accepted
    connection, at once, in the accepting task. `on_socket` must not block; the socket
    is then its own (reset it, or upgrade it)."""

    def __init__(self, host: str, port: int, on_socket: Callable[[AcceptedSocket], None], *,
                 logger: Any, name: str) -> None:
        self._host = host
        self._port = port
        self._on_socket = on_socket
        self._logger = logger
        self._name = name
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        assert self._sock is None, "a listener starts once"
        family, _, _, _, address = socket.getaddrinfo(
            self._host or None, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._sock = socket.create_server(address, family=family, backlog=BACKLOG)  # SO_REUSEADDR on POSIX
        self._sock.setblocking(False)
        self._task = asyncio.create_task(self._accept_loop(self._sock), name=f"{self._name}-accept")

    @property
    def address(self) -> tuple[str, int]:
        assert self._sock is not None, "start() first"
        host, port = self._sock.getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting; connections already handed on are their owners' to close."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close()

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as error:  # out of descriptors or buffers; a connection aborted in the queue
                self._logger.warning("accept_failed", listener=self._name, error=repr(error))
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            sock.setblocking(False)
            accepted = AcceptedSocket(sock, peer)
            try:
                self._on_socket(accepted)
            except Exception as error:  # the owner's bug must not end the listener
                self._logger.exception("accept_handler_failed", listener=self._name, error=repr(error))
                accepted.reset()
