"""Goal: the transport tells the node when a peer's raft port refuses connections (its
process is gone: a kill -9 closes its listener with its sockets), so the groups it led
can fail over at once; a peer that is alive, even one that drops our connections,
never causes that report."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from tests.transport.helpers import FAST, Inbox, free_port, make_transport, until

pytestmark = pytest.mark.asyncio


async def test_a_peer_whose_port_refuses_is_reported_and_a_live_one_is_not(cluster) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        (a, _), (b, _), (c, _) = await cluster(3)
        refused: list[int] = []
        a.on_peer_refused = refused.append
        await until(lambda: a.peer_connected(2) and a.peer_connected(3), what="connected")
        # A peer that refuses before it ever answered may only be starting later: no news.
        a.update_peers({2: b.listen_address, 3: c.listen_address, 4: ("127.0.0.1", free_port())})
        await until(lambda: a.stats().connect_failures >= 3, what="a few refused dials of node 4")

        for connection in list(c._inbound.values()):  # c alive, but drops a's connection
            connection.abort()
        await until(lambda: a.stats().connects >= 3, what="a redialled c")
        await asyncio.sleep(0.2)
        assert refused == [], "a live peer that dropped the connection is not reported"

        await b.stop()  # b's process is gone: its listener and sockets are closed
        await until(lambda: 2 in refused, what="b reported")
        assert set(refused) == {2}


# Goal: the refusal that fails a dead peer's groups over comes at once, not one backoff
# step later, even when the connection to it lived only briefly after many failed dials
# (a peer restarted a moment ago, then killed): the failover tail of 600-950 ms
# was that step (bench/failover.py --after-home 0.2). A peer that keeps dropping the
# connection it just accepted still gets backed off (the link never spins).
async def test_a_briefly_connected_peer_that_dies_is_reported_without_a_backoff_step(
        stopper, unused_port) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(20):
        slow = dataclasses.replace(FAST, reconnect_backoff_initial_s=0.4, reconnect_backoff_max_s=4.0)
        port = unused_port()
        a = make_transport(1, 0, {}, Inbox(), config=slow)
        stopper.append(a)
        await a.start()
        refused: list[int] = []
        a.on_peer_refused = refused.append
        a.update_peers({2: ("127.0.0.1", port)})
        await until(lambda: a.stats().connect_failures >= 3, what="a few refused dials while b is down",
                    timeout_s=10)
        b = make_transport(2, port, {1: a.listen_address}, Inbox(), config=slow)
        stopper.append(b)
        await b.start()
        await until(lambda: a.peer_connected(2), what="a connected to b", timeout_s=10)
        await asyncio.sleep(0.3)  # connected well under reconnect_backoff_max_s
        stopped = time.monotonic()
        await b.stop()
        await until(lambda: 2 in refused, what="b reported", timeout_s=5)
        assert time.monotonic() - stopped < 0.2, "reported at once, not after a backoff step (0.2 s or more)"


async def test_a_peer_that_drops_every_connection_is_backed_off(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        accepted: list[float] = []

        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(time.monotonic())
            writer.close()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        try:
            a = make_transport(1, 0, {}, Inbox())
            stopper.append(a)
            await a.start()
            a.update_peers({2: server.sockets[0].getsockname()[:2]})
            await asyncio.sleep(1.0)
        finally:
            server.close()
        # FAST backs off 10-100 ms a dial: a spinning link would make thousands of dials.
        assert 3 <= len(accepted) <= 60, len(accepted)
