"""Per-group Raft state and log digests, for the chaos runner's end-of-run checks.

Served by the HTTP edge under `/v1/debug/...` only when the node started with
`RAFTLOG_CHAOS_DEBUG=1` (multiraft/http/handlers/debug.py states the digest format).
Read here, next to the registry, so the edge never touches a runtime or a store.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, RouteNotFound
from raftlog.storage import CompactedError, UnavailableError
from raftlog.types import GroupId, Index

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry

DIGEST_ENTRY = struct.Struct(">QQBQII")
DIGEST_CHUNK_ENTRIES = 1024  # entries hashed between two yields to the event loop


def group_view(registry: GroupRegistry, group_id: GroupId) -> dict[str, Any]:
    """The Raft and log state of one group hosted here (partition fields null for group 0)."""
    core = registry.groups[group_id].core
    store = registry.stores[group_id]
    machine = registry.partitions.get(group_id)
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


async def log_digest(registry: GroupRegistry, node_id: int, group_id: GroupId, upto: int | None,
                     start: int = 1) -> dict[str, Any]:
    """The SHA-256 of a replica's entries `start`..`upto` (default: 1 to its commit index).
    A log that begins at a start point (a mirror partition's, a compacted log) holds no
    entry 1: its replicas are compared from the first index they all hold."""
    runtime, store = registry.groups.get(group_id), registry.stores.get(group_id)
    if runtime is None or store is None:
        raise RouteNotFound(f"group {group_id} has no replica on node {node_id}")
    commit = runtime.core.commit_index
    upto = commit if upto is None else upto
    last = store.last_index()
    if upto > last:
        raise InvalidRequest(f"upto {upto} is beyond this replica's last index {last}")
    if upto >= start and store.first_index() > start:
        raise InvalidRequest(f"entries below index {store.first_index()} were compacted away here: "
                             f"no digest from index {start}")
    hashed = hashlib.sha256()
    for low in range(start, upto + 1, DIGEST_CHUNK_ENTRIES):
        if registry.stores.get(group_id) is not store:
            raise RouteNotFound(f"group {group_id} was closed on node {node_id} while hashing")
        high = min(low + DIGEST_CHUNK_ENTRIES, upto + 1)
        try:
            for info, payload in store.frames(Index(low), Index(high)):
                hashed.update(DIGEST_ENTRY.pack(info.index, info.term, info.kind, info.base_offset,
                                                info.record_count, len(payload)))
                hashed.update(payload)
        except (CompactedError, UnavailableError) as error:
            raise InvalidRequest(f"the log changed while hashing ({error}); ask again") from None
        await asyncio.sleep(0)  # a long log must not stall the node's groups
    return {
        "node_id": node_id, "group_id": group_id, "from": start, "upto": upto, "commit_index": commit,
        "last_index": last, "committed": upto <= commit, "sha256": hashed.hexdigest(),
    }
