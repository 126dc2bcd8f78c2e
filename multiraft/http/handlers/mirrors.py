"""Mirror links (issue 24, docs/mirror.md): admin routes on the sink, and the source's log read.

On the sink (admin): create a link, list links, one link's status (discovery and every
mirror partition's pull), pause, resume, alter (`on_source_truncated`: what a mirror
partition does when the source's retention deleted offsets it had not copied), delete,
promote one mirror topic. A link's
token is stored for the sink to present to the source and never shown back
(`credentials: true` says one is set). A link to a source serving HTTPS says
`source_tls: true`, with `source_ca` (PEM CA certificates) or without (the system's
trust store); the bundle is loaded with this node's OpenSSL before the link is proposed,
so one OpenSSL refuses is a 400 here, not a link failing later.

The full sync (docs/mirror.md): `POST /v1/admin/mirrors/{name}/verify` on the sink
(admin); on the source (`read` on the topic) a partition's tictac tree,
`GET /v1/topics/{topic}/partitions/{p}/tree` and `.../tree/nodes`.

On the source (`read` on the topic): `GET /v1/topics/{topic}/partitions/{p}/log`, the
committed batches as stored, framed as the binary consume answer (base offset i64,
length u32, batch), the skipped ones included and named in `Raftlog-Skipped`
(`base:count,...`); below the log start it answers no batches, and the log start, so
a mirror learns where the source's log now begins.
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.limits import BATCH_CONTENT_TYPE, REQUEST_TIMEOUT_S
from multiraft.http.params import int_field, json_object, path_partition, query_int, query_str
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    LinkState,
    OnSourceTruncated,
    SetMirrorLinkPolicy,
    check_link_name,
)
from multiraft.metadata.patterns import TOPIC_NAME_PATTERN
from multiraft.metadata.record_filter import parse_record_filter
from multiraft.net.tls import TlsError, source_context
from multiraft.node.api import MAX_BYTES_MAX, TREE_LEVEL_MAX, TREE_POSITIONS_MAX, WAIT_MS_MAX

CREATE_FIELDS = {"name", "sources", "topics", "priority", "token", "verify_interval_s", "source_tls", "source_ca",
                 "on_source_truncated", "record_filter"}
ALTER_FIELDS = {"on_source_truncated"}
VERIFY_FIELDS = {"topic", "start", "repair", "deep"}
VERIFY_TIMEOUT_S = 150.0  # up to 16 partitions, none started after 10 s, each two reads of its span
TREE_TIMEOUT_S = 60.0  # a tree call reads the partition's span first
POSITION_DIGITS_MAX = 18  # below 2**63 whatever the digits
SKIPPED_NAMED_MAX = 256  # skipped batches named in one answer's header (the answer stops before more)


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    check_link_name(name)
    return name


async def create(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_object(request)
    if not {"name", "sources", "topics"} <= set(body) <= CREATE_FIELDS:
        raise InvalidRequest('body is {"name", "sources": ["HOST:PORT", ...], "topics": PATTERN, '
                             '"priority"?: "high"|"normal"|"low", "token"?: TOKEN, "verify_interval_s"?: SECONDS, '
                             '"source_tls"?: true|false, "source_ca"?: PEM, "on_source_truncated"?: "stop"|"resync", '
                             '"record_filter"?: [{"key_prefix": P} | {"header": N, "value"?: V}, ...]}')
    sources = body["sources"]
    command = CreateMirrorLink(name=body["name"], sources=tuple(sources) if isinstance(sources, list) else sources,
                               pattern=body["topics"], priority=body.get("priority", "normal"),
                               token=body.get("token"), verify_interval_s=body.get("verify_interval_s"),
                               source_tls=body.get("source_tls", False), source_ca=body.get("source_ca"),
                               on_source_truncated=body.get("on_source_truncated", OnSourceTruncated.STOP.value),
                               record_filter=parse_record_filter(body["record_filter"]) if "record_filter" in body
                               else None)
    if command.source_ca is not None:  # its shape is checked (the command); now this node's OpenSSL
        try:
            source_context(command.source_ca)
        except TlsError as error:
            raise InvalidRequest(str(error)) from None
    link = await bounded(node.mirrors.create(command), "mirror link creation")
    return web.json_response(link, status=201)


async def list_links(request: web.Request) -> web.Response:
    return web.json_response({"mirrors": node_of(request).mirrors.links()})


async def status(request: web.Request) -> web.Response:
    node = node_of(request)
    name = _name(request)
    return web.json_response(await bounded(node.mirrors.status(name), "mirror status"))


async def pause(request: web.Request) -> web.Response:
    return await _set_state(request, LinkState.PAUSED)


async def resume(request: web.Request) -> web.Response:
    return await _set_state(request, LinkState.RUNNING)


async def _set_state(request: web.Request, state: LinkState) -> web.Response:
    node = node_of(request)
    name = _name(request)
    return web.json_response(await bounded(node.mirrors.set_state(name, state), f"mirror link {state.value}"))


async def alter(request: web.Request) -> web.Response:
    """Change a link's settings that may change in place: `on_source_truncated`."""
    node = node_of(request)
    name = _name(request)
    body = await json_object(request)
    if "record_filter" in body:
        raise InvalidRequest("a link's record_filter is fixed: it decides what its mirrors hold; for another "
                             "filter create a new link (docs/mirror.md, \"Record filters\")")
    if not body or not set(body) <= ALTER_FIELDS:
        raise InvalidRequest('body is {"on_source_truncated": "stop"|"resync"}')
    command = SetMirrorLinkPolicy(name=name, on_source_truncated=body["on_source_truncated"])
    return web.json_response(await bounded(node.mirrors.alter(command), "mirror link change"))


