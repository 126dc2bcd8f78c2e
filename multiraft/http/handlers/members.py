"""Consumer group membership over HTTP (KIP-848 semantics), served by any node.

A member joins with its subscription and gets a member id, an epoch and what it
owns; it heartbeats what it owns (and learns what to give back), fetches records of
its partitions, commits, and leaves. Every call goes to the group coordinator (the
metadata leader), forwarded by whichever node received it (multiraft/node/
group_coordinator.py). docs/http.md ("Consumer groups") has the routes and shapes.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

import orjson
from aiohttp import web

from multiraft.errors import InvalidRequest, UnknownMemberId
from multiraft.http.access import auth_on, is_admin, may_read_all, require, require_subscription
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.handlers.groups import group_name
from multiraft.http.limits import (
    BATCH_CONTENT_TYPE,
    CONSUME_MAX_BYTES_DEFAULT,
    CONSUME_MAX_RECORDS_DEFAULT,
    REQUEST_TIMEOUT_S,
)
from multiraft.http.params import int_field, json_object, query_int, str_field
from multiraft.http.records import FORMATS, render_batch
from multiraft.node.api import (
    ASSIGNORS,
    MAX_BYTES_MAX,
    MAX_RECORDS_MAX,
    RESETS,
    WAIT_MS_MAX,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    MemberFetch,
    PartitionFetch,
    Subscription,
    group_limits,
)

_JOIN_FIELDS = {"member_id", "topics", "topic_pattern", "rebalance_timeout_ms", "session_timeout_ms", "assignor"}
_HEARTBEAT_FIELDS = {"member_epoch", "owned"}
_FETCH_FIELDS = {"member_epoch", "positions", "auto_offset_reset", "max_records", "max_bytes", "wait_ms", "format"}
# Rendering more than this much stored data runs off the event loop (as consume does).
RENDER_INLINE_BYTES_MAX = 1024 * 1024


def _member(request: web.Request) -> str:
    member_id = request.match_info["member"]
    group_limits.check_member_id(member_id)
    return member_id


async def _authorize_member(request: web.Request, group: str, member_id: str, *, new_ok: bool = False) -> None:
    """With auth on, the group's READ for this member: read on its subscription's topics
    (access.py). This node's copy of group 0 trails the coordinator by an apply, so a
    member not in it is looked for again after catching up (a ReadIndex of group 0).
    `new_ok`: a join may name a member id nobody holds yet."""
    if not auth_on(request):
        return
    node = node_of(request)
    subscription = node.group_subscription(group, member_id)
    if subscription is None:
        await bounded(node.sync_catalog(), "a group member's rights")
        subscription = node.group_subscription(group, member_id)
    if subscription is None:
        if new_ok:
            return
        raise UnknownMemberId(f"group {group!r} has no member {member_id!r}; join again")
    require_subscription(request, subscription.topics, subscription.pattern is not None)


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    extra = set(body) - allowed
    if extra:
        raise InvalidRequest(f"unknown fields {sorted(extra)[:5]}; allowed: {sorted(allowed)}")


def _partition_list(value: object, name: str) -> tuple[tuple[str, int], ...]:
    """[{"topic", "partitions": [...]}] -> sorted (topic, partition) pairs, bounded."""
    if not isinstance(value, list) or len(value) > group_limits.OWNED_PARTITIONS_MAX:
        raise InvalidRequest(f"{name} is a list of {{\"topic\", \"partitions\"}} objects")
    pairs: list[tuple[str, int]] = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"topic", "partitions"} \
                or not isinstance(item["partitions"], list):
            raise InvalidRequest(f"{name} is a list of {{\"topic\", \"partitions\"}} objects")
        pairs.extend((item["topic"], p) for p in item["partitions"])
        if len(pairs) > group_limits.OWNED_PARTITIONS_MAX:
            raise InvalidRequest(f"{name} lists at most {group_limits.OWNED_PARTITIONS_MAX} partitions")
    result = tuple(pairs)
    group_limits.check_partitions(result, name, group_limits.OWNED_PARTITIONS_MAX)
    return tuple(sorted(result))


async def join(request: web.Request) -> web.Response:
    """POST /v1/groups/{group}/members: join (or join again with the same member_id)."""
    node = node_of(request)
    group = group_name(request)
    body = await json_object(request)
    _only(body, _JOIN_FIELDS)
    topics, pattern = body.get("topics"), body.get("topic_pattern")
    if topics is not None and (not isinstance(topics, list) or len(topics) > group_limits.SUBSCRIBED_TOPICS_MAX
                               or not all(isinstance(t, str) for t in topics)):
        raise InvalidRequest(f"topics is a list of at most {group_limits.SUBSCRIBED_TOPICS_MAX} names")
    subscription = Subscription(topics=tuple(sorted(set(topics or []))) if topics is not None else (),
                                pattern=pattern)
    for topic in subscription.topics:
        require(request, "read", topic)
    if subscription.pattern is not None:
        require(request, "read", "*")  # a pattern reaches topics not named yet
    member_id = body.get("member_id")
    if member_id is not None:  # joining again as a member: its rights on what it held, too
        group_limits.check_member_id(member_id)
        await _authorize_member(request, group, member_id, new_ok=True)
    command = JoinGroup(
        group=group, member_id=uuid.uuid4().hex if member_id is None else member_id, subscription=subscription,
        rebalance_timeout_ms=int_field(body, "rebalance_timeout_ms", group_limits.REBALANCE_TIMEOUT_MS_DEFAULT),
        session_timeout_ms=body.get("session_timeout_ms"),
        assignor=str_field(body, "assignor", choices=ASSIGNORS) if "assignor" in body else None,
    )
    return web.json_response(await bounded(node.group_command(command), "group join"))


async def heartbeat(request: web.Request) -> web.Response:
    """POST /v1/groups/{group}/members/{member}/heartbeat: keep alive, report what it owns."""
    node = node_of(request)
    body = await json_object(request)
    _only(body, _HEARTBEAT_FIELDS)
    owned = _partition_list(body["owned"], "owned") if body.get("owned") is not None else None
    command = Heartbeat(group=group_name(request), member_id=_member(request),
                        member_epoch=int_field(body, "member_epoch"), owned=owned)
    await _authorize_member(request, command.group, command.member_id)
    return web.json_response(await bounded(node.group_command(command), "group heartbeat"))


async def leave(request: web.Request) -> web.Response:
    """DELETE /v1/groups/{group}/members/{member}?member_epoch=N: leave; partitions go to the others."""
    node = node_of(request)
    command = LeaveGroup(group=group_name(request), member_id=_member(request),
                         member_epoch=query_int(request, "member_epoch", low=0, high=group_limits.EPOCH_MAX))
    await _authorize_member(request, command.group, command.member_id)
    await bounded(node.group_command(command), "group leave")
    return web.Response(status=204)


async def fetch(request: web.Request) -> web.Response:
    """POST /v1/groups/{group}/members/{member}/records: records of the member's partitions."""
    node = node_of(request)
    body = await json_object(request)
    _only(body, _FETCH_FIELDS)
    wait_ms = int_field(body, "wait_ms", 0, low=0, high=WAIT_MS_MAX)
    max_records = int_field(body, "max_records", CONSUME_MAX_RECORDS_DEFAULT, low=1, high=MAX_RECORDS_MAX)
    fmt = str_field(body, "format", "json", FORMATS)
    heartbeat = Heartbeat(group=group_name(request), member_id=_member(request),
                          member_epoch=int_field(body, "member_epoch"))
    await _authorize_member(request, heartbeat.group, heartbeat.member_id)
    result = await bounded(node.group_fetch(
        heartbeat, _positions(body.get("positions")), str_field(body, "auto_offset_reset", "latest", RESETS),
        max_records=max_records, wait_ms=wait_ms,
        max_bytes=int_field(body, "max_bytes", CONSUME_MAX_BYTES_DEFAULT, low=1, high=MAX_BYTES_MAX),
    ), "group fetch", REQUEST_TIMEOUT_S + wait_ms / 1000)
    if BATCH_CONTENT_TYPE in request.headers.get("Accept", ""):
        return web.Response(body=_fetch_batches(result), content_type=BATCH_CONTENT_TYPE)
    stored = sum(len(b) for p in result.partitions if p.result for _, _, b in p.result.batches)
    if stored > RENDER_INLINE_BYTES_MAX:
        answer = await asyncio.to_thread(_fetch_answer, result, fmt, max_records)
    else:
        answer = _fetch_answer(result, fmt, max_records)
    return web.Response(body=answer, content_type="application/json")


