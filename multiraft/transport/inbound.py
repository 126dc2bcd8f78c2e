"""One inbound peer connection, read as an asyncio protocol.

Until the handshake is done the protocol is a small byte reader (`readexactly`,
`write`, `transport`, `get_extra_info`: what `accept_handshake` uses of a stream
pair). Once the peer has proven the cluster secret, `start_frames` turns it into
a frame parser: `data_received` splits the bytes it is given into frames, checks
each one's CRC and hands it to `on_frame` at once.

Why not a StreamReader and a reader task: through a StreamReader each frame
costs a task wake-up and two `readexactly` coroutines before it reaches
`on_frame`, and on the produce path every write crosses an inbound connection
three times (the append on each follower, the answer on the leader). Here a
frame is handed on within the callback that read it.

Bounds: before the handshake, a peer may send only what the handshake needs
(`HANDSHAKE_BYTES_MAX`); after it, the buffer holds at most one partial frame
(whose header was checked against `frame_bytes_max`) plus the last read. At most
`FRAMES_PER_TURN` frames are handed on per loop turn: past that, reading pauses
and the rest waits for the next turn, so one busy peer cannot starve the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from multiraft.transport.frames import (
    FRAME_HEADER_BYTES,
    TransportError,
    check_frame_crc,
    parse_frame_header,
)
from multiraft.transport.handshake import HandshakeError
from multiraft.transport.transport_config import TransportCounters

__all__ = ["FRAMES_PER_TURN", "HANDSHAKE_BYTES_MAX", "InboundConnection"]

# HELLO (77 bytes) and PROOF (32) are all a peer sends before the ACCEPT.
HANDSHAKE_BYTES_MAX = 1024
FRAMES_PER_TURN = 64


class InboundConnection(asyncio.Protocol):
    def __init__(
        self,
        *,
        frame_bytes_max: int,
        counters: TransportCounters,
        on_frame: Callable[[int, int, int, bytes], None],
        logger: Any,
        on_connection: Callable[[InboundConnection], None] | None = None,
    ) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._counters = counters
        self._on_frame = on_frame
        self._logger = logger
        # Called once connected, with this protocol (None: admitted before, as over TLS).
        self._on_connection = on_connection
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False  # EOF or connection lost: no more bytes will come
        self._overflowed = False  # more bytes before the handshake than it needs
        self._source: int | None = None  # set by start_frames: frames flow from here on
        self._turn_scheduled = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is no subclass of asyncio.Transport).
        self._transport = transport  # type: ignore[assignment]
        if self._on_connection is not None:
            self._on_connection(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._source is not None:
            if not self._turn_scheduled:
                self._dispatch()
            return
        if len(self._buffer) > HANDSHAKE_BYTES_MAX:
            self._overflowed = True  # the handshake fails (and is counted) with this reason
            self.abort()
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # close our side too: an inbound connection only reads

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # ------------------------------------------------------------------ the handshake's view

    async def readexactly(self, size: int) -> bytes:
        """Like StreamReader.readexactly (IncompleteReadError at the end of the stream)."""
        while len(self._buffer) < size or self._overflowed:
            if self._overflowed:
                raise HandshakeError(f"more than {HANDSHAKE_BYTES_MAX} bytes before the handshake")
            if self._ended:
                raise asyncio.IncompleteReadError(bytes(self._buffer), size)
            assert self._waiter is None, "one reader at a time"
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None
        return self._transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------------ frames

    def start_frames(self, source: int) -> None:
        """The handshake proved `source`: from now on every frame goes to `on_frame`
        (including any that arrived with the handshake's last bytes)."""
        assert self._source is None
        self._source = source
        if self._buffer:
            self._dispatch()

    def _dispatch(self) -> None:
        """Hand on the complete frames in the buffer, at most FRAMES_PER_TURN of them."""
        buffer, counters, source = self._buffer, self._counters, self._source
        assert source is not None, "frames flow only once the handshake named their source"
        position, handed = 0, 0
        try:
            with memoryview(buffer) as view:  # released before the buffer is cut below
                while len(buffer) - position >= FRAME_HEADER_BYTES:
                    if handed >= FRAMES_PER_TURN:
                        self._next_turn()
                        break
                    body_at = position + FRAME_HEADER_BYTES
                    header = parse_frame_header(view[position:body_at], self._frame_bytes_max)
                    end = body_at + header.body_bytes
                    if len(buffer) < end:
                        break
                    body = bytes(view[body_at:end])
                    check_frame_crc(header, body)
                    position = end
                    handed += 1
                    counters.frames_in += 1
                    counters.bytes_in += FRAME_HEADER_BYTES + header.body_bytes
                    self._hand_on(source, header.frame_type, header.group_id, body)
        except TransportError as error:
            counters.protocol_errors += 1
            self._logger.warning("inbound_dropped", source=source, error=repr(error))
            buffer.clear()
            self.abort()
            return
        del buffer[:position]

    def _hand_on(self, source: int, frame_type: int, group_id: int, body: bytes) -> None:
        try:
            self._on_frame(source, frame_type, group_id, body)
        except Exception as error:  # the callback's fault, not the peer's: the connection goes on
            self._counters.on_frame_errors += 1
            self._logger.exception(
                "on_frame_failed",
                source=source,
                frame_type=frame_type,
                group_id=group_id,
                error=repr(error),
            )

    def _next_turn(self) -> None:
        self._turn_scheduled = True
        with contextlib.suppress(RuntimeError):  # already closing
            self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._turn_scheduled = False
        if self._ended or self.transport.is_closing():
            return
        self._dispatch()
        if not self._turn_scheduled:
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
