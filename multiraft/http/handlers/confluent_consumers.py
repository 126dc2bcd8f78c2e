"""The Confluent REST v2 dialect's consumer instances, served by every node.

An instance lives in group 0, not in this process (multiraft/node/consumer_instances.py),
so its `base_uri` names whichever node created it, yet any node answers every call on it,
and it outlives that node. Each call reads the instance at the group coordinator first
(which keeps it alive, as Confluent's proxy does on every call) and then acts.

With tokens on, creating an instance needs read on some topic (Kafka asks READ on the
group to join it; a group's READ here is read on its topics), and the instance keeps the
name of the token that created it: only that token, or an admin, may drive it. Each call
also needs what a native member call needs (access.py): read on each topic the instance
subscribes to or assigned itself (`read:*` for a pattern), and read on the topics a
subscribe, assign, seek or offsets call names.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import structlog
from aiohttp import web

from multiraft.errors import (
    ConsumerFormatMismatch,
    ConsumerIllegalState,
    InvalidConsumerConfig,
    InvalidRequest,
    NotAcceptable,
    NotAuthorized,
    UnknownConsumerInstance,
)
from multiraft.http import jsontext
from multiraft.http.access import PRINCIPAL_KEY, require, require_subscription
from multiraft.http.confluent_errors import BINARY_V2, EMBEDDED, JSON_V2, V2_JSON
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.handlers.confluent_common import (
    body_object,
    check_accept,
    media_types,
    no_content,
    only,
    partition_list,
    partitions_json,
    reply,
)
from multiraft.http.handlers.groups import group_name
from multiraft.http.limits import REQUEST_TIMEOUT_S
from multiraft.http.params import is_int, query_int
from multiraft.node.api import (
    MAX_BYTES_MAX,
    POLL_RECORDS_MAX,
    CreateInstance,
    MemberFetch,
    Subscription,
    group_limits,
)
from raftlog.errors import ClientError
from storage.batch import decode_columns

_logger = structlog.get_logger("multiraft.http")

_CREATE_FIELDS = {"name", "id", "format", "auto.offset.reset", "auto.commit.enable", "fetch.min.bytes",
                  "consumer.request.timeout.ms", "consumer.instance.timeout.ms"}
# Rendering more stored bytes than this runs off the event loop (as native consume does).
RENDER_INLINE_BYTES_MAX = 1024 * 1024
MAX_BYTES_DEFAULT = 64 * 1024 * 1024  # Confluent's consumer.request.max.bytes default


def _instance(request: web.Request) -> tuple[str, str]:
    group = group_name(request)
    instance = request.match_info["instance"]
    if not group_limits.MEMBER_ID_PATTERN.fullmatch(instance):
        raise UnknownConsumerInstance(f"consumer instance {instance[:70]!r} not found in group {group!r}")
    return group, instance


async def _view(request: web.Request) -> dict[str, Any]:
    """The instance at the coordinator (40403 when there is none), with the caller's rights checked."""
    group, instance = _instance(request)
    view = await bounded(node_of(request).instances.view(group, instance), "consumer instance")
    principal = request.get(PRINCIPAL_KEY)
    owner = view["config"].get("owner")
    if principal is not None and not principal.is_admin and owner is not None and owner != principal.name:
        raise NotAuthorized(f"token {principal.name!r} may not do this: consumer instance {instance!r} "
                            "belongs to the token that created it")
    subscription = view["subscription"]
    manual_topics = sorted({t for t, _ in view["manual"]})
    if subscription is not None:
        require_subscription(request, subscription["topics"], subscription["topic_pattern"] is not None)
    else:
        require_subscription(request, manual_topics, False)
    return view


def _setting(body: dict[str, Any], name: str, default: Any, kind: type) -> Any:
    """A creation setting; Confluent's clients send numbers and booleans as strings too."""
    value = body.get(name, default)
    if value is None:
        return default
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if kind is int and isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        return int(value)
    if (kind is int and not is_int(value)) or not isinstance(value, kind):
        raise InvalidConsumerConfig(f"{name} must be a {kind.__name__}")
    return value