def _positions(value: object) -> dict[tuple[str, int], int]:
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > group_limits.OWNED_PARTITIONS_MAX:
        raise InvalidRequest(f"positions is a list of at most {group_limits.OWNED_PARTITIONS_MAX} "
                             "{\"topic\", \"partition\", \"offset\"} objects")
    positions: dict[tuple[str, int], int] = {}
    for item in value:
        if not isinstance(item, dict) or set(item) != {"topic", "partition", "offset"}:
            raise InvalidRequest("each position is {\"topic\", \"partition\", \"offset\"}")
        pair = (item["topic"], item["partition"])
        group_limits.check_partitions((pair,), "positions", 1)
        positions[pair] = int_field(item, "offset", low=0, high=2**63 - 1)
    return positions


def _error_row(part: PartitionFetch) -> dict[str, Any]:
    return {"topic": part.topic, "partition": part.partition,
            "error_code": getattr(part.error, "code", "INTERNAL"), "message": str(part.error)}


def _fetch_batches(result: MemberFetch) -> bytes:
    """The binary answer (`Accept: application/vnd.raftlog.batch`): a big-endian u32, that
    many bytes of JSON (`member`, `positions`, `errors` as in the JSON answer, and
    `batches`: [topic, partition, base_offset, length] in order), then the stored batches'
    bytes, unchanged, in that order. Nothing is decoded or rendered here, as a binary
    partition read; batches are whole, so a partition's first may start before its
    position (skip records below `positions[].offset`), and each partition's read is
    bounded by `max_records` rather than the answer."""
    header: dict[str, Any] = {"member": result.member, "positions": [], "errors": [], "batches": []}
    chunks: list[bytes] = []
    for part in result.partitions:
        if part.error is not None or part.result is None:
            header["errors"].append(_error_row(part))
            continue
        header["positions"].append({"topic": part.topic, "partition": part.partition, "offset": part.offset,
                                    "next_offset": part.result.next_offset,
                                    "high_watermark": part.result.high_watermark})
        for base, _count, batch in part.result.batches:
            header["batches"].append([part.topic, part.partition, base, len(batch)])
            chunks.append(batch)
    encoded = orjson.dumps(header)
    return struct.pack(">I", len(encoded)) + encoded + b"".join(chunks)


