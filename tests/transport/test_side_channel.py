"""Side connections (multiraft/transport/side_channel.py): a socket of its own between two
nodes, authenticated by the cluster secret, for far-horizon catch-up's files.

Goal: the listener accepts only the node it expects, proven by the secret, and only once;
a stranger that connects first (no secret, another node's id, a wrong secret) is dropped
and the expected peer still gets in; nobody dialling ends in TimeoutError at the deadline;
the dialler reaches only the node it named. With TLS between peers there is no side
channel at all (its callers keep to frames, which TLS protects).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from multiraft.net.tls import PeerTls
from multiraft.transport.frames import TransportError
from multiraft.transport.handshake import connect_handshake
from multiraft.transport.side_channel import HANDSHAKES_MAX, SideChannel, numeric
from multiraft.transport.transport import Transport
from tests.tls_pki import make_pki
from tests.transport.helpers import FAST, SECRET, WRONG_SECRET, Inbox

HOST = "127.0.0.1"


def _side(node_id: int, secret: bytes = SECRET) -> SideChannel:
    return SideChannel(node_id, secret, HOST, lambda peer: (HOST, 1), handshake_s=1.0, connect_s=1.0)


async def _exchange(receiving: socket.socket, sending: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sending, b"segment bytes")
    return await loop.sock_recv(receiving, 100)


@pytest.mark.asyncio
async def test_the_named_peer_connects_and_bytes_flow() -> None:
    async with asyncio.timeout(10):
        listener = _side(2).listen(peer=1)
        accepting = asyncio.ensure_future(listener.accept(5.0))
        dialled = await _side(1).dial(2, listener.port)
        accepted = await accepting
        try:
            assert await _exchange(accepted, dialled) == b"segment bytes"
            assert listener._sock.fileno() == -1, "one-shot: the listener closed"
        finally:
            dialled.close()
            accepted.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("stranger", ["silent", "wrong secret", "another node"])
async def test_a_stranger_first_is_dropped_and_the_peer_still_gets_in(stranger: str) -> None:
    async with asyncio.timeout(10):
        listener = _side(2).listen(peer=1)
        accepting = asyncio.ensure_future(listener.accept(5.0))
        loop = asyncio.get_running_loop()
        if stranger == "silent":  # connects and says nothing: the handshake's deadline drops it
            rogue = socket.create_connection((HOST, listener.port))
        elif stranger == "wrong secret":
            with pytest.raises((TransportError, OSError)):
                await _side(1, WRONG_SECRET).dial(2, listener.port)
            rogue = None
        else:  # node 3 holds the secret, but the listener waits for node 1
            rogue = await _side(3).dial(2, listener.port)
            assert await loop.sock_recv(rogue, 1) == b"", "dropped"
        dialled = await _side(1).dial(2, listener.port)
        accepted = await accepting
        try:
            assert await _exchange(accepted, dialled) == b"segment bytes"
        finally:
            for sock in (dialled, accepted, rogue):
                if sock is not None:
                    sock.close()


@pytest.mark.asyncio
async def test_strangers_filling_every_handshake_do_not_keep_the_peer_out() -> None:
    # Review L3: HANDSHAKES_MAX silent connections took every handshake slot and the
    # peer's connection was dropped. From the peer's host, it takes the oldest's place.
    async with asyncio.timeout(10):
        listening = SideChannel(2, SECRET, HOST, lambda peer: (HOST, 1), handshake_s=5.0, connect_s=1.0)
        listener = listening.listen(peer=1)
        accepting = asyncio.ensure_future(listener.accept(5.0))
        rogues = [socket.create_connection((HOST, listener.port)) for _ in range(HANDSHAKES_MAX)]
        await asyncio.sleep(0.2)  # each accepted, each handshake waiting (5 s)
        try:
            dialled = await _side(1).dial(2, listener.port)
            accepted = await accepting
            assert await _exchange(accepted, dialled) == b"segment bytes"
            dialled.close()
            accepted.close()
        finally:
            for rogue in rogues:
                rogue.close()


def test_a_numeric_host_is_parsed_not_looked_up() -> None:
    # Review M2: the dialler resolves a peer's host once; a numeric one is parsed.
    assert numeric("127.0.0.1") == (socket.AF_INET, "127.0.0.1")
    assert numeric("::1") == (socket.AF_INET6, "::1")
    assert numeric("localhost") is None


@pytest.mark.asyncio
async def test_nobody_dialling_ends_at_the_deadline() -> None:
    listener = _side(2).listen(peer=1)
    try:
        with pytest.raises(TimeoutError):
            await listener.accept(0.2)
    finally:
        listener.close()


@pytest.mark.asyncio
async def test_the_dialler_reaches_only_the_node_it_named() -> None:
    async with asyncio.timeout(10):
        listener = _side(3).listen(peer=1)  # node 3 listens; node 1 believes it dials node 2
        accepting = asyncio.ensure_future(listener.accept(2.0))
        with pytest.raises((TransportError, OSError)):
            await _side(1).dial(2, listener.port)
        accepting.cancel()
        listener.close()


@pytest.mark.asyncio
async def test_a_plain_handshake_needs_the_secret_to_be_answered() -> None:
    # The listener speaks the transport's own handshake: a client of it with the secret
    # and the right ids is accepted (what dial does, spelled out).
    async with asyncio.timeout(10):
        listener = _side(2).listen(peer=1)
        accepting = asyncio.ensure_future(listener.accept(5.0))
        reader, writer = await asyncio.open_connection(HOST, listener.port)
        await connect_handshake(reader, writer, secret=SECRET, node_id=1, peer_id=2)
        accepted = await accepting
        accepted.close()
        writer.close()


def test_no_side_channel_with_tls_between_peers(tmp_path) -> None:
    pki = make_pki(tmp_path)
    tls = PeerTls.load(pki.ca.cert, pki.nodes[HOST].cert, pki.nodes[HOST].key)
    assert Transport(1, HOST, 0, {}, SECRET, Inbox(), config=FAST, tls=tls).side_channel() is None
    assert Transport(1, HOST, 0, {}, SECRET, Inbox(), config=FAST).side_channel() is not None