async def create(request: web.Request) -> web.Response:
    """POST /consumers/{group}: a new instance, `{"instance_id", "base_uri"}`."""
    node = node_of(request)
    group = group_name(request)
    check_accept(request)
    body = await body_object(request, required=False)
    extra = sorted(set(body) - _CREATE_FIELDS)
    if extra:
        raise InvalidConsumerConfig(f"unknown settings {extra[:5]}; known: {sorted(_CREATE_FIELDS)}")
    principal = request.get(PRINCIPAL_KEY)
    if principal is not None and not principal.may("read"):
        raise NotAuthorized(f"token {principal.name!r} may not do this: a consumer instance needs read on some topic")
    name = _instance_name(body)
    try:
        command = CreateInstance(
            group=group, member_id=name, format=_setting(body, "format", "binary", str).lower(),
            auto_offset_reset=_setting(body, "auto.offset.reset", "latest", str),
            auto_commit=_setting(body, "auto.commit.enable", True, bool),
            request_timeout_ms=_setting(body, "consumer.request.timeout.ms",
                                        group_limits.REQUEST_TIMEOUT_MS_DEFAULT, int),
            instance_timeout_ms=_setting(body, "consumer.instance.timeout.ms",
                                         group_limits.INSTANCE_TIMEOUT_MS_DEFAULT, int),
            owner=principal.name if principal is not None else None)
    except InvalidConsumerConfig:
        raise
    except InvalidRequest as error:
        raise InvalidConsumerConfig(error.message) from None
    _setting(body, "fetch.min.bytes", 0, int)  # accepted for Confluent's clients; a GET answers once any data came
    await bounded(node.instances.create(command), "consumer instance creation")
    base = f"{request.scheme}://{request.host}"
    return reply({"instance_id": name, "base_uri": f"{base}/consumers/{group}/instances/{name}"})


def _instance_name(body: dict[str, Any]) -> str:
    """`name`, or kafka-rest's `id` (an alias; `name` first); drawn at
    random when both are left out or null, refused when invalid (even 0 or "")."""
    name = body.get("name")
    if name is None:
        name = body.get("id")
    if name is None:
        return f"rest-consumer-{uuid.uuid4().hex}"
    if not isinstance(name, str) or not group_limits.MEMBER_ID_PATTERN.fullmatch(name):
        raise InvalidConsumerConfig(f"name must match {group_limits.MEMBER_ID_PATTERN.pattern}")
    return name


async def delete(request: web.Request) -> web.Response:
    """DELETE /consumers/{group}/instances/{instance}."""
    view = await _view(request)
    await bounded(node_of(request).instances.delete(view["group"], view["instance_id"]), "consumer instance delete")
    return no_content()


async def subscribe(request: web.Request) -> web.Response:
    """POST .../subscription: `{"topics": [...]}` or `{"topic_pattern": GLOB}`."""
    view = await _view(request)
    body = await body_object(request)
    only(body, {"topics", "topic_pattern"})
    if "topics" in body and "topic_pattern" in body:
        raise ConsumerIllegalState("subscription to topics and to a topic_pattern are mutually exclusive")
    topics, pattern = body.get("topics"), body.get("topic_pattern")
    if ("topics" not in body and "topic_pattern" not in body) or topics == []:
        raise InvalidRequest("a subscription names topics (a non-empty list) or a topic_pattern")
    if "topics" in body and (not isinstance(topics, list) or len(topics) > group_limits.SUBSCRIBED_TOPICS_MAX
                             or not all(isinstance(t, str) for t in topics)):
        raise InvalidRequest(f"topics is a list of at most {group_limits.SUBSCRIBED_TOPICS_MAX} names")
    if "topic_pattern" in body and not isinstance(pattern, str):
        raise InvalidRequest("topic_pattern is a glob over topic names (a string)")
    subscription = Subscription(topics=tuple(sorted(set(topics))) if topics is not None else (), pattern=pattern)
    require_subscription(request, subscription.topics, subscription.pattern is not None)
    await bounded(node_of(request).instances.subscribe(view["group"], view["instance_id"], subscription), "subscribe")
    return no_content()


async def subscription(request: web.Request) -> web.Response:
    """GET .../subscription: `{"topics": [...]}` (for a pattern: the topics it matches now)."""
    check_accept(request)
    view = await _view(request)
    named = view["subscription"]
    if named is None:
        topics: list[str] = []
    elif named["topic_pattern"] is None:
        topics = named["topics"]
    else:
        topics = node_of(request).instances.pattern_topics(named["topic_pattern"])
    return reply({"topics": topics})


async def unsubscribe(request: web.Request) -> web.Response:
    """DELETE .../subscription."""
    view = await _view(request)
    await bounded(node_of(request).instances.subscribe(view["group"], view["instance_id"], None), "unsubscribe")
    return no_content()


