"""What the Confluent REST v2 dialect's handlers share: answers in its media type, its
Accept rule, typed lookups of topics and partitions (40401 / 40402), and lists of
partitions in its `{"topic", "partition"}` shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from multiraft.errors import InvalidRequest, NotAcceptable, UnknownPartition
from multiraft.http.confluent_errors import ACCEPTED, BODY_TYPES, V2_JSON
from multiraft.http.limits import JSON_BULK_VALUES_MAX, REQUEST_BYTES_MAX
from multiraft.http.params import is_int, json_object
from multiraft.metadata.catalog import TopicInfo

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi

# Partitions one request may name (assignments, seeks, offsets): a group's bound.
PARTITIONS_PER_REQUEST_MAX = 10_000


def reply(data: Any, status: int = 200, content_type: str = V2_JSON) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type=content_type)


def no_content() -> web.Response:
    return web.Response(status=204)


def media_types(request: web.Request) -> list[str]:
    """The media types an Accept header lists, without parameters (q values are not ranked)."""
    header = request.headers.get("Accept", "")
    return [part.split(";", 1)[0].strip().lower() for part in header.split(",") if part.strip()]


def check_accept(request: web.Request, allowed: tuple[str, ...] = ACCEPTED) -> None:
    """406 when an Accept header is given and allows none of `allowed`."""
    listed = media_types(request)
    if listed and not any(t in allowed for t in listed):
        raise NotAcceptable(f"this answers {allowed[0]}; Accept lists {', '.join(listed)[:200]}")


async def body_object(request: web.Request, *, required: bool = True, types: tuple[str, ...] = BODY_TYPES,
                      bulk: bool = False) -> dict[str, Any]:
    """A JSON body of the dialect's types, bounded as every JSON route's (params.py), or
    with `bulk` as the native bulk routes' (a produce carries many records)."""
    if bulk:
        return await json_object(request, required=required, content_types=types,
                                 bytes_max=REQUEST_BYTES_MAX, values_max=JSON_BULK_VALUES_MAX)
    return await json_object(request, required=required, content_types=types)


def only(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise InvalidRequest(f"unknown fields {extra[:5]}; allowed: {sorted(allowed)}")


def topic_info(node: NodeApi, topic: str) -> TopicInfo:
    return node.catalog.topic(topic)  # UnknownTopic: 40401


def check_partition(node: NodeApi, topic: str, partition: object) -> int:
    info = topic_info(node, topic)
    if not is_int(partition) or partition < 0:  # type: ignore[operator]
        raise InvalidRequest(f"partition must be a non-negative integer, got {str(partition)[:40]}")
    assert isinstance(partition, int)
    if partition >= len(info.partitions):
        raise UnknownPartition(f"topic {topic!r} has no partition {partition}")
    return partition


def path_partition(node: NodeApi, request: web.Request) -> int:
    """The path's partition of the path's topic (40401, 40402)."""
    topic = request.match_info["topic"]
    raw = request.match_info["partition"]
    topic_info(node, topic)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise UnknownPartition(f"topic {topic!r} has no partition {raw[:40]!r}")
    return check_partition(node, topic, int(raw))


def partition_list(node: NodeApi, value: object, name: str, *, with_offset: bool = False
                   ) -> dict[tuple[str, int], int]:
    """`[{"topic", "partition"(, "offset")}]` -> {(topic, partition): offset (0 without)},
    each partition known to this node's catalog."""
    fields = {"topic", "partition", "offset"} if with_offset else {"topic", "partition"}
    if not isinstance(value, list) or len(value) > PARTITIONS_PER_REQUEST_MAX:
        raise InvalidRequest(f"{name} is a list of at most {PARTITIONS_PER_REQUEST_MAX} objects {sorted(fields)}")
    found: dict[tuple[str, int], int] = {}
    for item in value:
        if not isinstance(item, dict) or set(item) - (fields | {"metadata"}) or not {"topic", "partition"} <= set(item):
            raise InvalidRequest(f"each of {name} is an object with the fields {sorted(fields)}")
        topic = item["topic"]
        if not isinstance(topic, str):
            raise InvalidRequest(f"{name}: topic must be a string")
        partition = check_partition(node, topic, item["partition"])
        offset = item.get("offset", 0)
        if with_offset and (not is_int(offset) or not 0 <= offset < 2**63 - 1):
            raise InvalidRequest(f"{name}: offset must be a non-negative integer")
        found[(topic, partition)] = offset
    return found


def partitions_json(pairs: Any) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(pairs)]
