"""Transports exchange frames for many groups, each pair over one connection per direction."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.transport.frames import FrameTooLarge, FrameType
from tests.transport.helpers import FAST, Inbox, make_transport, until

GROUPS = 200


# Goal: two nodes trade frames for hundreds of groups; all arrive, in order, over one
# outbound connection each, with every field (type, group id, body) intact.
@pytest.mark.asyncio
async def test_two_transports_exchange_many_groups(cluster) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        (a, inbox_a), (b, inbox_b) = await cluster(2)
        sent_to_b = [(1, FrameType.RAFT_MESSAGE, g, b"a->b %d" % g) for g in range(GROUPS)]
        sent_to_a = [(2, FrameType.HEARTBEATS, g, bytes([g % 256]) * g) for g in range(GROUPS)]
        for _, frame_type, group_id, body in sent_to_b:
            assert a.send(2, frame_type, group_id, body)
        for _, frame_type, group_id, body in sent_to_a:
            assert b.send(1, frame_type, group_id, body)
        await until(lambda: len(inbox_b.frames) == GROUPS and len(inbox_a.frames) == GROUPS)
        assert inbox_b.frames == sent_to_b
        assert inbox_a.frames == sent_to_a
        for transport in (a, b):
            stats = transport.stats()
            assert stats.connects == 1, "one outbound connection carries every group"
            assert stats.connections_outbound == 1 and stats.connections_inbound == 1
            assert stats.frames_out == GROUPS and stats.frames_in == GROUPS
            assert stats.heartbeats_shed == stats.frames_shed == 0
            assert stats.protocol_errors == stats.handshakes_refused == 0


# Goal: in a three-node mesh every node reaches both others, each pair over single
# connections, and frames from different sources are told apart.
@pytest.mark.asyncio
async def test_three_transports_full_mesh(cluster) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        nodes = await cluster(3)
        for transport, _ in nodes:
            for peer, _ in nodes:
                if peer is transport:
                    continue
                for group_id in range(GROUPS):
                    body = b"%d->%d:%d" % (transport.node_id, peer.node_id, group_id)
                    assert transport.send(peer.node_id, FrameType.RAFT_MESSAGE, group_id, body)
        await until(lambda: all(len(inbox.frames) == 2 * GROUPS for _, inbox in nodes))
        for transport, inbox in nodes:
            for source, _ in nodes:
                if source is transport:
                    continue
                bodies = [frame[3] for frame in inbox.from_source(source.node_id)]
                assert bodies == [
                    b"%d->%d:%d" % (source.node_id, transport.node_id, g) for g in range(GROUPS)
                ]
            stats = transport.stats()
            assert stats.connects == 2
            assert stats.connections_outbound == 2 and stats.connections_inbound == 2


# Goal: a large frame (1 MiB) crosses intact; one above frame_bytes_max is refused at send.
@pytest.mark.asyncio
async def test_large_frames_and_the_size_limit(cluster) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        (a, _), (_, inbox_b) = await cluster(2)
        big = bytes(range(256)) * 4096
        assert a.send(2, FrameType.RAFT_MESSAGE, 9, big)
        await until(lambda: len(inbox_b.frames) == 1)
        assert inbox_b.frames[0] == (1, FrameType.RAFT_MESSAGE, 9, big)
        with pytest.raises(FrameTooLarge):
            a.send(2, FrameType.RAFT_MESSAGE, 9, bytes(FAST.frame_bytes_max))


# Goal: sending to an unknown peer, or before start / after stop, is refused and counted.
@pytest.mark.asyncio
async def test_send_refused_for_unknown_peer_and_stopped_transport(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        transport = make_transport(1, 0, {2: ("127.0.0.1", 1)}, Inbox())
        stopper.append(transport)
        assert not transport.send(2, FrameType.RAFT_MESSAGE, 1, b"x"), "not started yet"
        await transport.start()
        assert not transport.send(7, FrameType.RAFT_MESSAGE, 1, b"x")
        await transport.stop()
        assert not transport.send(2, FrameType.RAFT_MESSAGE, 1, b"x")
        assert transport.stats().sends_refused == 3


# Goal: update_peers adds a peer at run time, and removing it stops dialling it.
@pytest.mark.asyncio
async def test_update_peers_adds_and_removes(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        inbox_a, inbox_b = Inbox(), Inbox()
        a = make_transport(1, 0, {}, inbox_a)
        b = make_transport(2, 0, {}, inbox_b)
        stopper.extend([a, b])
        await a.start()
        await b.start()
        assert not a.send(2, FrameType.RAFT_MESSAGE, 1, b"early")
        a.update_peers({1: a.listen_address, 2: b.listen_address})  # own id is ignored
        assert a.send(2, FrameType.RAFT_MESSAGE, 1, b"late")
        await until(lambda: len(inbox_b.frames) == 1)
        assert inbox_b.frames == [(1, FrameType.RAFT_MESSAGE, 1, b"late")]
        a.update_peers({})
        assert not a.send(2, FrameType.RAFT_MESSAGE, 1, b"gone")
        assert a.stats().peers == {}
        await until(lambda: b.stats().connections_inbound == 0, what="old connection closed")


# Goal: an on_frame callback that raises is logged and counted; the connection survives.
@pytest.mark.asyncio
async def test_failing_callback_does_not_drop_the_connection(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        received: list[bytes] = []

        def on_frame(source: int, frame_type: int, group_id: int, body: bytes) -> None:
            if body == b"boom":
                raise RuntimeError("runtime bug")
            received.append(body)

        a = make_transport(1, 0, {}, Inbox())
        b = make_transport(2, 0, {}, on_frame)  # type: ignore[arg-type]
        stopper.extend([a, b])
        await a.start()
        await b.start()
        a.update_peers({2: b.listen_address})
        for body in (b"one", b"boom", b"two"):
            a.send(2, FrameType.RAFT_MESSAGE, 1, body)
        await until(lambda: received == [b"one", b"two"])
        assert b.stats().on_frame_errors == 1
        assert a.stats().connects == 1
