"""GET /v1/health and GET /v1/cluster: liveness and the cluster as this node sees it
(`?consistency=linearizable`: after catching up with the metadata leader).

`GET /v1/health` answers 200 as soon as the node serves HTTP (liveness). With
`?ready=cluster` it answers 200 only once this node sees a metadata leader, has
registered, and every known node (the initial cluster's and every registered
one) is registered and alive in the catalog: what scripts and `raftlog cluster
wait` wait on before creating a topic whose replication factor needs them all.
Otherwise 503 `CLUSTER_NOT_READY`, the message naming what is missing
(Kubernetes' readiness against liveness; etcd's `/health` and `/readyz`).
Both show `feature_level`: the level this node supports, the one the cluster is
finalized at, and whether this node supports less (multiraft/node/features.py): then it
is live but not ready (it needs an upgrade).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from multiraft.errors import ClusterNotReady, InvalidRequest
from multiraft.http.handlers.common import catalog_read, node_of
from multiraft.http.view import cluster_view

READY_CHOICES = ("cluster",)


async def health(request: web.Request) -> web.Response:
    node = node_of(request)
    ready = request.query.get("ready")
    if ready is not None and ready not in READY_CHOICES:
        raise InvalidRequest(f"query parameter ready must be one of {', '.join(READY_CHOICES)}")
    features = node.features.health()
    answer: dict[str, Any] = {"status": "ok", "node_id": node.id, "registered": node.registered,
                              "feature_level": features}
    if ready is not None:
        readiness = node.readiness()
        if not readiness.ready:
            raise ClusterNotReady(f"cluster not ready: {readiness.missing()}")
        if features["unsupported"]:
            raise ClusterNotReady(f"this node supports feature level {features['supported']}, below the level "
                                  f"{features['finalized']} the cluster is finalized at: upgrade it")
        answer |= {"ready": ready, "metadata_leader": readiness.metadata_leader, "nodes": list(readiness.nodes)}
    # Chaos hooks (multiraft/node/unsafe.py) are named here, so no run can pass for a safe one.
    if node.hooks.unsafe:
        answer["unsafe"] = list(node.hooks.unsafe)
    if node.hooks.write_behind_files:
        answer["chaos_files"] = "write-behind"
    if node.hooks.feature_level is not None:  # a test's node "of an older build" (unsafe.py)
        answer["chaos_feature_level"] = node.hooks.feature_level
    return web.json_response(answer)


async def cluster(request: web.Request) -> web.Response:
    await catalog_read(request)
    return web.json_response(cluster_view(node_of(request)))
