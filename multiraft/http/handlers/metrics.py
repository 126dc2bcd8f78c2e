"""GET /metrics: Prometheus text from the node's own figures, then its consumer groups'."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from multiraft.errors import Timeout
from multiraft.http.group_metrics import groups_registry
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.metrics import render
from multiraft.node.api import GroupMetrics

REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics_registry", CollectorRegistry)
# The group figures read records (lag in seconds); a scrape waits for them at most this long.
GROUP_METRICS_TIMEOUT_S = 5.0


async def metrics(request: web.Request) -> web.Response:
    try:
        figures = await bounded(node_of(request).group_metrics(), "consumer group metrics", GROUP_METRICS_TIMEOUT_S)
    except Timeout:  # the node's own figures still go out; the group series say they are missing
        figures = GroupMetrics([], [], truncated=True)
    body = render(request.app[REGISTRY_KEY]) + render(groups_registry(figures))
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
