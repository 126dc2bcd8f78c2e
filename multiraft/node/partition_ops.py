"""Reads and consumer-offset operations on partitions, local or forwarded.

- `consume`: any replica serves reads up to its own applied high watermark
  (follower reads spread load); `isolation="uncommitted"` reads to the leader's
  log end (forwarded to the leader). With `wait_ms` a read at the high watermark
  waits (bounded) for new records. A node that hosts no replica forwards the read
  to one.
- `commit_offsets`: an offset commit is a META entry of the partition's own group,
  so it is ordered with the records it points at; proposed on the leader, which
  writes its wall clock into it (`committed_at_ms`, what retention reads:
  multiraft/node/offsets_retention.py).
- `fetch_offsets`: linearizable: the leader confirms its leadership (ReadIndex)
  and answers once it applied that far.
- `delete_group`: the group's offsets go from every partition holding them, one
  `offsets_delete` entry each, proposed by the partition's leader; one call per
  leader node carries all the partitions it leads.
Batches whose records the partition state skipped (a duplicate that raced its
original across a leadership change) are left out of every read.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, OffsetOutOfRange, UnknownGroup, UnknownTopic
from multiraft.node import replicas
from multiraft.node.offsets_retention import wall_clock_ms
from multiraft.state.consumer_offsets import OffsetCommit, OffsetsDelete, encode_meta
from multiraft.transport.remote_errors import error_from_body
from multiraft.transport.rpc import (
    RPC_TIMEOUT_S,
    RemoteError,
    RpcError,
    RpcOutcomeUnknown,
    answer,
    error_answer,
)
from raftlog.errors import LeaderNotAvailable, NotLeader, OutcomeUnknown
from raftlog.messages import EntryKind, Role
from raftlog.types import GroupId, Offset
from storage.errors import CorruptionError, OffsetOutOfRangeError
from storage.offsets import StoredBatch, read_records

if TYPE_CHECKING:
    from multiraft.node.node import Node

WAIT_MS_MAX = 30_000
MAX_BYTES_MAX = 64 * 1024 * 1024
MAX_RECORDS_MAX = 100_000
# A read answered over the transport fits one frame (16 MiB): a forwarded read asks for
# at most this much, and the reader continues from the answer's next offset, as a Kafka
# fetch bounded by fetch.max.bytes does. One batch larger than this still comes whole.
FORWARDED_READ_BYTES_MAX = 8 * 1024 * 1024
# Partitions one node deletes a group from at once (each a ReadIndex or a proposal at most).
DELETES_IN_FLIGHT_MAX = 64
_LENGTH = struct.Struct(">I")
_GROUP = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    batches: list[tuple[int, int, bytes]]  # (base offset, record count, batch bytes)
    next_offset: int
    high_watermark: int
    log_start_offset: int


def _check_read_limits(offset: int, max_records: int, max_bytes: int, wait_ms: int, isolation: str) -> None:
    if offset < 0:
        raise InvalidRequest("offset must not be negative")
    if not 1 <= max_records <= MAX_RECORDS_MAX:
        raise InvalidRequest(f"max_records must be 1..{MAX_RECORDS_MAX}")
    if not 1 <= max_bytes <= MAX_BYTES_MAX:
        raise InvalidRequest(f"max_bytes must be 1..{MAX_BYTES_MAX}")
    if not 0 <= wait_ms <= WAIT_MS_MAX:
        raise InvalidRequest(f"wait_ms must be 0..{WAIT_MS_MAX}")
    if isolation not in ("committed", "uncommitted"):
        raise InvalidRequest("isolation is committed or uncommitted")


async def consume(
    node: Node, topic: str, partition: int, offset: int, *,
    max_records: int = 1000, max_bytes: int = 1 << 20, wait_ms: int = 0, isolation: str = "committed",
) -> ConsumeResult:
    _check_read_limits(offset, max_records, max_bytes, wait_ms, isolation)
    group_id = node.partition_group(topic, partition)
    if isolation == "uncommitted":
        # Up to the leader's log end, which a follower's own log may not reach yet.
        leader = node.leader_of(group_id)
        if not leader:
            raise LeaderNotAvailable("no leader known for the partition; an uncommitted read needs it, retry")
        if leader != node.id:
            return await _read_remote(node, leader, group_id, offset, max_records, max_bytes, wait_ms, isolation)
    if group_id in node.partitions:
        return await _consume_local(node, group_id, offset, max_records, max_bytes, wait_ms, isolation)
    replicas = node.catalog.topic(topic).partitions[partition].replicas
    if node.id in replicas:
        # Our replica is closed for a moment (reopening after a storage failure, or not
        # opened yet). Forwarding would answer from another replica, which may lag what
        # ours served: a reader would see this server's high watermark go back (chaos:
        # nonmonotonic-hw, disk-full runs). Refused instead, retriable, as while re-applying.
        raise NotLeader(node.leader_of(group_id), "this node's replica of the partition is reopening; "
                        "retry or read from another replica")
    return await _read_remote(node, replicas[0], group_id, offset, max_records, max_bytes, wait_ms, isolation)


async def _read_remote(
    node: Node, target: int, group_id: GroupId, offset: int, max_records: int, max_bytes: int, wait_ms: int,
    isolation: str,
) -> ConsumeResult:
    request = {"group": group_id, "offset": offset, "max_records": max_records,
               "max_bytes": min(max_bytes, FORWARDED_READ_BYTES_MAX), "wait_ms": wait_ms, "isolation": isolation}
    answer = await _call(node, target, "partition.read", json.dumps(request).encode(), RPC_TIMEOUT_S + wait_ms / 1000)
    return _decode_read(answer)


async def _consume_local(
    node: Node, group_id: GroupId, offset: int, max_records: int, max_bytes: int, wait_ms: int, isolation: str
) -> ConsumeResult:
    machine = node.partitions[group_id]
    store = node.stores[group_id]
    runtime = node.groups[group_id]
    if runtime.core.applied_index < runtime.replay_until:
        raise NotLeader(runtime.core.leader, "this replica is still re-applying its log after a restart; "
                        "read from another replica or retry")
    end = _end_offset(node, group_id, isolation)
    if end <= offset <= store.log_end_offset:
        # At or past the high watermark but inside this replica's log (Kafka's rule: only
        # past the log end is out of range): nothing to read yet. A replica learns the
        # commit a little after the leader, so a reader here may be a few ms ahead of it.
        if wait_ms > 0:
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    while offset >= _end_offset(node, group_id, isolation):
                        await machine.wait_for_change()
            except TimeoutError:
                pass
            end = _end_offset(node, group_id, isolation)
        if offset >= end:
            hw = machine.state.high_watermark
            return ConsumeResult([], offset, hw, int(store.log_start_offset))
    try:
        result = read_records(store, Offset(offset), end_offset=Offset(end), max_records=max_records, max_bytes=max_bytes)
    except OffsetOutOfRangeError:
        start = store.log_start_offset
        raise OffsetOutOfRange(
            f"offset {offset} is outside [{start}, {end}]", int(start), machine.state.high_watermark
        ) from None
    except CorruptionError as error:  # this replica's copy is damaged: never a 500, never bad data
        node.logger.error("read_hit_corruption", group_id=group_id, offset=offset, error=str(error))
        replicas.report_damage(node, group_id)
        raise NotLeader(runtime.core.leader, "this replica's log is damaged at that offset; "
                        "read from another replica") from None
    skipped = set(machine.state.skipped_between(Offset(offset), Offset(end)))
    batches = [_batch(b) for b in result.batches if (b.base_offset, b.record_count) not in skipped]
    last = result.batches[-1] if result.batches else None
    next_offset = last.base_offset + last.record_count if last is not None else offset
    return ConsumeResult(batches, int(next_offset), machine.state.high_watermark, int(result.log_start_offset))


def _batch(stored: StoredBatch) -> tuple[int, int, bytes]:
    return int(stored.base_offset), stored.record_count, bytes(stored.payload)


def _end_offset(node: Node, group_id: GroupId, isolation: str) -> int:
    machine, store = node.partitions.get(group_id), node.stores.get(group_id)
    if machine is None or store is None:  # closed while a read waited (topic deleted, replica moved)
        raise UnknownTopic("the partition is no longer on this node (its topic was deleted or it moved)")
    if isolation == "uncommitted" or node.hooks.read_uncommitted:  # the latter: a chaos control only
        return int(store.log_end_offset)
    return int(machine.state.high_watermark)


def _encode_read(result: ConsumeResult) -> bytes:
    head = json.dumps({
        "next_offset": result.next_offset, "high_watermark": result.high_watermark,
        "log_start_offset": result.log_start_offset, "batches": [[b, n, len(d)] for b, n, d in result.batches],
    }).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *(d for _, _, d in result.batches)])


def _decode_read(body: bytes) -> ConsumeResult:
    (length,) = _LENGTH.unpack_from(body)
    head = json.loads(body[_LENGTH.size : _LENGTH.size + length])
    position = _LENGTH.size + length
    batches = []
    for base, count, size in head["batches"]:
        batches.append((base, count, body[position : position + size]))
        position += size
    return ConsumeResult(batches, head["next_offset"], head["high_watermark"], head["log_start_offset"])


async def commit_offsets(node: Node, group: str, commits: list[OffsetCommit]) -> None:
    """Commit each partition's offset through that partition's group (its leader)."""
    for commit in commits:
        if commit.group != group:
            raise InvalidRequest("every commit names the same consumer group")
        group_id = node.partition_group(commit.topic, commit.partition)
        runtime = node.groups.get(group_id)
        if runtime is not None and runtime.core.role is Role.LEADER:
            await _commit_local(node, group_id, commit)
            continue
        leader = node.forward_target(group_id, node.catalog.topic(commit.topic).partitions[commit.partition].replicas)
        await _call(node, leader, "partition.commit_offset", _GROUP.pack(group_id) + encode_meta(commit), RPC_TIMEOUT_S,
                    write=True)


async def _commit_local(node: Node, group_id: GroupId, commit: OffsetCommit) -> None:
    commit = replace(commit, committed_at_ms=wall_clock_ms())  # the leader's time, whoever forwarded it
    node.partitions[group_id].state.check_commit(commit)
    (result,) = await node.groups[group_id].propose([encode_meta(commit)], EntryKind.META)
    if result.error is not None:
        raise result.error


async def fetch_offsets(node: Node, group: str, topic: str) -> list[dict[str, Any]]:
    """The group's committed offsets for every partition of `topic` (linearizable)."""
    info = node.catalog.topic(topic)
    found = []
    for partition in info.partitions:
        runtime = node.groups.get(partition.group_id)
        if runtime is not None and runtime.core.role is Role.LEADER:
            committed = await _fetch_local(node, partition.group_id, group)
        else:
            leader = node.forward_target(partition.group_id, partition.replicas)
            body = await _call(node, leader, "partition.fetch_offset",
                               json.dumps({"group_id": partition.group_id, "group": group}).encode(), RPC_TIMEOUT_S)
            committed = json.loads(body)
        if committed is not None:
            found.append({"topic": topic, "partition": partition.partition, **committed})
    return found


