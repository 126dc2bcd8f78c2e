"""Shared pieces of the transport tests: a frame collector, polling, raw peers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from multiraft.transport.transport import Transport
from multiraft.transport.transport_config import TransportConfig

SECRET = b"test-cluster-secret-0123456789"
WRONG_SECRET = b"another-cluster-secret-98765432"

# Short timeouts so failure paths resolve in milliseconds, not seconds.
FAST = TransportConfig(
    handshake_timeout_s=1.0,
    connect_timeout_s=1.0,
    reconnect_backoff_initial_s=0.01,
    reconnect_backoff_max_s=0.1,
    write_stall_timeout_s=5.0,
)


@dataclass
class Inbox:
    """Records every delivered frame, in order."""

    frames: list[tuple[int, int, int, bytes]] = field(default_factory=list)

    def __call__(self, source: int, frame_type: int, group_id: int, body: bytes) -> None:
        self.frames.append((source, frame_type, group_id, body))

    def from_source(self, source: int) -> list[tuple[int, int, int, bytes]]:
        return [frame for frame in self.frames if frame[0] == source]


async def until(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    """Poll `condition` until it holds; fail after `timeout_s` (never a blind sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.005)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def make_transport(
    node_id: int,
    port: int,
    peers: dict[int, tuple[str, int]],
    inbox: Inbox,
    *,
    secret: bytes = SECRET,
    config: TransportConfig = FAST,
) -> Transport:
    return Transport(node_id, "127.0.0.1", port, peers, secret, inbox, config=config)


class RawPeer:
    """A TCP server on 127.0.0.1 that hands each accepted connection to `handler`
    and closes everything on `close()`: a stand-in for a misbehaving node."""

    def __init__(self, handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]):
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        return self._server.sockets[0].getsockname()[1]

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        task = asyncio.ensure_future(self._handler(reader, writer))  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