def _fetch_answer(result: MemberFetch, fmt: str, max_records: int) -> bytes:
    records: list[dict[str, Any]] = []
    positions, errors = [], []
    for part in result.partitions:
        if part.error is not None or part.result is None:
            errors.append(_error_row(part))
            continue
        next_offset = part.result.next_offset
        rendered: list[dict[str, Any]] = []
        for base, _count, batch in part.result.batches:
            if len(records) + len(rendered) >= max_records:
                break
            render_batch(base, batch, fmt, rendered, max_records - len(records), skip_below=part.offset)
        if rendered and len(records) + len(rendered) >= max_records:
            next_offset = rendered[-1]["offset"] + 1
        elif not rendered and part.result.batches and len(records) >= max_records:
            next_offset = part.offset  # the answer is full: this partition's records come next time
        records.extend({"topic": part.topic, "partition": part.partition, **r} for r in rendered)
        positions.append({"topic": part.topic, "partition": part.partition, "offset": part.offset,
                          "next_offset": next_offset, "high_watermark": part.result.high_watermark})
    return orjson.dumps({"member": result.member, "records": records, "positions": positions, "errors": errors})


async def describe(request: web.Request) -> web.Response:
    """GET /v1/groups/{group}[?topic=T...]: members, assignment, committed offsets and lag (of
    the named topics too, which also describe a group without members). With auth on it
    needs read on every member's subscription (access.py) and on each named topic, and
    only admin sees member ids and epochs (a member id is its member's proof of membership)."""
    node = node_of(request)

    def authorize(described: dict[str, Any]) -> None:
        subscriptions = [m["subscription"] for m in described["members"]]
        require_subscription(request, [t for s in subscriptions for t in s["topics"]],
                             any(s["topic_pattern"] is not None for s in subscriptions))

    topics = tuple(sorted(set(request.query.getall("topic", []))))
    if len(topics) > group_limits.SUBSCRIBED_TOPICS_MAX:
        raise InvalidRequest(f"at most {group_limits.SUBSCRIBED_TOPICS_MAX} topic parameters")
    for topic in topics:
        if not group_limits.TOPIC_NAME_PATTERN.fullmatch(topic):
            raise InvalidRequest(f"topic names must match {group_limits.TOPIC_NAME_PATTERN.pattern}")
        require(request, "read", topic)
    described = await bounded(node.describe_group(group_name(request), authorize, topics), "group describe")
    if not is_admin(request):
        for member in described["members"]:
            member["member_id"] = member["member_epoch"] = None
        for row in described["partitions"]:
            row["owner"] = None
    return web.json_response(described)


async def list_groups(request: web.Request) -> web.Response:
    """GET /v1/groups: the groups that have members (with auth on, those the token may describe)."""
    node = node_of(request)
    listed = await bounded(node.list_groups(), "group list")
    listed["groups"] = [g for g in listed["groups"]
                        if may_read_all(request, g["topics"], bool(g["topic_patterns"]))]
    return web.json_response(listed)
