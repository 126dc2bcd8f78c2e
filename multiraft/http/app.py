"""The aiohttp application of a node: routes, the error middleware, body bounds.

`ROUTES` is the one list of what is served; the OpenAPI document is checked
against it by a test. Handlers live one module per resource under `handlers/`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from multiraft.http.access import access_middleware
from multiraft.http.browsers import BrowserPolicy, browser_middleware
from multiraft.http.errors import NODE_KEY, error_middleware
from multiraft.http.handlers import (
    admin,
    cluster,
    confluent_consumers,
    confluent_topics,
    consume,
    debug,
    docs,
    features,
    groups,
    live_ops,
    members,
    metrics,
    mirrors,
    nodes,
    produce,
    producers,
    tokens,
    topics,
    ui,
)
from multiraft.http.limits import REQUEST_BYTES_MAX
from multiraft.http.metrics import node_registry

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/v1/health", cluster.health),
    ("GET", "/v1/cluster", cluster.cluster),
    ("POST", "/v1/topics", topics.create_topic),
    ("GET", "/v1/topics", topics.list_topics),
    ("GET", "/v1/topics/{topic}", topics.describe_topic),
    ("PATCH", "/v1/topics/{topic}", topics.alter_topic),
    ("DELETE", "/v1/topics/{topic}", topics.delete_topic),
    ("POST", "/v1/topics/{topic}/partitions", live_ops.create_partitions),
    ("POST", "/v1/topics/{topic}/records", produce.produce_topic),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/records", produce.produce_partition),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records", consume.consume),
    ("POST", "/v1/producers", producers.allocate_producer),
    ("POST", "/v1/groups/{group}/offsets", groups.commit_offsets),
    ("GET", "/v1/groups/{group}/offsets", groups.fetch_offsets),
    ("POST", "/v1/groups/{group}/offsets/reset", groups.reset_offsets),
    ("DELETE", "/v1/groups/{group}", groups.delete_group),
    ("GET", "/v1/groups", members.list_groups),
    ("GET", "/v1/groups/{group}", members.describe),
    ("POST", "/v1/groups/{group}/members", members.join),
    ("POST", "/v1/groups/{group}/members/{member}/heartbeat", members.heartbeat),
    ("POST", "/v1/groups/{group}/members/{member}/records", members.fetch),
    ("DELETE", "/v1/groups/{group}/members/{member}", members.leave),
    ("POST", "/v1/admin/leadership/balance", admin.balance_leadership),
    ("POST", "/v1/admin/verify", admin.verify),
    ("GET", "/v1/admin/scrub", admin.scrub_status),
    ("POST", "/v1/admin/nodes", nodes.add_node),
    ("POST", "/v1/admin/nodes/{node}/drain", live_ops.drain),
    ("DELETE", "/v1/admin/nodes/{node}/drain", live_ops.undrain),
    ("GET", "/v1/admin/nodes/{node}/decommission", live_ops.decommission_state),
    ("GET", "/v1/admin/features", features.show),
    ("POST", "/v1/admin/features", features.finalize),
    ("GET", "/v1/admin/config", live_ops.get_config),
    ("POST", "/v1/admin/nodes/{node}/promote", live_ops.promote),
    ("PATCH", "/v1/admin/config", live_ops.patch_config),
    ("POST", "/v1/admin/nodes/{node}/decommission", live_ops.decommission),
    ("DELETE", "/v1/admin/nodes/{node}/decommission", live_ops.recommission),
    ("POST", "/v1/admin/tokens", tokens.create_token),
    ("GET", "/v1/admin/tokens", tokens.list_tokens),
    ("POST", "/v1/admin/mirrors", mirrors.create),
    ("GET", "/v1/admin/mirrors", mirrors.list_links),
    ("GET", "/v1/admin/mirrors/{name}", mirrors.status),
    ("PATCH", "/v1/admin/mirrors/{name}", mirrors.alter),
    ("DELETE", "/v1/admin/mirrors/{name}", mirrors.delete),
    ("POST", "/v1/admin/mirrors/{name}/pause", mirrors.pause),
    ("POST", "/v1/admin/mirrors/{name}/resume", mirrors.resume),
    ("POST", "/v1/admin/mirrors/{name}/promote", mirrors.promote),
    ("POST", "/v1/admin/mirrors/{name}/verify", mirrors.verify),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/log", mirrors.read_log),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/tree", mirrors.tree),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/tree/nodes", mirrors.tree_nodes),
    ("DELETE", "/v1/admin/tokens/{name}", tokens.delete_token),
    ("GET", "/v1/openapi.json", docs.openapi),
    ("GET", "/metrics", metrics.metrics),
    ("GET", "/ui", ui.page),
    # The Confluent REST v2 dialect (docs/http.md): Confluent's paths, media types and error codes.
    ("GET", "/topics", confluent_topics.list_topics),
    ("GET", "/topics/{topic}", confluent_topics.describe_topic),
    ("POST", "/topics/{topic}", confluent_topics.produce),
    ("GET", "/topics/{topic}/partitions", confluent_topics.list_partitions),
    ("GET", "/topics/{topic}/partitions/{partition}", confluent_topics.describe_partition),
    ("POST", "/topics/{topic}/partitions/{partition}", confluent_topics.produce),
    ("GET", "/topics/{topic}/partitions/{partition}/offsets", confluent_topics.partition_offsets),
    ("GET", "/brokers", confluent_topics.brokers),
    ("POST", "/consumers/{group}", confluent_consumers.create),
    ("DELETE", "/consumers/{group}/instances/{instance}", confluent_consumers.delete),
    ("POST", "/consumers/{group}/instances/{instance}/subscription", confluent_consumers.subscribe),
    ("GET", "/consumers/{group}/instances/{instance}/subscription", confluent_consumers.subscription),
    ("DELETE", "/consumers/{group}/instances/{instance}/subscription", confluent_consumers.unsubscribe),
    ("POST", "/consumers/{group}/instances/{instance}/assignments", confluent_consumers.assign),
    ("GET", "/consumers/{group}/instances/{instance}/assignments", confluent_consumers.assignments),
    ("POST", "/consumers/{group}/instances/{instance}/positions", confluent_consumers.seek),
    ("POST", "/consumers/{group}/instances/{instance}/positions/beginning", confluent_consumers.seek_edge),
    ("POST", "/consumers/{group}/instances/{instance}/positions/end", confluent_consumers.seek_edge),
    ("GET", "/consumers/{group}/instances/{instance}/records", confluent_consumers.records),
    ("POST", "/consumers/{group}/instances/{instance}/offsets", confluent_consumers.commit),
    ("GET", "/consumers/{group}/instances/{instance}/offsets", confluent_consumers.committed),
)

# Served only when the node started with RAFTLOG_CHAOS_DEBUG=1 (multiraft/node/unsafe.py), else
# 404 NOT_FOUND like any unknown path. Runner-only, so kept out of ROUTES and the OpenAPI
# document (and so out of the schemathesis fuzz pass, which would hash whole logs).
DEBUG_ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/v1/debug/groups", debug.groups),
    ("GET", "/v1/debug/groups/{group_id}/digest", debug.digest),
)


def create_app(node: NodeApi) -> web.Application:
    """The HTTP API of `node`. Bodies beyond REQUEST_BYTES_MAX get 413 before parsing."""
    browsers = browser_middleware(BrowserPolicy.of(node.config))
    app = web.Application(middlewares=[error_middleware, browsers, access_middleware],
                          client_max_size=REQUEST_BYTES_MAX)
    app[NODE_KEY] = node
    app[produce.ROUND_ROBIN_KEY] = {}
    app[metrics.REGISTRY_KEY] = node_registry(node)
    for method, path, handler in ROUTES + (DEBUG_ROUTES if node.hooks.debug_endpoints else ()):
        app.router.add_route(method, path, handler)
    return app
