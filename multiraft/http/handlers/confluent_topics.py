"""The Confluent REST v2 dialect's topics: produce, and what a v2 client reads of the
cluster (topics, partitions, their offsets, brokers). docs/http.md, "Confluent REST v2
dialect".

Produce goes through the native produce path (handlers/produce.py): records are spread
by the same rule (an explicit `partition`; else Kafka's `murmur2(key) % partitions` over
the key's stored bytes; else round-robin, the counter shared with native produce), one
batch per partition, forwarded to the leaders. The stored bytes are Confluent's:
`binary` keys and values are the base64-decoded bytes; `json` ones are the compact JSON
text (Kafka's JSON serializer writes a string key "a" as the three bytes `"a"`, so it
hashes, and lands, where those bytes do; a native produce of the string `a` stores one).
A partition whose produce fails answers its records with Confluent's `error_code` and
`error` instead of an offset; the others still answer their offsets (v2's convention).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from multiraft.errors import InvalidRequest, UnknownPartition
from multiraft.http.confluent_errors import EMBEDDED, PRODUCE_TYPES, confluent_error
from multiraft.http.handlers.common import bounded, catalog_read, node_of
from multiraft.http.handlers.confluent_common import (
    body_object,
    check_accept,
    only,
    path_partition,
    reply,
    topic_info,
)
from multiraft.http.handlers.produce import _produce_batches, place_records
from multiraft.http.limits import RECORDS_PER_REQUEST_MAX
from multiraft.http.params import is_int
from multiraft.http.records import encode_records, parse_records
from multiraft.http.view import partition_view
from multiraft.node.api import NO_OFFSET, PartitionBatch
from raftlog.errors import ClientError

_RECORD_FIELDS = {"key", "value", "partition"}
_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _records(body: dict[str, Any], fmt: str, partition: int | None) -> list[Any]:
    """The body's records as the native parser takes them (json keys as their JSON text)."""
    only(body, {"records"})
    records = body.get("records")
    if not isinstance(records, list):
        raise InvalidRequest("body is {\"records\": [{\"key\", \"value\", \"partition\"}, ...]}")
    converted = []
    for i, record in enumerate(records[:RECORDS_PER_REQUEST_MAX + 1]):
        if not isinstance(record, dict) or set(record) - _RECORD_FIELDS:
            raise InvalidRequest(f"records[{i}] is an object with the fields {sorted(_RECORD_FIELDS)}")
        record = dict(record)
        if fmt == "json" and record.get("key") is not None:
            try:
                record["key"] = _KEY_ENCODER.encode(record["key"])
            except ValueError as error:
                raise InvalidRequest(f"records[{i}].key is not representable as JSON: {error}") from None
        own = record.get("partition")
        if own is not None and (not is_int(own) or own < 0):  # checked even where the path's wins
            raise InvalidRequest(f"records[{i}].partition must be a non-negative integer")
        if partition is not None:
            record["partition"] = partition  # the path's partition wins (as Confluent's does)
        converted.append(record)
    return parse_records(converted, fmt, RECORDS_PER_REQUEST_MAX)


def _format(request: web.Request) -> str:
    fmt = EMBEDDED.get(request.content_type)
    return fmt if fmt is not None else "binary"  # body_object refuses other types (415)


async def produce(request: web.Request) -> web.Response:
    """POST /topics/{topic} and /topics/{topic}/partitions/{partition}."""
    node = node_of(request)
    check_accept(request)
    topic = request.match_info["topic"]
    info = topic_info(node, topic)
    partition = path_partition(node, request) if "partition" in request.match_info else None
    body = await body_object(request, types=PRODUCE_TYPES, bulk=True)
    records = _records(body, _format(request), partition)
    by_partition = await place_records(request, topic, records, len(info.partitions))
    for p in by_partition:
        if p >= len(info.partitions):
            raise UnknownPartition(f"topic {topic!r} has no partition {p}")
    order = sorted(by_partition)
    batches = [PartitionBatch(partition=p, batch=encode_records([records[i] for i in by_partition[p]]))
               for p in order]
    outcomes = await _produce_batches(request, topic, batches, "quorum")
    offsets: list[dict[str, Any]] = [{} for _ in records]
    for p, outcome in zip(order, outcomes, strict=True):
        if isinstance(outcome, BaseException) and not isinstance(outcome, ClientError):
            raise outcome
        for i, position in enumerate(by_partition[p]):
            if isinstance(outcome, ClientError):
                offsets[position] = {"partition": p, "offset": None, "error_code": confluent_error(outcome)[1],
                                     "error": outcome.message}
            else:
                base = outcome.base_offset
                offsets[position] = {"partition": p, "offset": base + i if base != NO_OFFSET else None,
                                     "error_code": None, "error": None}
    return reply({"key_schema_id": None, "value_schema_id": None, "offsets": offsets})


def _partition(node: Any, partition: Any) -> dict[str, Any]:
    view = partition_view(node, partition)
    leader, in_sync = view["leader"], set(view["isr"] or ([view["leader"]] if view["leader"] else []))
    return {"partition": view["partition"], "leader": leader if leader is not None else -1,
            "replicas": [{"broker": r, "leader": r == leader, "in_sync": r in in_sync} for r in view["replicas"]]}


async def list_topics(request: web.Request) -> web.Response:
    """GET /topics: the topic names."""
    node = node_of(request)
    check_accept(request)
    await catalog_read(request)
    return reply(sorted(node.catalog.topics))


async def describe_topic(request: web.Request) -> web.Response:
    """GET /topics/{topic}: name, configs, partitions."""
    node = node_of(request)
    check_accept(request)
    info = topic_info(node, request.match_info["topic"])
    # Kafka's spelling of the settings (retention_ms -> retention.ms), values as strings.
    configs = {key.replace("_", "."): str(value) for key, value in sorted(info.config.items())}
    return reply({"name": info.name, "configs": configs, "partitions": [_partition(node, p) for p in info.partitions]})


async def list_partitions(request: web.Request) -> web.Response:
    """GET /topics/{topic}/partitions."""
    node = node_of(request)
    check_accept(request)
    info = topic_info(node, request.match_info["topic"])
    return reply([_partition(node, p) for p in info.partitions])


async def describe_partition(request: web.Request) -> web.Response:
    """GET /topics/{topic}/partitions/{partition}."""
    node = node_of(request)
    check_accept(request)
    partition = path_partition(node, request)
    return reply(_partition(node, topic_info(node, request.match_info["topic"]).partitions[partition]))


async def partition_offsets(request: web.Request) -> web.Response:
    """GET /topics/{topic}/partitions/{partition}/offsets: log start and high watermark."""
    node = node_of(request)
    check_accept(request)
    tp = (request.match_info["topic"], path_partition(node, request))
    bounds = await bounded(node.partition_bounds([tp]), "partition offsets")
    start, end = bounds[tp]
    return reply({"beginning_offset": start, "end_offset": end})


async def brokers(request: web.Request) -> web.Response:
    """GET /brokers: the node ids."""
    node = node_of(request)
    check_accept(request)
    return reply({"brokers": sorted(node.catalog.nodes)})