async def assign(request: web.Request) -> web.Response:
    """POST .../assignments: `{"partitions": [{"topic", "partition"}]}`, by hand."""
    node = node_of(request)
    view = await _view(request)
    body = await body_object(request)
    only(body, {"partitions"})
    wanted = partition_list(node, body.get("partitions"), "partitions")
    for topic in sorted({t for t, _ in wanted}):
        require(request, "read", topic)
    await bounded(node.instances.assign(view["group"], view["instance_id"], tuple(sorted(wanted))), "assign")
    return no_content()


async def assignments(request: web.Request) -> web.Response:
    """GET .../assignments: what it reads now (Kafka's assignment())."""
    check_accept(request)
    view = await _view(request)
    member = view["member"]
    held = [(a["topic"], p) for a in member["assignment"] for p in a["partitions"]]
    if view["manual"]:
        held = [(t, p) for t, p in view["manual"]]
    return reply({"partitions": partitions_json(held)})


async def seek(request: web.Request) -> web.Response:
    """POST .../positions: `{"offsets": [{"topic", "partition", "offset"}]}`: read there next."""
    node = node_of(request)
    view = await _view(request)
    body = await body_object(request)
    only(body, {"offsets"})
    positions = partition_list(node, body.get("offsets"), "offsets", with_offset=True)
    await bounded(node.instances.seek(view["group"], view["instance_id"], positions), "seek")
    return no_content()


async def seek_edge(request: web.Request) -> web.Response:
    """POST .../positions/beginning and .../positions/end: `{"partitions": [...]}`."""
    node = node_of(request)
    view = await _view(request)
    body = await body_object(request)
    only(body, {"partitions"})
    wanted = tuple(sorted(partition_list(node, body.get("partitions"), "partitions")))
    edge = "beginning" if request.path.endswith("/beginning") else "end"
    await bounded(node.instances.seek_edge(view["group"], view["instance_id"], wanted, edge), "seek")
    return no_content()


async def commit(request: web.Request) -> web.Response:
    """POST .../offsets: the offsets of the last records consumed (committed + 1, as
    Confluent does), or, without a body, every position (what it fetched, or sought)."""
    node = node_of(request)
    view = await _view(request)
    body = await body_object(request, required=False)
    only(body, {"offsets"})
    offsets, metadata = None, {}
    if "offsets" in body:
        consumed = partition_list(node, body["offsets"], "offsets", with_offset=True)
        offsets = {tp: offset + 1 for tp, offset in consumed.items()}
        for item in body["offsets"]:  # shapes checked by partition_list; the length by OffsetCommit
            if item.get("metadata") is not None:
                if not isinstance(item["metadata"], str):
                    raise InvalidRequest("offsets: metadata must be a string")
                metadata[(item["topic"], item["partition"])] = item["metadata"]
    await bounded(node.instances.commit(view, offsets, metadata), "offset commit")
    return no_content()


async def committed(request: web.Request) -> web.Response:
    """GET .../offsets with a body `{"partitions": [...]}`: the group's committed offsets."""
    node = node_of(request)
    check_accept(request)
    view = await _view(request)
    body = await body_object(request)
    only(body, {"partitions"})
    wanted = tuple(sorted(partition_list(node, body.get("partitions"), "partitions")))
    for topic in sorted({t for t, _ in wanted}):
        require(request, "read", topic)
    found = await bounded(node.instances.committed(view["group"], wanted), "offsets")
    return reply({"offsets": [{"topic": t, "partition": p, "offset": o, "metadata": note}
                              for (t, p), (o, note) in sorted(found.items())]})


def _embedded(request: web.Request, instance_format: str) -> str:
    """The format the Accept asks for: the instance's, or 406 / 40601."""
    listed = media_types(request)
    # kafka-rest sends the bare v2 type to its binary reader; here it means the instance's format.
    if not listed or any(t in ("*/*", "application/*", V2_JSON) for t in listed):
        return instance_format
    asked = [EMBEDDED[t] for t in listed if t in EMBEDDED]
    if not asked:
        raise NotAcceptable(f"records are answered as {JSON_V2} or {BINARY_V2}")
    if instance_format not in asked:
        raise ConsumerFormatMismatch("the requested embedded data format does not match the deserializer "
                                     f"for this consumer instance ({instance_format})")
    return instance_format


