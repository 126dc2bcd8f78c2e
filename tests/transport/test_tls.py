"""Mutual TLS on the raft port (multiraft/transport/transport.py with `tls=PeerTls`), with a CA
the test makes itself (tests/tls_pki.py): real sockets on loopback.

Strangers connect from other loopback addresses (127.0.0.2, ...) to victims on
127.0.0.1, as in test_pending_handshakes.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl

import pytest
import uvloop

from multiraft.net.tls import PeerTls
from multiraft.transport.frames import FrameType
from multiraft.transport.transport import Transport
from multiraft.transport.transport_config import TransportConfig
from tests.tls_pki import Pki, make_pki
from tests.transport.helpers import FAST, SECRET, Inbox, until


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, host: str = "127.0.0.1") -> PeerTls:
    return PeerTls.load(pki.ca.cert, pki.nodes[host].cert, pki.nodes[host].key)


def _rogue_tls(pki: Pki) -> PeerTls:
    """A node of another CA: its own CA trusts it, ours does not."""
    return PeerTls.load(pki.rogue_ca.cert, pki.rogue.cert, pki.rogue.key)


def _transport(node_id: int, inbox: Inbox, tls: PeerTls | None, config: TransportConfig = FAST) -> Transport:
    return Transport(node_id, "127.0.0.1", 0, {}, SECRET, inbox, config=config, tls=tls)


async def _hung_up_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _exchange_both_ways(pki: Pki, stopper: list[Transport]) -> tuple[Transport, Transport]:
    one, two = Inbox(), Inbox()
    first, second = _transport(1, one, _tls(pki)), _transport(2, two, _tls(pki))
    stopper.extend([first, second])
    await first.start()
    await second.start()
    first.update_peers({2: second.listen_address})
    second.update_peers({1: first.listen_address})
    for i in range(50):
        assert first.send(2, FrameType.RAFT_MESSAGE, 3, b"to two %d" % i)
        assert second.send(1, FrameType.RAFT_MESSAGE, 4, b"to one %d" % i)
    await until(lambda: len(two.frames) == 50 and len(one.frames) == 50, what="frames both ways")
    assert two.frames == [(1, FrameType.RAFT_MESSAGE, 3, b"to two %d" % i) for i in range(50)], "in order"
    assert one.frames[-1] == (2, FrameType.RAFT_MESSAGE, 4, b"to one 49")
    return first, second


# Goal: two nodes with certificates of the cluster's CA connect both ways (each dials,
# verifying the other's certificate and the host it names; each accepts, requiring a
# client certificate), the secret's handshake runs inside TLS, and frames arrive in order.
@pytest.mark.asyncio
async def test_two_nodes_exchange_frames_over_mutual_tls(pki: Pki, stopper: list[Transport]) -> None:
    async with asyncio.timeout(10):
        first, second = await _exchange_both_ways(pki, stopper)
        for stats in (first.stats(), second.stats()):
            assert (stats.handshakes_refused, stats.tls_handshakes_refused, stats.connect_failures) == (0, 0, 0)
            assert stats.connections_inbound == stats.connections_outbound == 1


# Goal: the same on uvloop, which the node runs on and whose accepted sockets and TLS
# transports differ from asyncio's (connect_accepted_socket answers with its own protocol).
def test_mutual_tls_on_uvloop(pki: Pki) -> None:
    async def scenario() -> None:
        stopper: list[Transport] = []
        try:
            async with asyncio.timeout(10):
                await _exchange_both_ways(pki, stopper)
        finally:
            for transport in stopper:
                await transport.stop()

    uvloop.run(scenario())


# Goal: a node whose certificate another CA signed is refused at the TLS handshake, and
# counted, although it holds the cluster secret; its own links cannot connect either (our
# certificate means nothing to its CA, its certificate nothing to ours); the real peer
# connects and delivers throughout. A node without TLS is refused the same way.
@pytest.mark.asyncio
async def test_a_peer_of_another_ca_is_refused_and_the_real_peer_connects(
        pki: Pki, stopper: list[Transport]) -> None:
    async with asyncio.timeout(15):
        inbox = Inbox()
        victim = _transport(1, inbox, _tls(pki))
        real = _transport(2, Inbox(), _tls(pki))
        rogue = _transport(3, Inbox(), _rogue_tls(pki))
        plain = _transport(4, Inbox(), None)
        stopper.extend([victim, real, rogue, plain])
        for transport in (victim, real, rogue, plain):
            await transport.start()
        victim.update_peers({2: real.listen_address, 3: rogue.listen_address})
        for other in (real, rogue, plain):
            other.update_peers({1: victim.listen_address})
        await until(lambda: victim.stats().tls_handshakes_refused >= 2, what="the rogue's and the plain node's "
                    "connections refused at TLS")
        await until(lambda: victim.peer_connected(2) and real.peer_connected(1), what="the real peer connected")
        real.send(1, FrameType.RAFT_MESSAGE, 9, b"real")
        rogue.send(1, FrameType.RAFT_MESSAGE, 9, b"rogue")
        plain.send(1, FrameType.RAFT_MESSAGE, 9, b"plain")
        await until(lambda: (2, FrameType.RAFT_MESSAGE, 9, b"real") in inbox.frames, what="the real peer's frame")
        await until(lambda: victim.stats().peers[3].connect_failures >= 1, what="our dial to the rogue failed")
        assert {frame[0] for frame in inbox.frames} == {2}, "nothing from the rogue or the plain node"
        assert not victim.peer_connected(3) and not rogue.peer_connected(1) and not plain.peer_connected(1)
        stats = victim.stats()
        assert stats.connections_inbound == 1, "only the real peer authenticated"
        assert stats.handshakes_refused >= stats.tls_handshakes_refused >= 2
        # The rogue and the plain node redial all the time, so one of their handshakes may be
        # in flight right now; once they stop, every refused handshake gives its slot back.
        await rogue.stop()
        await plain.stop()
        await until(lambda: victim.stats().handshakes_pending == 0, what="the refused handshakes' slots back")
        assert victim.peer_connected(2), "the real peer stays connected"


# Goal: strangers that open TCP and never start TLS are bounded before TLS, as before
# any handshake: past the per-address share a connection is refused at once (counted),
# admitted ones are dropped by handshake_timeout_s (counted as timeouts) and their
# slots come back; a peer dialling meanwhile connects.
@pytest.mark.asyncio
async def test_strangers_that_never_speak_tls_are_bounded_and_dropped_by_the_deadline(
        pki: Pki, stopper: list[Transport]) -> None:
    async with asyncio.timeout(15):
        config = dataclasses.replace(FAST, handshake_timeout_s=0.6, handshakes_pending_max=3,
                                     handshakes_pending_per_address_max=2)
        inbox = Inbox()
        victim = _transport(1, inbox, _tls(pki), config)
        peer = _transport(2, Inbox(), _tls(pki))
        stopper.extend([victim, peer])
        await victim.start()
        await peer.start()
        host, port = victim.listen_address
        loop = asyncio.get_running_loop()
        writers: list[asyncio.StreamWriter] = []
        try:
            started = loop.time()
            held = []
            for _ in range(2):
                reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
                held.append(reader)
                writers.append(writer)
            over, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
            writers.append(writer)
            assert await _hung_up_within(over, 0.4), "the third from one address is refused at once"
            await until(lambda: victim.stats().handshakes_pending == 2, what="two strangers pending")
            peer.update_peers({1: victim.listen_address})
            peer.send(1, FrameType.RAFT_MESSAGE, 1, b"peer")
            await until(lambda: (2, FrameType.RAFT_MESSAGE, 1, b"peer") in inbox.frames, what="the peer's frame")
            for reader in held:
                assert await _hung_up_within(reader, 3.0), "dropped by the deadline"
            elapsed = loop.time() - started
            assert 0.5 <= elapsed < 2.5, f"dropped after {elapsed:.2f} s; the deadline is 0.6 s"
        finally:
            for writer in writers:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
        stats = victim.stats()
        assert stats.inbound_refused_by_reason == {"address_pending_full": 1}
        assert stats.handshake_timeouts == 2 and stats.tls_handshakes_refused == 0
        await until(lambda: victim.stats().handshakes_pending == 0, what="slots released")


# Goal: a client that completes TLS without a certificate (any TLS client, say curl) is
# refused: the raft port requires one signed by the cluster's CA.
@pytest.mark.asyncio
async def test_a_tls_client_without_a_certificate_is_refused(pki: Pki, stopper: list[Transport]) -> None:
    async with asyncio.timeout(10):
        victim = _transport(1, Inbox(), _tls(pki))
        stopper.append(victim)
        await victim.start()
        host, port = victim.listen_address
        anonymous = ssl.create_default_context(cafile=str(pki.ca.cert))
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            reader, writer = await asyncio.open_connection(host, port, ssl=anonymous, server_hostname=host)
            try:
                await reader.read(1)  # TLS 1.3: the server's refusal arrives after our side finished
            finally:
                writer.close()
                with contextlib.suppress(ssl.SSLError, ConnectionError):
                    await writer.wait_closed()
        await until(lambda: victim.stats().tls_handshakes_refused == 1, what="the refusal counted")
        assert victim.stats().handshakes_pending == 0


# Goal: stopping a transport while TLS handshakes are pending ends them and the listener
# without leaving a task or a socket behind (unraisable warnings are errors here).
@pytest.mark.asyncio
async def test_stop_with_tls_handshakes_pending(pki: Pki) -> None:
    async with asyncio.timeout(10):
        victim = _transport(1, Inbox(), _tls(pki), dataclasses.replace(FAST, handshake_timeout_s=5.0))
        await victim.start()
        host, port = victim.listen_address
        reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.3", 0))
        try:
            await until(lambda: victim.stats().handshakes_pending == 1, what="one pending")
            await victim.stop()
            assert await _hung_up_within(reader, 2.0), "closed by the stop"
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
