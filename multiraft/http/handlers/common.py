"""What every handler shares: the node of the app, a bounded wait on the cluster, and
how fresh a catalog read must be."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web

from multiraft.errors import Timeout
from multiraft.http.errors import NODE_KEY
from multiraft.http.limits import REQUEST_TIMEOUT_S
from multiraft.http.params import query_str

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi

T = TypeVar("T")


def node_of(request: web.Request) -> NodeApi:
    return request.app[NODE_KEY]


async def bounded(work: Awaitable[T], what: str, timeout_s: float = REQUEST_TIMEOUT_S) -> T:
    """Await cluster work with a deadline: past it the client gets 504 TIMEOUT."""
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise Timeout(f"{what} did not complete within {timeout_s:.0f} s (outcome unknown)") from None


async def catalog_read(request: web.Request) -> None:
    """`?consistency=local` (default): this node's catalog as it is; `linearizable`:
    first catch up with every metadata change completed before the request."""
    if query_str(request, "consistency", "local", ("local", "linearizable")) == "linearizable":
        await bounded(node_of(request).sync_catalog(), "a linearizable catalog read")
