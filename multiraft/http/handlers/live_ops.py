"""Operations on a live cluster (issue 25): more partitions for a topic, drain and undrain.

`POST /v1/topics/{topic}/partitions` `{"count": N}` grows a topic to N partitions,
as Kafka's CreatePartitions: N is the new total, and only an increase is taken (a
count at or below the current one is 400 INVALID_PARTITIONS). The answer waits
until this node's catalog holds the new partitions and is the topic as it has it.

`POST /v1/admin/nodes/{node}/drain` marks a node drained: every leadership it holds
moves elsewhere (multiraft/node/draining.py) and it takes none until
`DELETE /v1/admin/nodes/{node}/drain` clears the mark. Both answer the node's drain
status at once (the transfers take a moment): whether it is drained, how many
partitions it leads as this node sees it, and whether it leads the metadata group.
Both need the admin right when auth is on (access.py).

`POST /v1/admin/nodes/{node}/decommission` starts taking a node out of the cluster
(multiraft/node/decommission.py: leaderships leave it, its replicas move to the
other nodes a few at a time, then it leaves the metadata group); `DELETE` on the same
path cancels it (recommission: the replicas already moved stay where they are), and
`GET` shows how far it got. All three answer the decommission status as this node
sees it: the stage (`moving_replicas`, `leaving_metadata`, `done`; null when not
decommissioning), the partitions it still keeps a copy of, the partitions it leads,
its place in the metadata group, and, from the controller, why it waits. Admin
right when auth is on.

`POST /v1/admin/nodes/{node}/promote` (`?replace=M`) makes a metadata learner a
voter, in place of voter M if given (multiraft/node/metadata_voters.py), and answers
the metadata group's voters and learners once this node applied the change. Admin.

`GET /v1/admin/config` shows the cluster settings a node acts on at run time (today
one: `replica_move_bytes_per_s`, the move throttle, multiraft/node/move_throttle.py),
each as `{"value": what this node uses, "cluster": the cluster setting or null}`;
`PATCH` with `{"replica_move_bytes_per_s": N}` sets it for every node (null: back to
each node's own), answered as GET. Admin right when auth is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from multiraft.errors import InvalidConfig, InvalidPartitions, InvalidRequest, UnknownNode
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.params import is_int, json_object
from multiraft.http.view import METADATA_GROUP, topic_view
from multiraft.metadata.commands import PARTITIONS_MAX, SetClusterConfig
from multiraft.node.api import MOVE_THROTTLE_SETTING, REPLICA_MOVE_BYTES_PER_S_MAX
from raftlog.types import GroupId, NodeId

NODE_ID_MAX = 2**31 - 1  # as an admission's node_id (handlers/nodes.py)


async def create_partitions(request: web.Request) -> web.Response:
    node = node_of(request)
    name = request.match_info["topic"]
    body = await json_object(request)
    if set(body) != {"count"}:
        raise InvalidRequest('body is {"count": N}: the topic\'s new number of partitions')
    count = body["count"]
    if not is_int(count) or not 1 <= count <= PARTITIONS_MAX:
        raise InvalidPartitions(f"count must be an integer in 1..{PARTITIONS_MAX}")
    current = len(node.catalog.topic(name).partitions)  # 404 UNKNOWN_TOPIC first
    if count <= current:
        raise InvalidPartitions(f"topic {name!r} has {current} partitions; partitions can only be added, "
                                f"so count must be above {current}, got {count}")
    await bounded(node.create_partitions(name, count), "adding partitions")
    await bounded(node.sync_catalog(), "partition propagation")
    return web.json_response(topic_view(node, node.catalog.topic(name)))


def _path_node(request: web.Request) -> NodeId:
    raw = request.match_info["node"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= NODE_ID_MAX:
        raise InvalidRequest(f"node must be a node id in 1..{NODE_ID_MAX}, got {raw[:40]!r}")
    node_id = NodeId(int(raw))
    if node_id not in node_of(request).catalog.nodes:
        raise UnknownNode(f"node {node_id} is not registered")
    return node_id


def drain_status(request: web.Request, node_id: NodeId) -> dict[str, Any]:
    node = node_of(request)
    info = node.catalog.nodes[node_id]
    metadata = node.group_status(GroupId(METADATA_GROUP))
    return {"node_id": node_id, "drained": info.drained, "partitions_led": node.partitions_led(node_id),
            "leads_metadata": metadata is not None and metadata.leader == node_id}


async def drain(request: web.Request) -> web.Response:
    return await _set_drained(request, True)


async def undrain(request: web.Request) -> web.Response:
    return await _set_drained(request, False)


def decommission_status(request: web.Request, node_id: NodeId) -> dict[str, Any]:
    node = node_of(request)
    progress = node.decommission_progress(node_id)
    return {"node_id": node_id, "decommissioning": progress.decommissioning,
            "stage": progress.stage.value if progress.stage is not None else None,
            "replicas": progress.replicas, "partitions_led": node.partitions_led(node_id),
            "metadata_member": progress.metadata_member, "waiting_for": progress.waiting_for}


async def decommission(request: web.Request) -> web.Response:
    return await _set_decommissioning(request, True)


async def recommission(request: web.Request) -> web.Response:
    return await _set_decommissioning(request, False)


async def decommission_state(request: web.Request) -> web.Response:
    return web.json_response(decommission_status(request, _path_node(request)))


async def _set_decommissioning(request: web.Request, decommissioning: bool) -> web.Response:
    what = "decommissioning" if decommissioning else "recommissioning"
    return await _set_mark(request, what, lambda node, node_id: node.set_decommissioning(node_id, decommissioning),
                           decommission_status)


async def _set_mark(request: web.Request, what: str, setter: Callable[[Any, NodeId], Awaitable[None]],
                    status: Callable[[web.Request, NodeId], dict[str, Any]]) -> web.Response:
    """Set a node's mark through the metadata group, wait until this node applied it,
    answer the node's status."""
    node_id = _path_node(request)
    node = node_of(request)
    await bounded(setter(node, node_id), f"{what} a node")
    await bounded(node.sync_catalog(), f"{what} propagation")
    return web.json_response(status(request, node_id))