async def delete(request: web.Request) -> web.Response:
    node = node_of(request)
    await bounded(node.mirrors.delete(_name(request)), "mirror link deletion")
    return web.Response(status=204)


async def promote(request: web.Request) -> web.Response:
    node = node_of(request)
    name = _name(request)
    body = await json_object(request)
    topic = body.get("topic")
    if set(body) != {"topic"} or not isinstance(topic, str) or not TOPIC_NAME_PATTERN.fullmatch(topic):
        raise InvalidRequest('body is {"topic": TOPIC}')
    return web.json_response(await bounded(node.mirrors.promote(name, topic), "mirror promotion"))


async def verify(request: web.Request) -> web.Response:
    """The full sync (docs/mirror.md): up to 16 of the link's mirror partitions (of `topic`, or
    all) from `start` on, each compared with the source by its sink leader; a different one is
    resynced unless `repair` is false. `next_start`: where the next call goes on (null: done)."""
    node = node_of(request)
    name = _name(request)
    body = await json_object(request, required=False)
    unknown = set(body) - VERIFY_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(unknown))}")
    topic = body.get("topic")
    if topic is not None and (not isinstance(topic, str) or not TOPIC_NAME_PATTERN.fullmatch(topic)):
        raise InvalidRequest("topic is a topic name")
    repair, deep = body.get("repair", True), body.get("deep", False)
    if not isinstance(repair, bool) or not isinstance(deep, bool):
        raise InvalidRequest("repair and deep are true or false")
    start = int_field(body, "start", 0, low=0, high=2**53)
    report = await bounded(node.mirrors.verify(name, topic, start, repair=repair, deep=deep), "mirror verify",
                           VERIFY_TIMEOUT_S)
    return web.json_response(report.to_json())


async def tree(request: web.Request) -> web.Response:
    """A source's tree of one partition over `[lo, hi)` cut to what the answering replica holds;
    `deep=true`: read every segment of it (a deep mirror verify), not closed segments' sidecars."""
    node = node_of(request)
    topic, partition = request.match_info["topic"], path_partition(request)
    lo = query_int(request, "lo", 0, low=0, high=2**63 - 1)
    hi = query_int(request, "hi", 2**63 - 1, low=0, high=2**63 - 1)
    deep = query_str(request, "deep", "false", ("true", "false")) == "true"
    answer = await bounded(node.partition_tree(topic, partition, lo, hi, deep), "partition tree", TREE_TIMEOUT_S)
    return web.json_response(answer)


async def tree_nodes(request: web.Request) -> web.Response:
    """Digests of the tree the tree call built: `level` (0: the leaves), `positions` (comma-separated)."""
    node = node_of(request)
    topic, partition = request.match_info["topic"], path_partition(request)
    lo = query_int(request, "lo", low=0, high=2**63 - 1)
    hi = query_int(request, "hi", low=0, high=2**63 - 1)
    level = query_int(request, "level", low=0, high=TREE_LEVEL_MAX)
    raw = request.query.get("positions", "")
    parts = raw.split(",")
    if not raw or len(parts) > TREE_POSITIONS_MAX or not all(
            p.isascii() and p.isdigit() and len(p) <= POSITION_DIGITS_MAX for p in parts):
        raise InvalidRequest(f"positions: 1..{TREE_POSITIONS_MAX} comma-separated node positions")
    digests = await bounded(node.partition_tree_nodes(topic, partition, lo, hi, level, [int(p) for p in parts]),
                            "partition tree nodes", TREE_TIMEOUT_S)
    return web.json_response({"digests": digests})


async def read_log(request: web.Request) -> web.StreamResponse:
    """The source side of a mirror: stored batches from `offset`, skipped ones named."""
    node = node_of(request)
    topic = request.match_info["topic"]
    partition = path_partition(request)
    offset = query_int(request, "offset", low=0, high=2**63 - 1)
    max_bytes = query_int(request, "max_bytes", 1 << 20, low=1, high=MAX_BYTES_MAX)
    wait_ms = query_int(request, "wait_ms", 0, low=0, high=WAIT_MS_MAX)
    node.partition_group(topic, partition)  # 404 for an unknown topic or partition
    result = await bounded(node.consume(topic, partition, offset, max_records=100_000, max_bytes=max_bytes,
                                        wait_ms=wait_ms, keep_skipped=True),
                           "mirror read", REQUEST_TIMEOUT_S + wait_ms / 1000)
    batches, skipped, next_offset = result.batches, result.skipped, result.next_offset
    if len(skipped) > SKIPPED_NAMED_MAX:  # stop before the first batch whose skip cannot be named
        cut = skipped[SKIPPED_NAMED_MAX][0]
        batches = [b for b in batches if b[0] < cut]
        skipped, next_offset = skipped[:SKIPPED_NAMED_MAX], cut
    response = web.StreamResponse(headers={
        "Content-Type": BATCH_CONTENT_TYPE,
        "Raftlog-Next-Offset": str(next_offset),
        "Raftlog-High-Watermark": str(result.high_watermark),
        "Raftlog-Log-Start-Offset": str(result.log_start_offset),
        "Raftlog-Skipped": ",".join(f"{base}:{count}" for base, count in skipped),
    })
    response.content_length = sum(12 + len(b) for _, _, b in batches)
    await response.prepare(request)
    for base, _count, batch in batches:
        await response.write(base.to_bytes(8, "big", signed=True) + len(batch).to_bytes(4, "big"))
        await response.write(batch)
    await response.write_eof()
    return response
