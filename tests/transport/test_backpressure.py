"""A peer that stops reading, and a peer that restarts: the sender sheds, stays fast,
stays bounded, and reconnects."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from multiraft.transport.frames import FrameType
from multiraft.transport.handshake import accept_handshake
from tests.transport.helpers import FAST, SECRET, Inbox, RawPeer, make_transport, until

MIB = 1024 * 1024
SMALL_QUEUE = dataclasses.replace(
    FAST, send_queue_frames_max=64, send_queue_bytes_max=2 * MIB, frame_bytes_max=1 * MIB
)


async def _handshake_then_stop_reading(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Node 2 as a stuck process: authenticates, then never reads another byte."""
    await accept_handshake(reader, writer, secret=SECRET, node_id=2)
    await asyncio.Event().wait()


# Goal: against a peer that accepted but stopped reading, send() never blocks, the
# queue stays within its frame and byte bounds by shedding (heartbeats first), the
# drops are counted, and another peer is still served meanwhile.
@pytest.mark.asyncio
async def test_stuck_peer_sheds_and_send_stays_fast(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(15):
        stuck = RawPeer(_handshake_then_stop_reading)
        stuck_port = await stuck.start()
        try:
            good_inbox = Inbox()
            good = make_transport(3, 0, {}, good_inbox)
            stopper.append(good)
            await good.start()
            peers = {2: ("127.0.0.1", stuck_port), 3: good.listen_address}
            sender = make_transport(1, 0, peers, Inbox(), config=SMALL_QUEUE)
            stopper.append(sender)
            await sender.start()
            await until(lambda: sender.peer_connected(2), what="connected to the stuck peer")

            body = bytes(64 * 1024)
            slowest_send_s = 0.0
            offered_bytes = 0
            while sender.stats().peers[2].frames_shed == 0:
                assert offered_bytes < 512 * MIB, "the queue never shed"
                for group_id in range(32):
                    started = time.perf_counter()
                    assert sender.send(2, FrameType.RAFT_MESSAGE, group_id, body)
                    assert sender.send(2, FrameType.HEARTBEATS, 0, b"beat")
                    slowest_send_s = max(slowest_send_s, time.perf_counter() - started)
                    offered_bytes += len(body)
                    peer = sender.stats().peers[2]
                    assert peer.queued_frames <= SMALL_QUEUE.send_queue_frames_max
                    assert peer.queued_bytes <= SMALL_QUEUE.send_queue_bytes_max
                await asyncio.sleep(0)  # let the writer push what the socket takes

            stats = sender.stats()
            assert stats.peers[2].heartbeats_shed > 0, "heartbeats go first"
            assert stats.heartbeats_shed == stats.peers[2].heartbeats_shed
            assert stats.frames_shed == stats.peers[2].frames_shed > 0
            # Generous: a send is a deque append; anything near this means it blocked.
            assert slowest_send_s < 0.1
            assert sender.send(3, FrameType.RAFT_MESSAGE, 1, b"meanwhile")
            await until(lambda: (1, FrameType.RAFT_MESSAGE, 1, b"meanwhile") in good_inbox.frames)
        finally:
            await stuck.close()


# Goal: a write that cannot drain within write_stall_timeout_s drops the connection and
# redials (a dead path is replaced instead of waited out).
@pytest.mark.asyncio
async def test_stalled_connection_is_replaced(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        stuck = RawPeer(_handshake_then_stop_reading)
        stuck_port = await stuck.start()
        try:
            config = dataclasses.replace(SMALL_QUEUE, write_stall_timeout_s=0.2)
            sender = make_transport(1, 0, {2: ("127.0.0.1", stuck_port)}, Inbox(), config=config)
            stopper.append(sender)
            await sender.start()
            body = bytes(256 * 1024)

            def redialled() -> bool:
                sender.send(2, FrameType.RAFT_MESSAGE, 1, body)
                return sender.stats().peers[2].connects >= 2

            await until(redialled, what="a second connection after the stall")
        finally:
            await stuck.close()


# Goal: when the peer restarts on the same address, the sender notices the closed
# connection, backs off, redials, and delivers what was queued while it was down.
@pytest.mark.asyncio
async def test_reconnect_after_peer_restart(stopper, unused_port) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        port = unused_port()
        first_inbox = Inbox()
        first = make_transport(2, port, {}, first_inbox)
        await first.start()
        sender = make_transport(1, 0, {2: ("127.0.0.1", port)}, Inbox())
        stopper.append(sender)
        await sender.start()
        sender.send(2, FrameType.RAFT_MESSAGE, 1, b"before")
        await until(lambda: len(first_inbox.frames) == 1)

        await first.stop()
        await until(lambda: not sender.peer_connected(2), what="disconnect noticed")
        assert sender.send(2, FrameType.RAFT_MESSAGE, 1, b"while down")

        second_inbox = Inbox()
        second = make_transport(2, port, {}, second_inbox)
        stopper.append(second)
        await second.start()
        await until(lambda: (1, FrameType.RAFT_MESSAGE, 1, b"while down") in second_inbox.frames)
        assert sender.stats().connects == 2
