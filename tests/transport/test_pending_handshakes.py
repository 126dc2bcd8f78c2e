"""Hostile raft-port clients: connections that never authenticate are bounded in
number (all strangers together, and per source address), known peers still get in,
and a handshake left half done is closed after `handshake_timeout_s`.

Strangers connect from other loopback addresses (127.0.0.2, 127.0.0.3, ...; Linux
routes all of 127.0.0.0/8 to lo) to the victim listening on 127.0.0.1, where its
known peer also lives."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import struct

import pytest

from multiraft.transport.frames import FrameType
from multiraft.transport.handshake import HANDSHAKE_VERSION, MAGIC, NONCE_BYTES
from multiraft.transport.transport import Transport
from tests.transport.helpers import FAST, Inbox, make_transport, until

pytestmark = pytest.mark.asyncio

_HELLO = struct.Struct(f">4sBQQ{NONCE_BYTES}s")
_CHALLENGE_BYTES = 4 + 1 + 1 + 8 + NONCE_BYTES + 32


async def _stranger(victim: Transport, source_host: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare TCP connection to the victim from `source_host` that sends nothing."""
    host, port = victim.listen_address
    return await asyncio.open_connection(host, port, local_addr=(source_host, 0))


async def _hung_up_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True if the victim closes the connection within `timeout_s` without answering."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# Goal: with the pending pool (3) and one address's share of it (2) filled by strangers
# that never send a byte, the next stranger connection is closed at once, whichever
# bound it hits, and counted by reason; a known peer (its address is in the victim's
# peer map) that dials only now still authenticates and delivers frames.
async def test_strangers_fill_the_pending_slots_and_a_known_peer_still_connects(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        config = dataclasses.replace(
            FAST,
            handshake_timeout_s=5.0,  # longer than the test: the strangers stay pending
            handshakes_pending_max=3,
            handshakes_pending_per_address_max=2,
        )
        inbox = Inbox()
        victim = make_transport(1, 0, {}, inbox, config=config)
        peer = make_transport(2, 0, {}, Inbox())
        stopper.extend([victim, peer])
        await victim.start()
        await peer.start()
        victim.update_peers({2: peer.listen_address})  # 127.0.0.1 is a known peer's address

        held = [await _stranger(victim, "127.0.0.2"), await _stranger(victim, "127.0.0.2"),
                await _stranger(victim, "127.0.0.3")]
        writers = [writer for _, writer in held]
        try:
            over_address, writer = await _stranger(victim, "127.0.0.2")  # third from .2
            writers.append(writer)
            assert await _hung_up_within(over_address, 1.0), "over the per-address bound"
            over_pool, writer = await _stranger(victim, "127.0.0.4")  # fourth stranger
            writers.append(writer)
            assert await _hung_up_within(over_pool, 1.0), "over the strangers' pool"
            for reader, _ in held:
                assert not await _hung_up_within(reader, 0.05), "admitted strangers wait for the timeout"

            peer.update_peers({1: victim.listen_address})  # the known peer dials now
            peer.send(1, FrameType.RAFT_MESSAGE, 7, b"peer got in")
            await until(lambda: (2, FrameType.RAFT_MESSAGE, 7, b"peer got in") in inbox.frames,
                        what="the known peer's frame")
            stats = victim.stats()
            assert stats.handshakes_pending == 3, "the strangers are still pending"
            assert stats.inbound_refused_by_reason == {"address_pending_full": 1, "pending_full": 1}
        finally:
            await _close_all(writers)
        await until(lambda: victim.stats().handshakes_pending == 0, what="slots released on close")


# Goal: a connection that sends a valid hello, gets its challenge and then stalls is
# closed once handshake_timeout_s has passed (not before), counted as a handshake
# timeout, and its pending slot is free again; the good peer is served throughout.
async def test_a_handshake_left_half_done_is_closed_after_the_deadline(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        config = dataclasses.replace(FAST, handshake_timeout_s=0.5)
        inbox = Inbox()
        victim = make_transport(1, 0, {}, inbox, config=config)
        good = make_transport(2, 0, {}, Inbox())
        stopper.extend([victim, good])
        await victim.start()
        await good.start()
        good.update_peers({1: victim.listen_address})
        await until(lambda: good.peer_connected(1) and victim.stats().handshakes_pending == 0,
                    what="the good peer authenticated")

        loop = asyncio.get_running_loop()
        reader, writer = await _stranger(victim, "127.0.0.2")
        try:
            started = loop.time()
            writer.write(_HELLO.pack(MAGIC, HANDSHAKE_VERSION, 9, 1, secrets.token_bytes(NONCE_BYTES)))
            challenge = await reader.readexactly(_CHALLENGE_BYTES)
            assert challenge.startswith(MAGIC)
            assert victim.stats().handshakes_pending == 1
            # ... and the proof never comes.
            assert await _hung_up_within(reader, 3.0), "closed after the handshake deadline"
            elapsed = loop.time() - started
            assert 0.4 <= elapsed < 2.0, f"closed after {elapsed:.2f} s; the deadline is 0.5 s"
        finally:
            await _close_all([writer])
        stats = victim.stats()
        assert stats.handshake_timeouts == 1
        assert stats.handshakes_refused == 1
        assert stats.handshakes_pending == 0
        good.send(1, FrameType.RAFT_MESSAGE, 5, b"still served")
        await until(lambda: (2, FrameType.RAFT_MESSAGE, 5, b"still served") in inbox.frames)
