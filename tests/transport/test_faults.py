"""Bad peers cost one connection each, never the transport: wrong secret, wrong node,
garbage, corrupted and oversized frames."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct

import pytest

from multiraft.transport.frames import FRAME_HEADER_BYTES, FrameType, encode_frame
from multiraft.transport.handshake import HandshakeError, connect_handshake
from multiraft.transport.transport import Transport
from multiraft.transport.transport_config import TransportConfig
from tests.transport.helpers import FAST, SECRET, WRONG_SECRET, Inbox, make_transport, until


async def _serving_pair(
    stopper: list[Transport], config: TransportConfig = FAST
) -> tuple[Transport, Transport, Inbox]:
    """Node 1 (the victim) and node 2 (a good peer that dials it)."""
    inbox = Inbox()
    victim = make_transport(1, 0, {}, inbox, config=config)
    good = make_transport(2, 0, {}, Inbox())
    stopper.extend([victim, good])
    await victim.start()
    await good.start()
    good.update_peers({1: victim.listen_address})
    return victim, good, inbox


async def _still_serving(victim: Transport, good: Transport, inbox: Inbox, tag: bytes) -> None:
    good.send(1, FrameType.RAFT_MESSAGE, 5, tag)
    await until(lambda: (2, FrameType.RAFT_MESSAGE, 5, tag) in inbox.frames, what=tag)


async def _raw_connection(
    victim: Transport, *, secret: bytes | None = SECRET, node_id: int = 9
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare TCP connection to the victim, handshaken as `node_id` unless secret is None."""
    host, port = victim.listen_address
    reader, writer = await asyncio.open_connection(host, port)
    if secret is not None:
        try:
            await connect_handshake(reader, writer, secret=secret, node_id=node_id, peer_id=1)
        except BaseException:
            writer.close()
            raise
    return reader, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _closed_by_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The victim hangs up without answering (a reset when our bytes were left unread)."""
    try:
        assert await reader.read(1) == b"", "the victim must hang up, not answer"
    except ConnectionResetError:
        pass
    finally:
        await _close(writer)


# Goal: a node with the wrong secret is refused in both directions (neither side
# proves itself to the other), while the good peer keeps being served.
@pytest.mark.asyncio
async def test_wrong_secret_is_refused_and_good_peers_are_served(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        victim, good, inbox = await _serving_pair(stopper)
        intruder_inbox = Inbox()
        intruder = make_transport(3, 0, {}, intruder_inbox, secret=WRONG_SECRET)
        stopper.append(intruder)
        await intruder.start()
        intruder.update_peers({1: victim.listen_address})
        victim.update_peers({2: good.listen_address, 3: intruder.listen_address})
        intruder.send(1, FrameType.RAFT_MESSAGE, 5, b"intruder")
        victim.send(3, FrameType.RAFT_MESSAGE, 5, b"secret stuff")
        await until(lambda: victim.stats().handshakes_refused >= 1, what="inbound refusal")
        await until(lambda: victim.stats().peers[3].connect_failures >= 1, what="outbound refusal")
        await _still_serving(victim, good, inbox, b"after intruder")
        assert intruder.stats().connects == 0 and not victim.peer_connected(3)
        assert intruder_inbox.frames == [] and inbox.from_source(3) == []


# Goal: the client side reports a wrong secret as a refused handshake (HandshakeError).
@pytest.mark.asyncio
async def test_client_with_wrong_secret_gets_handshake_error(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, _, _ = await _serving_pair(stopper)
        with pytest.raises(HandshakeError, match="failed to prove"):
            await _raw_connection(victim, secret=WRONG_SECRET)


# Goal: dialling an address where another node id listens fails the handshake.
@pytest.mark.asyncio
async def test_wrong_node_at_address_is_refused(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, _, _ = await _serving_pair(stopper)
        host, port = victim.listen_address
        reader, writer = await asyncio.open_connection(host, port)
        try:
            with pytest.raises(HandshakeError, match="WRONG_NODE"):
                await connect_handshake(reader, writer, secret=SECRET, node_id=9, peer_id=4)
        finally:
            await _close(writer)


# Goal: a connection that never completes its handshake is closed after the bound.
@pytest.mark.asyncio
async def test_silent_connection_times_out(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, good, inbox = await _serving_pair(stopper)
        reader, writer = await _raw_connection(victim, secret=None)
        await _closed_by_peer(reader, writer)
        assert victim.stats().handshakes_refused == 1
        await _still_serving(victim, good, inbox, b"after silence")


def _bad_crc_frame() -> bytes:
    frame = bytearray(encode_frame(FrameType.RAFT_MESSAGE, 3, b"payload"))
    frame[-1] ^= 0x01
    return bytes(frame)


def _oversized_header() -> bytes:
    # Declares 1 GiB; the body is never sent, and must never be waited for.
    return struct.pack(">IIBQ", 2**30, 0, FrameType.RAFT_MESSAGE, 3)


def _short_length_header() -> bytes:
    return struct.pack(">IIBQ", 5, 0, FrameType.RAFT_MESSAGE, 3)


def _type_zero_frame() -> bytes:
    return bytes(FRAME_HEADER_BYTES)


# Goal: after a valid handshake, each kind of bad frame drops that connection only;
# frames before the bad one were delivered, none after, and the node keeps serving.
@pytest.mark.parametrize(
    "bad", [_bad_crc_frame, _oversized_header, _short_length_header, _type_zero_frame]
)
@pytest.mark.asyncio
async def test_bad_frame_drops_the_connection(stopper, bad) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, good, inbox = await _serving_pair(stopper)
        reader, writer = await _raw_connection(victim, node_id=9)
        good_frame = encode_frame(FrameType.RAFT_MESSAGE, 3, b"fine")
        writer.write(good_frame + bad() + good_frame)
        await _closed_by_peer(reader, writer)
        assert inbox.from_source(9) == [(9, FrameType.RAFT_MESSAGE, 3, b"fine")]
        assert victim.stats().protocol_errors == 1
        await _still_serving(victim, good, inbox, b"after bad frame")


# Goal: garbage instead of a hello is refused at the handshake, without harm.
@pytest.mark.asyncio
async def test_garbage_before_handshake(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, good, inbox = await _serving_pair(stopper)
        reader, writer = await _raw_connection(victim, secret=None)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        try:
            # A refusal challenge then EOF, or a reset: the victim aborts with our
            # unread garbage still in its receive buffer.
            refusal = await reader.read()
            assert refusal == b"" or refusal.startswith(b"RLTP")
        except ConnectionResetError:
            pass
        finally:
            await _close(writer)
        assert victim.stats().handshakes_refused == 1
        await _still_serving(victim, good, inbox, b"after garbage")


# Goal: a peer that redials replaces its previous inbound connection (one per source).
@pytest.mark.asyncio
async def test_redial_replaces_the_inbound_connection(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        victim, _, _ = await _serving_pair(stopper)
        first_reader, first_writer = await _raw_connection(victim, node_id=9)
        _, second_writer = await _raw_connection(victim, node_id=9)
        await _closed_by_peer(first_reader, first_writer)
        second_writer.write(encode_frame(FrameType.RAFT_MESSAGE, 1, b"still here"))
        await until(lambda: victim.stats().frames_in >= 1)
        await _close(second_writer)


# Goal: connections beyond inbound_connections_max are closed at once (counted), so
# unauthenticated sockets cannot pile up; the good peer keeps its connection.
@pytest.mark.asyncio
async def test_inbound_connection_limit(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        config = dataclasses.replace(
            FAST,
            inbound_connections_max=2,
            handshakes_pending_max=1,
            handshakes_pending_per_address_max=1,
        )
        victim, good, inbox = await _serving_pair(stopper, config)
        await _still_serving(victim, good, inbox, b"one inbound in use")
        idle_reader, idle_writer = await _raw_connection(victim, secret=None)
        extra_reader, extra_writer = await _raw_connection(victim, secret=None)
        await _closed_by_peer(extra_reader, extra_writer)
        assert victim.stats().inbound_refused == 1
        assert victim.stats().inbound_refused_by_reason == {"connections_full": 1}
        await _still_serving(victim, good, inbox, b"still served")
        await _closed_by_peer(idle_reader, idle_writer)  # the handshake timeout ends it
