"""GET /metrics: Prometheus text from the node's own figures."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from multiraft.http.metrics import render

REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics_registry", CollectorRegistry)


async def metrics(request: web.Request) -> web.Response:
    body = render(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
