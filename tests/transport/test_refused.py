"""Goal: the transport tells the node when a peer's raft port refuses connections (its
process is gone: a kill -9 closes its listener with its sockets), so the groups it led
can fail over at once; a peer that is alive, even one that drops our connections,
never causes that report."""

from __future__ import annotations

import asyncio

import pytest

from tests.transport.helpers import free_port, until

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
