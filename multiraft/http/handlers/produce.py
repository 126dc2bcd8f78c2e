"""Produce: JSON records to a topic (partitioned here) or to one partition (JSON or binary).

Topic produce: records with an explicit `partition` go there; keyed records go
to Kafka's `murmur2(key) % partitions`; unkeyed records are spread round-robin.
Records of one partition become one batch (one Raft entry), and the batches of
different partitions are produced concurrently. Offsets come back in request
order. When some partitions fail and others succeed, the answer is 200 and the
failed records carry `error_code`/`message` instead of an offset (the Confluent
REST v2 convention); when all fail, the answer is the first error. With
`forward=false` the records of partitions this node does not lead fail that way
with NOT_LEADER (a client that routes by itself learns each partition's leader).

Partition produce: a binary batch (`application/vnd.raftlog.batch`, validated
before anything is proposed) or JSON records, with the idempotent-producer fields
for JSON. `forward=false` answers 421 with the leader instead of forwarding.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy  # noqa: F401  # loaded with the server, not by the first keyed produce on the loop (partitioner.py)
from aiohttp import web

from multiraft.errors import UnsupportedMediaType, error_body
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.limits import BATCH_CONTENT_TYPE
from multiraft.http.params import path_partition, query_str, read_body
from multiraft.http.produce_body import ACKS, produce_body
from multiraft.http.records import ParsedRecord, encode_records
from multiraft.node.api import (
    NO_OFFSET,
    PartitionBatch,
    ProduceResult,
    partitions_for_keys,
    validate_off_loop,
)
from raftlog.errors import ClientError

ROUND_ROBIN_KEY: web.AppKey[dict[str, itertools.count[int]]] = web.AppKey("round_robin", dict)


# Keys hashed on the loop up to this many bytes in a request; more go to a worker thread
# (murmur2 of a long key is a Python loop over its words: 12 keys of 1 MiB held the loop
# 0.65 s; in the thread the loop runs between the interpreter's switch intervals).
KEYS_INLINE_BYTES_MAX = 64 * 1024


async def _key_partitions(records: list[ParsedRecord], partitions: int) -> list[int]:
    """The partition of each keyed record without an explicit one, in order."""
    keys = [record.key for record in records if record.partition is None and record.key is not None]
    if sum(map(len, keys)) <= KEYS_INLINE_BYTES_MAX:
        return partitions_for_keys(keys, partitions)
    return await asyncio.to_thread(partitions_for_keys, keys, partitions)


def _by_partition(request: web.Request, topic: str, records: list[ParsedRecord],
                  partitions: int, key_partitions: list[int]) -> dict[int, list[int]]:
    """The positions of the request's records, per partition (`key_partitions`: the keyed
    records', in order, from `_key_partitions`)."""
    counter = request.app[ROUND_ROBIN_KEY].setdefault(topic, itertools.count())
    hashed = iter(key_partitions)
    by_partition: dict[int, list[int]] = {}
    for position, record in enumerate(records):
        if record.partition is not None:
            partition = record.partition
        elif record.key is not None:
            partition = next(hashed)
        else:
            partition = next(counter) % partitions
        positions = by_partition.get(partition)
        if positions is None:
            by_partition[partition] = [position]
        else:
            positions.append(position)
    return by_partition


async def place_records(request: web.Request, topic: str, records: list[ParsedRecord],
                        partitions: int) -> dict[int, list[int]]:
    """The positions of the request's records, per partition: explicit, keyed (off the loop
    when the keys are long), else round-robin. The native and the Confluent produce's."""
    return _by_partition(request, topic, records, partitions, await _key_partitions(records, partitions))


async def produce_topic(request: web.Request) -> web.Response:
    node = node_of(request)
    topic = request.match_info["topic"]
    info = node.catalog.topic(topic)
    parsed = await produce_body(request, partition=False)
    records, acks = parsed.records, parsed.acks
    by_partition = await place_records(request, topic, records, len(info.partitions))
    for partition in by_partition:
        node.partition_group(topic, partition)  # 404 for a partition that does not exist
    order = sorted(by_partition)
    batches = [PartitionBatch(partition=p, batch=encode_records([records[i] for i in by_partition[p]])) for p in order]
    outcomes = await _produce_batches(request, topic, batches, acks)
    offsets: list[dict[str, Any]] = [{} for _ in records]
    failures = []
    for partition, outcome in zip(order, outcomes, strict=True):
        if isinstance(outcome, ClientError):
            failures.append(outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        for i, position in enumerate(by_partition[partition]):
            if isinstance(outcome, ClientError):
                offsets[position] = {"partition": partition, "offset": None, **error_body(outcome)}
            else:
                base = outcome.base_offset
                offsets[position] = {"partition": partition, "offset": base + i if base != NO_OFFSET else NO_OFFSET}
    if failures and len(failures) == len(order):
        raise failures[0]
    return web.json_response({"offsets": offsets})


async def _produce_batches(request: web.Request, topic: str, batches: list[PartitionBatch],
                           acks: str) -> list[ProduceResult | BaseException]:
    """Each batch's outcome, in order. With `forward=false` the partitions led elsewhere
    fail as NOT_LEADER and the others are produced; otherwise the node forwards (one
    call per leader node)."""
    node = node_of(request)
    refused: dict[int, ClientError] = {}
    if _forward_refused(request):
        for place, entry in enumerate(batches):
            try:
                node.require_leadership(topic, entry.partition)
            except ClientError as error:
                refused[place] = error
    places = [place for place in range(len(batches)) if place not in refused]
    waits = node.produce_spread(topic, [batches[place] for place in places], acks)
    produced = iter(await asyncio.gather(*(bounded(wait, "produce") for wait in waits), return_exceptions=True))
    return [refused[place] if place in refused else next(produced) for place in range(len(batches))]


def _forward_refused(request: web.Request) -> bool:
    """`forward=false`: the client wants this node's own answer, never a forward."""
    return query_str(request, "forward", "true", ("true", "false")) == "false"


async def produce_partition(request: web.Request) -> web.Response:
    node = node_of(request)
    topic = request.match_info["topic"]
    partition = path_partition(request)
    node.partition_group(topic, partition)  # 404 before reading a large body
    if request.content_type == BATCH_CONTENT_TYPE:
        batch = await read_body(request)
        header = await validate_off_loop(batch)
        acks = query_str(request, "acks", "quorum", ACKS)
    elif request.content_type == "application/json" or not request.can_read_body:
        parsed = await produce_body(request, partition=True, acks_default=query_str(request, "acks", "quorum"))
        batch, acks = parsed.batch, parsed.acks
        assert batch is not None
        header = None  # encoded here, validated by the leader
    else:
        raise UnsupportedMediaType(f"expected application/json or {BATCH_CONTENT_TYPE}, got {request.content_type}")
    if _forward_refused(request):
        node.require_leadership(topic, partition)
    result = await bounded(node.produce(topic, partition, batch, acks, header), "produce")
    return web.json_response({"partition": partition, "base_offset": result.base_offset,
                              "count": result.count, "duplicate": result.duplicate})