async def records(request: web.Request) -> web.Response:
    """GET .../records?timeout=&max_bytes=: `[{"topic", "key", "value", "partition", "offset"}]`."""
    node = node_of(request)
    view = await _view(request)
    fmt = _embedded(request, view["config"]["format"])
    wait_ms = _clamped(request, "timeout", view["config"]["request_timeout_ms"], group_limits.REQUEST_TIMEOUT_MS_MAX)
    max_bytes = _clamped(request, "max_bytes", MAX_BYTES_DEFAULT, MAX_BYTES_MAX)
    fetched = await bounded(node.instances.poll(view, max_bytes=max_bytes, wait_ms=wait_ms), "consumer records",
                            REQUEST_TIMEOUT_S + wait_ms / 1000)
    stored = sum(len(b) for p in fetched.partitions if p.result for _, _, b in p.result.batches)
    if stored > RENDER_INLINE_BYTES_MAX:
        rendered, positions = await asyncio.to_thread(_render, fetched, fmt, max_bytes)
    else:
        rendered, positions = _render(fetched, fmt, max_bytes)
    for tp, start in fetched.starts.items():
        positions.setdefault(tp, start)  # a read cancelled or failed: pin where it started
    known = {(p["topic"], p["partition"]): p["offset"] for p in view["positions"]}
    moved = {tp: offset for tp, offset in positions.items() if known.get(tp) != offset}
    if request.transport is None or request.transport.is_closing():
        # The client is gone (aiohttp runs the handler on): its answer is lost, so the
        # positions stay where they were and the next GET reads these records again.
        # Saved, they would be skipped, and with auto-commit skipped for the whole group.
        _logger.info("instance_answer_lost", group=view["group"], instance=view["instance_id"])
        return reply(rendered, content_type=JSON_V2 if fmt == "json" else BINARY_V2)
    try:
        await bounded(node.instances.advance(view["group"], view["instance_id"], moved), "consumer positions")
    except ClientError as error:
        # The positions may or may not have moved (a coordinator change mid-write): answer
        # the records anyway. If they did not move, the next GET repeats them; answering
        # an error instead could skip them, should the write have landed.
        _logger.warning("instance_positions_not_saved", group=view["group"], instance=view["instance_id"],
                        error=str(error))
    return reply(rendered, content_type=JSON_V2 if fmt == "json" else BINARY_V2)


def _clamped(request: web.Request, name: str, default: int, high: int) -> int:
    """A records GET's `timeout` or `max_bytes`, as kafka-rest reads them: 0 or less
    (its default is -1) means the default, and more than the bound means the bound."""
    value = query_int(request, name, default)
    return default if value <= 0 else min(value, high)


def _render(fetched: MemberFetch, fmt: str, max_bytes: int) -> tuple[list[dict[str, Any]], dict[Any, int]]:
    """The records in Confluent's shape, at most `POLL_RECORDS_MAX` and `max_bytes` of keys
    and values (at least one record), and where each partition read goes on from: after
    its last record answered, else where its read started (which pins a position taken
    from `auto.offset.reset`, so records produced before the next GET are not skipped).
    A partition whose batches no limit cut goes on from its read's `next_offset`, past
    batches the read left out (duplicates, refused: the partition's skipped ranges)."""
    out: list[dict[str, Any]] = []
    positions: dict[Any, int] = {}
    size = 0
    full = False
    for part in fetched.partitions:
        if part.result is None:
            continue  # its error: the next GET reads it again from where it was
        position = positions[(part.topic, part.partition)] = part.offset
        for base, _count, batch in part.result.batches if not full else ():
            start = max(0, position - base)
            decoded = decode_columns(batch, start, start + POLL_RECORDS_MAX - len(out))
            for i in range(len(decoded.keys)):
                key, value = decoded.keys[i], decoded.values[i]
                size += len(key or b"") + len(value or b"")
                if out and size > max_bytes:
                    full = True
                    break
                out.append({"topic": part.topic, "key": _field(key, fmt), "value": _field(value, fmt),
                            "partition": part.partition, "offset": base + start + i})
                position = base + start + i + 1
            full = full or len(out) >= POLL_RECORDS_MAX
            if full:
                break
        if not full:
            position = max(position, part.result.next_offset)
        positions[(part.topic, part.partition)] = position
    return out, positions


def _field(data: bytes | None, fmt: str) -> Any:
    if data is None:
        return None
    if fmt == "binary":
        return base64.b64encode(data).decode()
    rendered = jsontext.stored_value(data)
    if rendered is not None:
        return rendered
    return data.decode("utf-8", "replace")  # stored by a non-JSON producer: as text
