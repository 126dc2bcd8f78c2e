"""GET /v1/health and GET /v1/cluster: liveness and the cluster as this node sees it
(`?consistency=linearizable`: after catching up with the metadata leader)."""

from __future__ import annotations

from aiohttp import web

from multiraft.http.handlers.common import catalog_read, node_of
from multiraft.http.view import cluster_view


async def health(request: web.Request) -> web.Response:
    node = node_of(request)
    answer = {"status": "ok", "node_id": node.id, "registered": node.registered}
    # Chaos hooks (multiraft/node/unsafe.py) are named here, so no run can pass for a safe one.
    if node.hooks.unsafe:
        answer["unsafe"] = list(node.hooks.unsafe)
    if node.hooks.write_behind_files:
        answer["chaos_files"] = "write-behind"
    return web.json_response(answer)


async def cluster(request: web.Request) -> web.Response:
    await catalog_read(request)
    return web.json_response(cluster_view(node_of(request)))
