"""GET /v1/health and GET /v1/cluster: liveness and the cluster as this node sees it."""

from __future__ import annotations

from aiohttp import web

from multiraft.http.handlers.common import node_of
from multiraft.http.view import cluster_view


async def health(request: web.Request) -> web.Response:
    node = node_of(request)
    return web.json_response({"status": "ok", "node_id": node.id, "registered": node.registered.is_set()})


async def cluster(request: web.Request) -> web.Response:
    return web.json_response(cluster_view(node_of(request)))
