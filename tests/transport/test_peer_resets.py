"""Goal: a peer that resets the connection while our link is busy writing costs one
reconnect, on either event loop. On uvloop a write to a transport that a reset has
just closed raises RuntimeError (asyncio's own loop drops it with a warning); that
once ended the link's task for good, so the node never dialled that peer again (found
by `python -m chaos run --faults corrupt --seed 49`: a restarted node heard from no
leader for 90 s)."""

from __future__ import annotations

import asyncio
import random

import pytest
import structlog
import uvloop

from multiraft.transport.handshake import accept_handshake
from multiraft.transport.peer_link import PeerLink
from multiraft.transport.transport_config import TransportCounters
from tests.transport.helpers import FAST, SECRET

RESETS = 40
RUN_TIMEOUT_S = 60.0


async def resets_survived() -> tuple[int, bool]:
    """A peer that accepts, completes the handshake, then resets at once or after up to
    5 ms, while the link has frames to write all the time. Returns (resets, task alive)."""
    rng = random.Random(7)
    resets = 0

    async def reset_soon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal resets
        try:
            await accept_handshake(reader, writer, secret=SECRET, node_id=2)
            await asyncio.sleep(rng.uniform(0, 0.005))
        finally:
            writer.transport.abort()  # unread frames in our buffer: the kernel sends a reset
        resets += 1

    server = await asyncio.start_server(reset_soon, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = PeerLink(node_id=1, peer_id=2, address=("127.0.0.1", port), source_host=None, secret=SECRET,
                    config=FAST, counters=TransportCounters(), logger=structlog.get_logger(),
                    rng=random.Random(1))
    link.start()
    task = link._task
    assert task is not None

    async def keep_busy() -> None:
        while True:
            for _ in range(5):
                link.enqueue(1, 0, b"z" * 200)
            await asyncio.sleep(0)

    busy = asyncio.create_task(keep_busy())
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            while resets < RESETS and not task.done():
                await asyncio.sleep(0.005)
        return resets, not task.done()
    finally:
        busy.cancel()
        link_task = link.cancel()
        if link_task is not None:
            async with asyncio.timeout(10):  # a link that survives its stop fails here, never hangs
                await asyncio.gather(link_task, busy, return_exceptions=True)
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_link_survives_peers_that_reset_while_it_writes(loop: str) -> None:
    with structlog.testing.capture_logs() as logs:
        resets, alive = uvloop.run(resets_survived()) if loop == "uvloop" else asyncio.run(resets_survived())
    assert alive, f"the link's task ended after {resets} resets"
    assert resets >= RESETS
    assert not [entry for entry in logs if entry["event"] == "peer_link_unexpected_error"], \
        "a reset is an ordinary disconnect, not an unexpected error"
