"""Fixtures of the transport tests: transports that are always stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from multiraft.transport.transport import Transport
from tests.transport.helpers import Inbox, free_port, make_transport


@pytest_asyncio.fixture
async def stopper() -> AsyncIterator[list[Transport]]:
    """Append a transport to have it stopped (and its tasks awaited) after the test."""
    transports: list[Transport] = []
    yield transports
    async with asyncio.timeout(5):
        for transport in transports:
            await transport.stop()


@pytest_asyncio.fixture
async def cluster(stopper: list[Transport]):  # type: ignore[no-untyped-def]
    """A factory: `await cluster(n)` starts n transports (ids 1..n) on free ports,
    each dialling all the others, and returns [(transport, inbox)]."""

    async def start(count: int) -> list[tuple[Transport, Inbox]]:
        nodes = []
        for node_id in range(1, count + 1):
            inbox = Inbox()
            transport = make_transport(node_id, 0, {}, inbox)
            stopper.append(transport)
            await transport.start()
            nodes.append((transport, inbox))
        addresses = {t.node_id: t.listen_address for t, _ in nodes}
        for transport, _ in nodes:
            transport.update_peers(addresses)
        return nodes

    return start


@pytest.fixture
def unused_port() -> Callable[[], int]:
    """Binds port 0 and returns the port the kernel chose (for restarts on a fixed port)."""
    return free_port
