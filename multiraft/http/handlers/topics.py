"""Topic administration: create, list, describe, alter settings, delete.

Creation is validated here with the same checks the metadata command applies
(`check_topic_name`, partition and replication factor ranges, config entries),
so bad input is refused before anything reaches the controller. The answer of
a create waits until this node's catalog holds the topic, and the answer of a
delete until it no longer does, so a describe right after either on the same
node agrees with it.

Reads answer from this node's catalog, which may trail the metadata leader by a
few milliseconds (a change made through another node may not show yet). With
`?consistency=linearizable` they first wait for everything completed anywhere
before the request (`Node.sync_catalog`), as etcd's linearizable reads do; the
price is a round trip to the metadata leader.
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidPartitions, InvalidReplicationFactor, InvalidRequest
from multiraft.http.handlers.common import bounded, catalog_read, node_of
from multiraft.http.params import is_int, json_object
from multiraft.http.view import topic_view
from multiraft.metadata.commands import (
    PARTITIONS_MAX,
    REPLICATION_FACTOR_MAX,
    AlterTopicConfig,
    check_config,
    check_known_config,
    check_topic_name,
)

_CREATE_FIELDS = {"name", "partitions", "replication_factor", "config"}


async def create_topic(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_object(request)
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown fields {unknown}")
    name = body.get("name")
    check_topic_name(name)
    assert isinstance(name, str)
    partitions = body.get("partitions", 1)
    if not is_int(partitions) or not 1 <= partitions <= PARTITIONS_MAX:
        raise InvalidPartitions(f"partitions must be an integer in 1..{PARTITIONS_MAX}")
    default_rf = min(3, max(1, len(node.catalog.placeable_nodes())))
    replication_factor = body.get("replication_factor", default_rf)
    if not is_int(replication_factor) or not 1 <= replication_factor <= REPLICATION_FACTOR_MAX:
        raise InvalidReplicationFactor(f"replication_factor must be an integer in 1..{REPLICATION_FACTOR_MAX}")
    config = body.get("config", {})
    check_config(config)
    check_known_config(config)
    await bounded(node.create_topic(name, partitions, replication_factor, config), "topic creation")
    await bounded(node.wait_for_topic(name), "topic propagation")
    return web.json_response(topic_view(node, node.catalog.topic(name)), status=201)


async def list_topics(request: web.Request) -> web.Response:
    node = node_of(request)
    await catalog_read(request)
    topics = [
        {"name": t.name, "partitions": len(t.partitions), "replication_factor": t.replication_factor}
        for _, t in sorted(node.catalog.topics.items())
    ]
    return web.json_response({"topics": topics})


async def describe_topic(request: web.Request) -> web.Response:
    node = node_of(request)
    await catalog_read(request)
    return web.json_response(topic_view(node, node.catalog.topic(request.match_info["topic"])))


async def alter_topic(request: web.Request) -> web.Response:
    """PATCH: `{"config": {key: value, key: null, ...}}` sets or removes settings (Kafka's
    incremental alter-configs); answers the topic as this node's catalog has it after."""
    node = node_of(request)
    name = request.match_info["topic"]
    body = await json_object(request)
    if set(body) != {"config"} or not isinstance(body["config"], dict) or not body["config"]:
        raise InvalidRequest('body is {"config": {KEY: VALUE or null, ...}} with at least one key')
    changes = body["config"]
    AlterTopicConfig(name=name, changes=changes)  # 400 for a bad key or value before anything is proposed
    check_known_config(changes)
    await bounded(node.alter_topic_config(name, changes), "topic configuration")
    await bounded(node.sync_catalog(), "topic propagation")
    return web.json_response(topic_view(node, node.catalog.topic(name)))


async def delete_topic(request: web.Request) -> web.Response:
    node = node_of(request)
    await bounded(node.delete_topic(request.match_info["topic"]), "topic deletion")
    await bounded(node.wait_for_topic(request.match_info["topic"], present=False), "topic propagation")
    return web.Response(status=204)