async def _fetch_local(node: Node, group_id: GroupId, group: str) -> dict[str, Any] | None:
    await node.groups[group_id].read_index()  # still the leader, and applied that far
    committed = node.partitions[group_id].state.committed_offset(group)
    return None if committed is None else {"offset": committed.offset, "metadata": committed.metadata}


async def delete_group(node: Node, group: str) -> int:
    """Remove `group`'s committed offsets from every partition of every topic that holds
    them; the number of partitions it was removed from. `UnknownGroup` when none did.

    Kafka's DeleteGroups. Each partition's leader decides from its own applied state
    (caught up first), so a partition that never held the group gets no entry. A
    partition without a known leader fails the call (LEADER_NOT_AVAILABLE, retriable)
    before anything is removed: without it nobody can say whether it holds the group.
    """
    by_leader: dict[int, list[int]] = {}
    for name in sorted(node.catalog.topics):
        for partition in node.catalog.topics[name].partitions:
            leader = _leader_for(node, partition.group_id, partition.replicas)
            by_leader.setdefault(leader, []).append(partition.group_id)
    outcomes = await asyncio.gather(
        *(_delete_on(node, leader, group, ids) for leader, ids in sorted(by_leader.items())), return_exceptions=True
    )
    removed = 0
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome  # the others ran to their end: a retry finishes the job
        removed += outcome
    if not removed:
        raise UnknownGroup(f"no partition keeps offsets for consumer group {group!r}")
    return removed


