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
The end a read stops before is handed in (multiraft/node/faults.py: the high
watermark, or the log end for `isolation="uncommitted"`). Batches whose records the partition state skipped (a duplicate that raced its
original across a leadership change) and gap batches (a filtered mirror's: no records) are left
out of every read but a mirror's (`keep_skipped`).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, OffsetOutOfRange, Timeout, UnknownGroup, UnknownTopic
from multiraft.node.offsets_retention import wall_clock_ms
from multiraft.node.routing import call_peer
from multiraft.state.consumer_offsets import OffsetCommit, OffsetsDelete, decode_meta, encode_meta
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer, error_answer
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader, OutcomeUnknown
from raftlog.messages import EntryKind
from raftlog.types import GroupId, Offset
from storage.batch import is_gap
from storage.errors import CorruptionError, OffsetOutOfRangeError
from storage.offsets import StoredBatch, read_records

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.faults import ReadEnd
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing

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
    # With `keep_skipped` (a mirror's read, docs/mirror.md): the batches a plain read leaves
    # out are kept, and named here as (base offset, record count).
    skipped: tuple[tuple[int, int], ...] = ()


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


class PartitionOps:
    def __init__(self, routing: Routing, catalog: CatalogHolder, rpc: Rpc, read_end: ReadEnd,
                 report_damage: Callable[[GroupId], None], logger: Any) -> None:
        """`read_end`: where a read of a replica stops; `report_damage`: a read met a
        corrupt frame in this replica (multiraft/node/replicas.py reopens it)."""
        self.id = routing.id
        self._routing = routing
        self._registry: GroupRegistry = routing.registry
        self._catalog = catalog
        self._rpc = rpc
        self._read_end = read_end
        self._report_damage = report_damage
        self._logger = logger
        rpc.register("partition.read", self._serve_read)
        rpc.register("partition.commit_offset", self._serve_commit)
        rpc.register("partition.fetch_offset", self._serve_fetch)
        rpc.register("partition.delete_group", self._serve_delete_group)

    async def consume(
        self, topic: str, partition: int, offset: int, *,
        max_records: int = 1000, max_bytes: int = 1 << 20, wait_ms: int = 0, isolation: str = "committed",
        keep_skipped: bool = False,
    ) -> ConsumeResult:
        """`keep_skipped`: a mirror's read (docs/mirror.md): every stored batch, the skipped
        ones named in `skipped`; below the log start it answers no batches (and the log
        start) instead of OFFSET_OUT_OF_RANGE."""
        _check_read_limits(offset, max_records, max_bytes, wait_ms, isolation)
        group_id = self._catalog.partition_group(topic, partition)
        routing = self._routing
        if isolation == "uncommitted":
            # Up to the leader's log end, which a follower's own log may not reach yet.
            leader = routing.leader_of(group_id)
            if not leader:
                raise LeaderNotAvailable("no leader known for the partition; an uncommitted read needs it, retry")
            if leader != self.id:
                return await self._read_remote(leader, group_id, offset, max_records, max_bytes, wait_ms, isolation)
        if group_id in self._registry.partitions:
            return await self._consume_local(group_id, offset, max_records, max_bytes, wait_ms, isolation,
                                             keep_skipped)
        replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
        if self.id in replicas:
            # Our replica is closed for a moment (reopening after a storage failure, or not
            # opened yet). Forwarding would answer from another replica, which may lag what
            # ours served: a reader would see this server's high watermark go back (chaos:
            # nonmonotonic-hw, disk-full runs). Refused instead, retriable, as while re-applying.
            raise NotLeader(routing.leader_of(group_id), "this node's replica of the partition is reopening; "
                            "retry or read from another replica")
        return await self._read_remote(replicas[0], group_id, offset, max_records, max_bytes, wait_ms, isolation,
                                       keep_skipped)

    async def _read_remote(self, target: int, group_id: GroupId, offset: int, max_records: int, max_bytes: int,
                           wait_ms: int, isolation: str, keep_skipped: bool = False) -> ConsumeResult:
        request = {"group": group_id, "offset": offset, "max_records": max_records,
                   "max_bytes": min(max_bytes, FORWARDED_READ_BYTES_MAX), "wait_ms": wait_ms, "isolation": isolation}
        if keep_skipped:
            request["keep_skipped"] = True
        body = await self._call(target, "partition.read", json.dumps(request).encode(),
                                RPC_TIMEOUT_S + wait_ms / 1000)
        return _decode_read(body)

    async def _consume_local(self, group_id: GroupId, offset: int, max_records: int, max_bytes: int, wait_ms: int,
                             isolation: str, keep_skipped: bool = False) -> ConsumeResult:
        machine = self._registry.partitions[group_id]
        store = self._registry.stores[group_id]
        runtime = self._registry.groups[group_id]
        if runtime.core.applied_index < runtime.replay_until:
            raise NotLeader(runtime.core.leader, "this replica is still re-applying its log after a restart; "
                            "read from another replica or retry")
        if self.id not in runtime.core.membership.voters:
            # A copy that votes for nothing: a learner still catching up after a move (it
            # starts empty, high watermark 0), or one moved away and not yet deleted.
            # Served, a reader of this server would see its high watermark go back: it
            # answered this partition before, forwarded while it had no copy, or from a
            # copy moved off and now back (chaos, 5 nodes, move,kill,pause, seed 1:
            # nonmonotonic-hw, HW 3187 then 0 from n4#1). Refused, retriable, as while
            # re-applying. Once this node applied its promotion to voter, it applied
            # everything committed before the promotion was proposed.
            raise NotLeader(runtime.core.leader, "this replica is still catching up (not a voter of the "
                            "partition); read from another replica or retry")
        end = self._end_offset(group_id, isolation)
        if keep_skipped and offset < store.log_start_offset:  # a mirror learns where the source's log starts
            return ConsumeResult([], offset, machine.state.high_watermark, int(store.log_start_offset))
        if end <= offset <= store.log_end_offset:
            # At or past the high watermark but inside this replica's log (Kafka's rule: only
            # past the log end is out of range): nothing to read yet. A replica learns the
            # commit a little after the leader, so a reader here may be a few ms ahead of it.
            if wait_ms > 0:
                try:
                    async with asyncio.timeout(wait_ms / 1000):
                        while offset >= self._end_offset(group_id, isolation):
                            await machine.wait_for_change()
                except TimeoutError:
                    pass
                end = self._end_offset(group_id, isolation)
            if offset >= end:
                hw = machine.state.high_watermark
                return ConsumeResult([], offset, hw, int(store.log_start_offset))
        try:
            result = read_records(store, Offset(offset), end_offset=Offset(end), max_records=max_records,
                                  max_bytes=max_bytes)
        except OffsetOutOfRangeError:
            start = store.log_start_offset
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{start}, {end}]", int(start), machine.state.high_watermark
            ) from None
        except CorruptionError as error:  # this replica's copy is damaged: never a 500, never bad data
            self._logger.error("read_hit_corruption", group_id=group_id, offset=offset, error=str(error))
            self._report_damage(group_id)
            raise NotLeader(runtime.core.leader, "this replica's log is damaged at that offset; "
                            "read from another replica") from None
        last = result.batches[-1] if result.batches else None
        next_offset = last.base_offset + last.record_count if last is not None else offset
        skipped = skipped_batches(machine.state.skipped_between(Offset(offset), Offset(next_offset)),
                                  result.batches)
        if keep_skipped:
            return ConsumeResult([_batch(b) for b in result.batches], int(next_offset), machine.state.high_watermark,
                                 int(result.log_start_offset), tuple(sorted(skipped)))
        # A gap batch (a filtered mirror's, storage/batch.py FLAG_GAP) holds no records: left out as
        # the skipped ones are, a reader sees the next offset jump (as in a compacted topic).
        batches = [_batch(b) for b in result.batches
                   if (b.base_offset, b.record_count) not in skipped and not is_gap(b.payload)]
        return ConsumeResult(batches, int(next_offset), machine.state.high_watermark, int(result.log_start_offset))

    def _end_offset(self, group_id: GroupId, isolation: str) -> int:
        machine, store = self._registry.partitions.get(group_id), self._registry.stores.get(group_id)
        if machine is None or store is None:  # closed while a read waited (topic deleted, replica moved)
            raise UnknownTopic("the partition is no longer on this node (its topic was deleted or it moved)")
        return self._read_end(machine, store, isolation)

    async def commit_offsets(self, group: str, commits: list[OffsetCommit]) -> None:
        """Commit each partition's offset through that partition's group (its leader), one
        after another. A failure after some were written is OUTCOME_UNKNOWN, whatever
        the failure: its own code (NOT_LEADER, say) would tell the client that nothing
        happened (the chaos group workload read back an offset of a commit answered
        NOT_LEADER)."""
        if any(commit.group != group for commit in commits):
            raise InvalidRequest("every commit names the same consumer group")
        for done, commit in enumerate(commits):
            try:
                await self._commit_one(commit)
            except ClientError as error:
                if done == 0:
                    raise
                raise OutcomeUnknown(f"{done} of {len(commits)} offsets were committed, then "
                                     f"{commit.topic}/{commit.partition} failed ({error.code}: {error}); "
                                     "fetch the offsets to see where they stand") from error

    async def _commit_one(self, commit: OffsetCommit) -> None:
        group_id = self._catalog.partition_group(commit.topic, commit.partition)
        if self._registry.leading(group_id) is not None:
            await self._commit_local(group_id, commit)
            return
        replicas = self._catalog.catalog.topic(commit.topic).partitions[commit.partition].replicas
        leader = self._routing.forward_target(group_id, replicas)
        await self._call(leader, "partition.commit_offset", _GROUP.pack(group_id) + encode_meta(commit),
                         RPC_TIMEOUT_S, write=True)

    async def _commit_local(self, group_id: GroupId, commit: OffsetCommit) -> None:
        commit = replace(commit, committed_at_ms=wall_clock_ms())  # the leader's time, whoever forwarded it
        self._registry.partitions[group_id].state.check_commit(commit)
        try:  # bounded as a forwarded commit is (its caller gives up then): no dangling waits
            async with asyncio.timeout(RPC_TIMEOUT_S):
                (result,) = await self._registry.groups[group_id].propose([encode_meta(commit)], EntryKind.META)
        except TimeoutError:
            raise Timeout(f"the commit did not apply within {RPC_TIMEOUT_S} s; it may still") from None
        if result.error is not None:
            raise result.error

    async def fetch_offsets(self, group: str, topic: str) -> list[dict[str, Any]]:
        """The group's committed offsets for every partition of `topic` (linearizable)."""
        info = self._catalog.catalog.topic(topic)
        found = []
        for partition in info.partitions:
            if self._registry.leading(partition.group_id) is not None:
                committed = await self._fetch_local(partition.group_id, group)
            else:
                leader = self._routing.forward_target(partition.group_id, partition.replicas)
                request = json.dumps({"group_id": partition.group_id, "group": group}).encode()
                committed = json.loads(await self._call(leader, "partition.fetch_offset", request, RPC_TIMEOUT_S))
            if committed is not None:
                found.append({"topic": topic, "partition": partition.partition, **committed})
        return found

    async def _fetch_local(self, group_id: GroupId, group: str) -> dict[str, Any] | None:
        await self._registry.groups[group_id].read_index()  # still the leader, and applied that far
        committed = self._registry.partitions[group_id].state.committed_offset(group)
        return None if committed is None else {"offset": committed.offset, "metadata": committed.metadata}

    async def delete_group(self, group: str) -> int:
        """Remove `group`'s committed offsets from every partition of every topic that holds
        them; the number of partitions it was removed from. `UnknownGroup` when none did.

        Kafka's DeleteGroups. Each partition's leader decides from its own applied state
        (caught up first), so a partition that never held the group gets no entry. A
        partition without a known leader fails the call (LEADER_NOT_AVAILABLE, retriable)
        before anything is removed: without it nobody can say whether it holds the group.
        """
        by_leader: dict[int, list[int]] = {}
        catalog = self._catalog.catalog
        for name in sorted(catalog.topics):
            for partition in catalog.topics[name].partitions:
                leader = self._leader_for(partition.group_id, partition.replicas)
                by_leader.setdefault(leader, []).append(partition.group_id)
        outcomes = await asyncio.gather(
            *(self._delete_on(leader, group, ids) for leader, ids in sorted(by_leader.items())),
            return_exceptions=True,
        )
        removed = 0
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # the others ran to their end: a retry finishes the job
            removed += outcome
        if not removed:
            raise UnknownGroup(f"no partition keeps offsets for consumer group {group!r}")
        return removed

    def _leader_for(self, group_id: GroupId, replicas: tuple[int, ...]) -> int:
        if self._registry.leading(group_id) is not None:
            return self.id
        leader = self._routing.forward_target(group_id, replicas)
        if leader == 0:
            raise LeaderNotAvailable(f"partition group {group_id} has no leader yet; retry")
        return leader

    async def _delete_on(self, leader: int, group: str, group_ids: list[int]) -> int:
        if leader == self.id:
            return await self._delete_local(group, group_ids)
        body = json.dumps({"group": group, "group_ids": group_ids}).encode()
        reply = await self._call(leader, "partition.delete_group", body, RPC_TIMEOUT_S, write=True)
        return int(json.loads(reply)["removed"])

    async def _delete_local(self, group: str, group_ids: list[int]) -> int:
        """Delete `group` from each of these partitions led here; how many held it."""
        slots = asyncio.Semaphore(DELETES_IN_FLIGHT_MAX)

        async def one(group_id: GroupId) -> bool:
            async with slots:
                return await self._delete_in_partition(group_id, group)

        outcomes = await asyncio.gather(*(one(GroupId(g)) for g in group_ids), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return sum(1 for outcome in outcomes if outcome)

    async def _delete_in_partition(self, group_id: GroupId, group: str) -> bool:
        runtime = self._registry.leading(group_id)
        if runtime is None:
            raise NotLeader(self._registry.local_leader(group_id), "this node no longer leads the partition")
        core = runtime.core
        if core.applied_index < core.commit_index or core.log.term_or_none(core.commit_index) != core.term:
            await runtime.read_index()  # a new leader: applied state may lag what was committed before
        if self._registry.partitions[group_id].state.committed_offset(group) is None:
            return False  # nothing to delete here: no entry
        (result,) = await runtime.propose([encode_meta(OffsetsDelete(group=group))], EntryKind.META)
        if isinstance(result.error, UnknownGroup):
            return False  # another delete (or the retention pass) took it first
        if result.error is not None:
            raise result.error
        return True

    async def _call(self, peer: int, method: str, body: bytes, timeout_s: float, *, write: bool = False) -> bytes:
        """Forward to `peer` (`call_peer`); LEADER_NOT_AVAILABLE with no peer."""
        if peer == 0:
            raise LeaderNotAvailable("no leader known for this partition yet")
        return await call_peer(self._rpc, peer, method, body, timeout_s, write=write)

    # -- RPC handlers ------------------------------------------------------------

    async def _serve_read(self, source: int, body: bytes) -> tuple[int, bytes]:
        request = json.loads(body)
        group_id = GroupId(request["group"])
        if group_id not in self._registry.partitions:
            return error_answer(NotLeader(0, "this node hosts no replica of the partition"))
        _check_read_limits(request["offset"], request["max_records"], request["max_bytes"], request["wait_ms"],
                           request["isolation"])
        max_bytes = min(request["max_bytes"], FORWARDED_READ_BYTES_MAX)  # whatever an older peer asks
        return await answer(self._consume_local(group_id, request["offset"], request["max_records"], max_bytes,
                                                request["wait_ms"], request["isolation"],
                                                request.get("keep_skipped") is True), _encode_read)

    async def _serve_commit(self, source: int, body: bytes) -> tuple[int, bytes]:
        (group_id,) = _GROUP.unpack_from(body)
        if self._registry.leading(GroupId(group_id)) is None:
            return error_answer(NotLeader(self._registry.local_leader(GroupId(group_id))))
        commit = decode_meta(body[_GROUP.size :])
        if not isinstance(commit, OffsetCommit):
            return error_answer(InvalidRequest("partition.commit_offset carries an offset commit"))
        return await answer(self._commit_local(GroupId(group_id), commit), lambda _: b"{}")

    async def _serve_fetch(self, source: int, body: bytes) -> tuple[int, bytes]:
        request = json.loads(body)
        group_id = GroupId(request["group_id"])
        if self._registry.leading(group_id) is None:
            return error_answer(NotLeader(self._registry.local_leader(group_id)))
        return await answer(self._fetch_local(group_id, request["group"]), lambda value: json.dumps(value).encode())

    async def _serve_delete_group(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> int:
            request = json.loads(body)
            group, group_ids = request["group"], request["group_ids"]
            OffsetsDelete(group=group)  # validates the name (InvalidRequest)
            if not isinstance(group_ids, list) or not all(type(g) is int for g in group_ids):
                raise InvalidRequest("partition.delete_group takes a list of group ids")
            return await self._delete_local(group, group_ids)

        return await answer(work(), lambda removed: json.dumps({"removed": removed}).encode())


def skipped_batches(ranges: list[tuple[Offset, int]], batches: list[StoredBatch]) -> set[tuple[int, int]]:
    """The batches of an answer that are skipped ranges, as (base offset, count). `ranges`
    are the skipped ranges within the answer's span (not all those up to the high
    watermark): one pass over each list, so a read costs what it answers (a scan of
    every range per batch was quadratic, and stalled the event loop of a source with
    many skips)."""
    answered = {(int(b.base_offset), b.record_count) for b in batches}
    return {(int(b), n) for b, n in ranges if (int(b), n) in answered}


def _batch(stored: StoredBatch) -> tuple[int, int, bytes]:
    return int(stored.base_offset), stored.record_count, bytes(stored.payload)


def _encode_read(result: ConsumeResult) -> bytes:
    head = json.dumps({
        "next_offset": result.next_offset, "high_watermark": result.high_watermark,
        "log_start_offset": result.log_start_offset, "batches": [[b, n, len(d)] for b, n, d in result.batches],
        **({"skipped": [list(r) for r in result.skipped]} if result.skipped else {}),
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
    skipped = tuple((int(b), int(n)) for b, n in head.get("skipped", ()))
    return ConsumeResult(batches, head["next_offset"], head["high_watermark"], head["log_start_offset"], skipped)
