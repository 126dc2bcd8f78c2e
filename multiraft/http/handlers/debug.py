"""GET /v1/debug/...: per-group Raft state and log digests for the chaos runner's end-of-run checks.

Served only when the node started with `RAFTLOG_CHAOS_DEBUG=1` (multiraft/node/unsafe.py);
otherwise the routes do not exist (404 NOT_FOUND). Not part of the public API, so
not in the OpenAPI document: the runner alone reads them.

The digest lets the runner compare replicas' committed prefixes byte for byte
without moving the logs: ask every replica for `upto=min(commit_index)` and
compare the hashes (`from`, default 1: the first index hashed, for logs that begin
at a start point, as a mirror partition's does). Each entry i in from..upto contributes, in order,
`DIGEST_ENTRY` = (index u64, term u64, kind u8, base_offset u64, record_count
u32, payload length u32), big-endian, then its payload. The offsets are in it
because they are stored (in the frame header): two replicas that agree on the
entries but number records differently must not compare equal. The node computes
both answers (multiraft/node/debug_views.py); this module parses and routes.
"""

from __future__ import annotations

import re

from aiohttp import web

from multiraft.errors import InvalidRequest, RouteNotFound
from multiraft.http.handlers.common import node_of
from raftlog.types import GroupId

_INTEGER = re.compile(r"[0-9]{1,18}")  # up to 10**18 - 1: inside u64, no big-number parsing


async def groups(request: web.Request) -> web.Response:
    node = node_of(request)
    return web.json_response({"node_id": node.id, "groups": node.debug_groups()})


async def digest(request: web.Request) -> web.Response:
    node = node_of(request)
    text = request.match_info["group_id"]
    if not _INTEGER.fullmatch(text):
        raise InvalidRequest("group_id is a non-negative integer")
    group_id = GroupId(int(text))
    if node.group_status(group_id) is None:
        raise RouteNotFound(f"group {group_id} has no replica on node {node.id}")
    start = _index("from", request.query.get("from"))
    return web.json_response(await node.debug_digest(group_id, _index("upto", request.query.get("upto")),
                                                     1 if start is None else max(start, 1)))


def _index(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    if not _INTEGER.fullmatch(text):
        raise InvalidRequest(f"{name} is a non-negative integer (a Raft index)")
    return int(text)
