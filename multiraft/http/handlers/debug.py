"""GET /v1/debug/...: per-group Raft state and log digests for the chaos runner's end-of-run checks.

Served only when the node started with `RAFTLOG_CHAOS_DEBUG=1` (multiraft/node/unsafe.py);
otherwise the routes do not exist (404 NOT_FOUND). Not part of the public API, so
not in the OpenAPI document: the runner alone reads them.

The digest lets the runner compare replicas' committed prefixes byte for byte
without moving the logs: ask every replica for `upto=min(commit_index)` and
compare the hashes. Each entry i in 1..upto contributes, in order,
`DIGEST_ENTRY` = (index u64, term u64, kind u8, base_offset u64, record_count
u32, payload length u32), big-endian, then its payload. The offsets are in it
because they are stored (in the frame header): two replicas that agree on the
entries but number records differently must not compare equal.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import struct
from typing import TYPE_CHECKING, Any

from aiohttp import web

from multiraft.errors import InvalidRequest, RouteNotFound
from multiraft.http.handlers.common import node_of
from raftlog.storage import CompactedError, UnavailableError
from raftlog.types import GroupId, Index

if TYPE_CHECKING:
    from multiraft.node.node import Node

DIGEST_ENTRY = struct.Struct(">QQBQII")
DIGEST_CHUNK_ENTRIES = 1024  # entries hashed between two yields to the event loop
_INTEGER = re.compile(r"[0-9]{1,18}")  # up to 10**18 - 1: inside u64, no big-number parsing


async def groups(request: web.Request) -> web.Response:
    node = node_of(request)
    return web.json_response({"node_id": node.id, "groups": [group_view(node, g) for g in sorted(node.groups)]})


def group_view(node: Node, group_id: GroupId) -> dict[str, Any]:
    """The Raft and log state of one group hosted here (partition fields null for group 0)."""
    core = node.groups[group_id].core
    store = node.stores[group_id]
    machine = node.partitions.get(group_id)
    view: dict[str, Any] = {
        "group_id": group_id, "topic": None, "partition": None,
        "role": core.role.value, "term": core.term, "vote": core.vote or None, "leader": core.leader or None,
        "commit_index": core.commit_index, "applied_index": core.applied_index,
        "log_start_index": store.first_index(), "last_index": store.last_index(),
        "voters": sorted(core.membership.voters), "learners": sorted(core.membership.learners),
        "needs_repair": core.needs_repair,
        "high_watermark": None, "log_start_offset": None, "log_end_offset": None, "skipped_ranges": None,
    }
    if machine is not None:
        state = machine.state
        view.update(
            topic=state.topic, partition=state.partition, high_watermark=int(state.high_watermark),
            log_start_offset=int(store.log_start_offset), log_end_offset=int(store.log_end_offset),
            skipped_ranges=[[int(base), count] for base, count in state.skipped_ranges],
        )
    return view


async def digest(request: web.Request) -> web.Response:
    node = node_of(request)
    text = request.match_info["group_id"]
    if not _INTEGER.fullmatch(text):
        raise InvalidRequest("group_id is a non-negative integer")
    group_id = GroupId(int(text))
    runtime, store = node.groups.get(group_id), node.stores.get(group_id)
    if runtime is None or store is None:
        raise RouteNotFound(f"group {group_id} has no replica on node {node.id}")
    commit = runtime.core.commit_index
    upto = _upto(request.query.get("upto"), commit)
    last = store.last_index()
    if upto > last:
        raise InvalidRequest(f"upto {upto} is beyond this replica's last index {last}")
    if upto > 0 and store.first_index() > 1:
        raise InvalidRequest(f"entries below index {store.first_index()} were compacted away here: "
                             "no digest from index 1")
    hashed = hashlib.sha256()
    for low in range(1, upto + 1, DIGEST_CHUNK_ENTRIES):
        if node.stores.get(group_id) is not store:
            raise RouteNotFound(f"group {group_id} was closed on node {node.id} while hashing")
        high = min(low + DIGEST_CHUNK_ENTRIES, upto + 1)
        try:
            for info, payload in store.frames(Index(low), Index(high)):
                hashed.update(DIGEST_ENTRY.pack(info.index, info.term, info.kind, info.base_offset,
                                                info.record_count, len(payload)))
                hashed.update(payload)
        except (CompactedError, UnavailableError) as error:
            raise InvalidRequest(f"the log changed while hashing ({error}); ask again") from None
        await asyncio.sleep(0)  # a long log must not stall the node's groups
    return web.json_response({
        "node_id": node.id, "group_id": group_id, "upto": upto, "commit_index": commit,
        "last_index": last, "committed": upto <= commit, "sha256": hashed.hexdigest(),
    })


def _upto(text: str | None, commit: int) -> int:
    if text is None:
        return commit
    if not _INTEGER.fullmatch(text):
        raise InvalidRequest("upto is a non-negative integer (a Raft index)")
    return int(text)