async def _set_drained(request: web.Request, drained: bool) -> web.Response:
    what = "draining" if drained else "undraining"
    return await _set_mark(request, what, lambda node, node_id: node.set_drained(node_id, drained), drain_status)


CLUSTER_SETTINGS = {MOVE_THROTTLE_SETTING: (0, REPLICA_MOVE_BYTES_PER_S_MAX)}


def cluster_settings(request: web.Request) -> dict[str, Any]:
    node = node_of(request)
    stored = node.catalog.cluster_config
    return {key: {"value": node.effective_setting(key), "cluster": stored.get(key)} for key in CLUSTER_SETTINGS}


async def get_config(request: web.Request) -> web.Response:
    return web.json_response(cluster_settings(request))


async def patch_config(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_object(request)
    if not body:
        raise InvalidConfig(f"name at least one setting: {sorted(CLUSTER_SETTINGS)}")
    for key, value in body.items():
        if key not in CLUSTER_SETTINGS:
            raise InvalidConfig(f"unknown cluster setting {key[:100]!r}; known: {sorted(CLUSTER_SETTINGS)}")
        low, high = CLUSTER_SETTINGS[key]
        if value is not None and not (is_int(value) and low <= value <= high):
            raise InvalidConfig(f"{key} is an integer in {low}..{high}, or null (each node's own)")
    for key, value in body.items():
        await bounded(node.propose_metadata(SetClusterConfig(key=key, value=value)), "setting the cluster config")
    await bounded(node.sync_catalog(), "cluster config propagation")
    return web.json_response(cluster_settings(request))


PROMOTE_WAIT_S = 5.0


async def promote(request: web.Request) -> web.Response:
    node_id = _path_node(request)
    node = node_of(request)
    unknown = sorted(set(request.query) - {"replace"})
    if unknown:
        raise InvalidRequest(f"unknown query parameters {unknown[:5]}")
    replace = None
    if "replace" in request.query:
        raw = request.query["replace"]
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= NODE_ID_MAX:
            raise InvalidRequest(f"replace must be a node id in 1..{NODE_ID_MAX}, got {raw[:40]!r}")
        replace = NodeId(int(raw))
    await bounded(node.promote_node(node_id, replace), "promoting a node")

    def applied_here() -> bool:
        voters, _ = node.metadata_membership()
        return node_id in voters and (replace is None or replace not in voters)

    await bounded(_until(applied_here, PROMOTE_WAIT_S), "the promotion reaching this node")
    voters, learners = node.metadata_membership()
    return web.json_response({"node_id": node_id, "metadata_voters": voters, "metadata_learners": learners})


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)
