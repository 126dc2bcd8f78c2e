"""POST /v1/producers: a fresh producer id (epoch 0) for an idempotent producer."""

from __future__ import annotations

from aiohttp import web

from multiraft.http.handlers.common import bounded, node_of


async def allocate_producer(request: web.Request) -> web.Response:
    producer_id, epoch = await bounded(node_of(request).allocate_producer_id(), "producer id allocation")
    return web.json_response({"producer_id": producer_id, "producer_epoch": epoch})