def _leader_for(node: Node, group_id: GroupId, replicas: tuple[int, ...]) -> int:
    runtime = node.groups.get(group_id)
    if runtime is not None and runtime.core.role is Role.LEADER:
        return node.id
    leader = node.forward_target(group_id, replicas)
    if leader == 0:
        raise LeaderNotAvailable(f"partition group {group_id} has no leader yet; retry")
    return leader


async def _delete_on(node: Node, leader: int, group: str, group_ids: list[int]) -> int:
    if leader == node.id:
        return await delete_local(node, group, group_ids)
    body = json.dumps({"group": group, "group_ids": group_ids}).encode()
    answer = await _call(node, leader, "partition.delete_group", body, RPC_TIMEOUT_S, write=True)
    return int(json.loads(answer)["removed"])


async def delete_local(node: Node, group: str, group_ids: list[int]) -> int:
    """Delete `group` from each of these partitions led here; how many held it."""
    slots = asyncio.Semaphore(DELETES_IN_FLIGHT_MAX)

    async def one(group_id: GroupId) -> bool:
        async with slots:
            return await _delete_in_partition(node, group_id, group)

    outcomes = await asyncio.gather(*(one(GroupId(g)) for g in group_ids), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return sum(1 for outcome in outcomes if outcome)


async def _delete_in_partition(node: Node, group_id: GroupId, group: str) -> bool:
    runtime = node.groups.get(group_id)
    if runtime is None or runtime.core.role is not Role.LEADER:
        raise NotLeader(runtime.core.leader if runtime else 0, "this node no longer leads the partition")
    core = runtime.core
    if core.applied_index < core.commit_index or core.log.term_or_none(core.commit_index) != core.term:
        await runtime.read_index()  # a new leader: applied state may lag what was committed before
    if node.partitions[group_id].state.committed_offset(group) is None:
        return False  # nothing to delete here: no entry
    (result,) = await runtime.propose([encode_meta(OffsetsDelete(group=group))], EntryKind.META)
    if isinstance(result.error, UnknownGroup):
        return False  # another delete (or the retention pass) took it first
    if result.error is not None:
        raise result.error
    return True


async def _call(node: Node, peer: int, method: str, body: bytes, timeout_s: float, *, write: bool = False) -> bytes:
    """Forward to `peer`. A write whose answer never came may have happened: OUTCOME_UNKNOWN.
    A read may simply be retried: NOT_LEADER (retriable) either way; LEADER_NOT_AVAILABLE with no peer."""
    if peer == 0:
        raise LeaderNotAvailable("no leader known for this partition yet")
    assert node.rpc is not None
    try:
        return await node.rpc.call(peer, method, body, timeout_s)
    except RemoteError as error:
        raise error_from_body(error.body) from None
    except RpcOutcomeUnknown as error:
        if write:
            raise OutcomeUnknown(f"forwarded to node {peer}, no answer: {error}") from None
        raise NotLeader(peer, f"forwarding to node {peer} failed: {error}") from None
    except RpcError as error:
        raise NotLeader(peer, f"forwarding to node {peer} failed: {error}") from None


# -- RPC handlers (registered by the node) ---------------------------------------


async def serve_read(node: Node, source: int, body: bytes) -> tuple[int, bytes]:
    request = json.loads(body)
    group_id = GroupId(request["group"])
    if group_id not in node.partitions:
        return error_answer(NotLeader(0, "this node hosts no replica of the partition"))
    _check_read_limits(request["offset"], request["max_records"], request["max_bytes"], request["wait_ms"],
                       request["isolation"])
    max_bytes = min(request["max_bytes"], FORWARDED_READ_BYTES_MAX)  # whatever an older peer asks
    return await answer(_consume_local(node, group_id, request["offset"], request["max_records"],
                                        max_bytes, request["wait_ms"], request["isolation"]), _encode_read)


async def serve_commit(node: Node, source: int, body: bytes) -> tuple[int, bytes]:
    from multiraft.state.consumer_offsets import decode_meta

    (group_id,) = _GROUP.unpack_from(body)
    runtime = node.groups.get(GroupId(group_id))
    if runtime is None or runtime.core.role is not Role.LEADER:
        return error_answer(NotLeader(runtime.core.leader if runtime else 0))
    commit = decode_meta(body[_GROUP.size :])
    if not isinstance(commit, OffsetCommit):
        return error_answer(InvalidRequest("partition.commit_offset carries an offset commit"))
    return await answer(_commit_local(node, GroupId(group_id), commit), lambda _: b"{}")


async def serve_fetch(node: Node, source: int, body: bytes) -> tuple[int, bytes]:
    request = json.loads(body)
    group_id = GroupId(request["group_id"])
    runtime = node.groups.get(group_id)
    if runtime is None or runtime.core.role is not Role.LEADER:
        return error_answer(NotLeader(runtime.core.leader if runtime else 0))
    return await answer(_fetch_local(node, group_id, request["group"]), lambda value: json.dumps(value).encode())


async def serve_delete_group(node: Node, source: int, body: bytes) -> tuple[int, bytes]:
    async def work() -> int:
        request = json.loads(body)
        group, group_ids = request["group"], request["group_ids"]
        OffsetsDelete(group=group)  # validates the name (InvalidRequest)
        if not isinstance(group_ids, list) or not all(type(g) is int for g in group_ids):
            raise InvalidRequest("partition.delete_group takes a list of group ids")
        return await delete_local(node, group, group_ids)

    return await answer(work(), lambda removed: json.dumps({"removed": removed}).encode())
