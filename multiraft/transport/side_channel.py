"""Side connections: a socket of its own between two nodes, for bulk bytes that should
not go through the frame path (far-horizon catch-up's segment files,
multiraft/node/catchup_stream.py).

    node 2 (receives)                              node 1 (sends)
    listen(1) -> SideListener on <raft host>:0
       port ----------- in an RPC answer ---------->
    accept()  <------- TCP, dialled by 1 ---------  dial(2, port)
              <------- the cluster-secret handshake (handshake.py), both ways ------->
    the socket is its owner's: plain bytes, any thread

Why a connection of its own: the peer connection carries every group's Raft traffic
as frames, each copied, CRC'd and handed to a callback on the event loop; a gigabyte
of files through it took the loop and the frame code seconds on both sides. A side
connection carries the files' own bytes (os.sendfile on one end, large reads on the
other, on threads), and the files' own frame CRCs check them.

Authentication is the transport's: the same handshake and the same secret, both node
ids inside its MACs, so the listener accepts only the node it expects and the dialler
reaches only the node it named. The listener is one-shot (one authenticated
connection, then it closes) and lives at most `accept_s`; a stranger that connects
first fails the handshake and is dropped, and the listener waits on, to its deadline.
At most HANDSHAKES_MAX handshakes run at once; a connection from the expected peer's host
when they are all taken takes the place of the oldest (one from another host first), so
strangers cannot keep the peer out by filling them.

The peer's address is its raft host, resolved once per host and kept (numeric hosts are
parsed, not looked up); a name is looked up on a thread of the channel's own, never on
the loop's shared default executor (which a slow resolver would tie up for everyone).

No TLS here: with TLS between peers (`Transport(tls=...)`) the transport offers no side
channel (`Transport.side_channel()` is None) and callers keep to the frame path, which
TLS protects. Bytes are in the clear otherwise, as the peer connection's frames are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from multiraft.transport.frames import TransportError
from multiraft.transport.handshake import HandshakeError, accept_handshake, connect_handshake

__all__ = ["SideChannel", "SideListener"]

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
HANDSHAKES_MAX = 4  # side by side on one listener: a silent stranger or two hold up nobody
_Resolved = tuple[socket.AddressFamily, str]  # a host's family and numeric address


def numeric(host: str) -> _Resolved | None:
    """`host` when it is a numeric address (parsed: no lookup), else None."""
    try:
        info = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None
    return info[0][0], str(info[0][4][0])


class _SocketIo:
    """What the handshake reads and writes with (handshake.py's HandshakeReader and
    HandshakeWriter), over a non-blocking socket on the event loop."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.transport = self  # the writer's `transport.is_closing()`

    def is_closing(self) -> bool:
        return self._sock.fileno() == -1

    def write(self, data: bytes) -> None:
        # A handshake message (at most 109 bytes) on a fresh connection: the send buffer
        # takes it whole, or the connection is no good.
        try:
            sent = self._sock.send(data)
        except OSError as error:
            raise HandshakeError(f"side connection: {error!r}") from None
        if sent != len(data):
            raise HandshakeError("side connection: a short write during the handshake")

    async def readexactly(self, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < size:
            part = await loop.sock_recv(self._sock, size - len(data))
            if not part:
                raise asyncio.IncompleteReadError(data, size)
            data += part
        return data


class SideListener:
    """One authenticated connection from `peer`, then closed. `close` whatever happened."""

    def __init__(self, sock: socket.socket, node_id: int, peer: int, secret: bytes, handshake_s: float,
                 peer_host: str | None = None) -> None:
        """`peer_host`: the peer's numeric address, whose connections come first (None: unknown)."""
        self._sock = sock
        self._node_id = node_id
        self._peer = peer
        self._secret = secret
        self._handshake_s = handshake_s
        self._peer_host = peer_host
        self.port: int = sock.getsockname()[1]

    async def accept(self, accept_s: float) -> socket.socket:
        """The first connection that proves the secret and is `peer`, within `accept_s`
        (TimeoutError otherwise); a non-blocking socket, its caller's to close. Handshakes
        run side by side (HANDSHAKES_MAX), so a stranger that connects and says nothing
        does not hold the peer up; the listener closes on return."""
        loop = asyncio.get_running_loop()
        accepting: asyncio.Future[tuple[socket.socket, object]] = asyncio.ensure_future(loop.sock_accept(self._sock))
        # -> the host it came from; oldest first (insertion order)
        handshakes: dict[asyncio.Future[socket.socket | None], str] = {}
        evicted: list[asyncio.Future[socket.socket | None]] = []
        try:
            async with asyncio.timeout(accept_s):
                while True:
                    done, _ = await asyncio.wait({accepting, *handshakes}, return_when=asyncio.FIRST_COMPLETED)
                    finished = [handshake for handshake in handshakes if handshake in done]
                    if accepting in done:
                        sock, address = accepting.result()
                        self._admit(sock, str(address[0]), handshakes, evicted)
                        accepting = asyncio.ensure_future(loop.sock_accept(self._sock))
                    for handshake in finished:
                        del handshakes[handshake]
                        if (sock := handshake.result()) is not None:
                            return sock
        finally:
            accepting.cancel()
            for handshake in [*handshakes, *evicted]:
                handshake.cancel()
            await asyncio.gather(accepting, *handshakes, *evicted, return_exceptions=True)
            self.close()

    def _admit(self, sock: socket.socket, host: str, handshakes: dict[asyncio.Future[socket.socket | None], str],
               evicted: list[asyncio.Future[socket.socket | None]]) -> None:
        """Start `sock`'s handshake; all taken, it takes the oldest's place when it comes
        from the peer's host (a stranger's first), else it is dropped."""
        if len(handshakes) >= HANDSHAKES_MAX:
            if self._peer_host is not None and host != self._peer_host:
                sock.close()
                return
            victim = next((h for h, source in handshakes.items() if source != self._peer_host), next(iter(handshakes)))
            del handshakes[victim]
            victim.cancel()  # (it closes its socket)
            evicted.append(victim)
        handshakes[asyncio.ensure_future(self._handshake(sock))] = host

    async def _handshake(self, sock: socket.socket) -> socket.socket | None:
        """`sock` once it proved to be `peer`; None (and closed) otherwise."""
        try:
            sock.setblocking(False)
            async with asyncio.timeout(self._handshake_s):
                io = _SocketIo(sock)
                source = await accept_handshake(io, io, secret=self._secret, node_id=self._node_id)
            if source != self._peer:
                raise HandshakeError(f"side connection from node {source}, expected node {self._peer}")
        except (OSError, TimeoutError, TransportError, asyncio.IncompleteReadError):
            sock.close()
            return None
        except BaseException:  # cancelled
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self._sock.close()


class SideChannel:
    def __init__(self, node_id: int, secret: bytes, listen_host: str, address_of: Callable[[int], tuple[str, int] | None],
                 handshake_s: float, connect_s: float) -> None:
        """`address_of(peer)`: the peer's raft address (its host is dialled), None if unknown."""
        self._node_id = node_id
        self._secret = secret
        self._listen_host = listen_host
        self._source_host = None if listen_host in _WILDCARD_HOSTS else listen_host
        self._address_of = address_of
        self._handshake_s = handshake_s
        self._connect_s = connect_s
        self._resolved: dict[str, _Resolved] = {}  # raft host -> its address (hosts are few: one a peer)
        self._resolver: ThreadPoolExecutor | None = None  # made on the first name to look up

    def listen(self, peer: int) -> SideListener:
        """A one-shot listener for `peer`, on this node's raft host and a port of the OS's choice."""
        family = socket.AF_INET6 if ":" in self._listen_host else socket.AF_INET
        sock = socket.create_server((self._listen_host, 0), family=family, backlog=4)
        sock.setblocking(False)
        address = self._address_of(peer)
        known = None if address is None else self._resolved.get(address[0]) or numeric(address[0])
        return SideListener(sock, self._node_id, peer, self._secret, self._handshake_s,
                            None if known is None else known[1])

    async def _resolve(self, host: str) -> _Resolved:
        """`host`'s address: parsed if numeric, else looked up once (on the resolver's thread) and kept."""
        if (known := self._resolved.get(host) or numeric(host)) is None:
            if self._resolver is None:
                self._resolver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="side-resolve")
            infos = await asyncio.get_running_loop().run_in_executor(
                self._resolver, lambda: socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
            known = infos[0][0], str(infos[0][4][0])
        self._resolved[host] = known
        return known

    async def dial(self, peer: int, port: int) -> socket.socket:
        """An authenticated connection to `peer`'s side listener on `port` (OSError,
        TimeoutError or TransportError when there is none); the caller's to close."""
        address = self._address_of(peer)
        if address is None:
            raise TransportError(f"no address known for node {peer}")
        family, host = await self._resolve(address[0])
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            if self._source_host is not None:  # our own raft host, as the peer links (chaos cuts by address)
                sock.bind((self._source_host, 0))
            async with asyncio.timeout(self._connect_s):
                await loop.sock_connect(sock, (host, port))
            async with asyncio.timeout(self._handshake_s):
                io = _SocketIo(sock)
                await connect_handshake(io, io, secret=self._secret, node_id=self._node_id, peer_id=peer)  # type: ignore[arg-type]
        except BaseException:
            with contextlib.suppress(OSError):
                sock.close()
            raise
        return sock
