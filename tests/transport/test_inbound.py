"""The inbound connection protocol on a real socket pair: frames cut anywhere are
handed on whole and in order, a burst is handed on FRAMES_PER_TURN frames per loop
turn, and a peer may not pile up bytes before its handshake is done."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import structlog

from multiraft.transport.frames import FrameType, encode_frame
from multiraft.transport.handshake import HandshakeError
from multiraft.transport.inbound import FRAMES_PER_TURN, HANDSHAKE_BYTES_MAX, InboundConnection
from multiraft.transport.transport_config import TransportConfig, TransportCounters
from tests.transport.helpers import Inbox, until


class _Pair:
    """An InboundConnection on one end of a socket pair; raw bytes go in at the other."""

    def __init__(self) -> None:
        self.inbox = Inbox()
        self.counters = TransportCounters()
        self.connections: list[InboundConnection] = []
        self.peer, self._ours = socket.socketpair()
        self.peer.setblocking(False)

    async def start(self) -> InboundConnection:
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(self._factory, self._ours)
        return self.connections[0]

    def _factory(self) -> InboundConnection:
        return InboundConnection(
            frame_bytes_max=TransportConfig().frame_bytes_max,
            counters=self.counters,
            on_frame=self.inbox,
            logger=structlog.get_logger("test"),
            on_connection=self.connections.append,
        )

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.peer, data)

    def close(self) -> None:
        for connection in self.connections:
            connection.abort()
        self.peer.close()


@pytest_asyncio.fixture
async def pair() -> AsyncIterator[_Pair]:
    made = _Pair()
    yield made
    made.close()


def _frames(count: int, seed: int) -> list[tuple[int, int, int, bytes]]:
    rng = random.Random(seed)
    return [
        (7, FrameType.RAFT_MESSAGE, rng.randrange(1, 1000), rng.randbytes(rng.randrange(0, 300)))
        for _ in range(count)
    ]


def _wire(frames: list[tuple[int, int, int, bytes]]) -> bytes:
    return b"".join(encode_frame(kind, group, body) for _, kind, group, body in frames)


# Goal: however the bytes are cut (here at random points, down to single bytes), every
# frame reaches on_frame whole, once, in order, and nothing before start_frames does.
@pytest.mark.asyncio
async def test_frames_cut_anywhere_arrive_whole_and_in_order(pair: _Pair) -> None:
    async with asyncio.timeout(10):
        connection = await pair.start()
        frames = _frames(40, seed=1)
        wire = _wire(frames)
        await pair.send(wire[:5])
        await asyncio.sleep(0.01)
        assert pair.inbox.frames == []  # no frames before the handshake says who sent them
        connection.start_frames(7)
        rng = random.Random(2)
        position = 5
        while position < len(wire):
            cut = position + rng.choice([1, 2, 3, 17, 64, 500])
            await pair.send(wire[position:cut])
            await asyncio.sleep(0.001)  # separate reads, most of the time
            position = cut
        await until(lambda: len(pair.inbox.frames) == len(frames), what="every frame")
        assert pair.inbox.frames == frames
        assert pair.counters.frames_in == len(frames)
        assert pair.counters.protocol_errors == 0


# Goal: a burst of frames read at once is handed on FRAMES_PER_TURN per loop turn
# (reading paused in between), so one busy peer cannot hold the loop; all arrive.
@pytest.mark.asyncio
async def test_a_burst_is_handed_on_a_bounded_number_of_frames_per_turn(pair: _Pair) -> None:
    async with asyncio.timeout(10):
        connection = await pair.start()
        connection.start_frames(7)
        frames = _frames(3 * FRAMES_PER_TURN + 5, seed=3)
        handed_before_next_turn: list[int] = []
        loop = asyncio.get_running_loop()

        def on_frame(source: int, frame_type: int, group_id: int, body: bytes) -> None:
            if not pair.inbox.frames:
                loop.call_soon(lambda: handed_before_next_turn.append(len(pair.inbox.frames)))
            pair.inbox(source, frame_type, group_id, body)

        connection._on_frame = on_frame  # observe the turns; the parsing is the real one
        await pair.send(_wire(frames))  # small frames: one read takes them all
        await until(lambda: len(pair.inbox.frames) == len(frames), what="every frame")
        assert pair.inbox.frames == frames
        assert handed_before_next_turn == [FRAMES_PER_TURN]


# Goal: before the handshake a peer may send only what the handshake needs; more
# fails the handshake (with the reason) and drops the connection.
@pytest.mark.asyncio
async def test_bytes_past_the_handshake_bound_fail_it(pair: _Pair) -> None:
    async with asyncio.timeout(10):
        connection = await pair.start()
        await pair.send(bytes(HANDSHAKE_BYTES_MAX + 1))
        with pytest.raises(HandshakeError, match="before the handshake"):
            await connection.readexactly(HANDSHAKE_BYTES_MAX + 100)
        await connection.closed


# Goal: the end of the stream mid-read is an IncompleteReadError, as a StreamReader's
# (the handshake turns it into a refusal); the connection then counts as closed.
@pytest.mark.asyncio
async def test_end_of_stream_during_a_read(pair: _Pair) -> None:
    async with asyncio.timeout(10):
        connection = await pair.start()
        await pair.send(b"abc")
        assert await connection.readexactly(2) == b"ab"
        pair.peer.shutdown(socket.SHUT_WR)
        with pytest.raises(asyncio.IncompleteReadError):
            await connection.readexactly(2)
        await connection.closed
