"""What a group member does besides heartbeats, from any node: fetch, commit, and the
admin's describe with committed offsets and lag.

- `fetch`: a keep-alive heartbeat at the coordinator (its answer says what the member
  owns, and what to give back), then reads of every assigned partition at once, each
  from the position the member sends, else the group's committed offset, else its
  `auto_offset_reset` (earliest or latest). A committed offset that retention has
  passed restarts at the reset policy too, as a Kafka consumer does. Long-poll: the
  reads wait together (bounded by `wait_ms`, and by half the group's session timeout,
  since only the fetch's start keeps the member alive); the answer comes when any
  partition has records, holding what those partitions had. One deadline bounds every
  read: a read that starts late (past the first `READS_IN_FLIGHT_MAX`) waits only
  what is left of it. A member that owns nothing
  yet waits as long, then is told what it owns then. Partitions being revoked are not
  read.
- `commit`: sent to the coordinator, which checks it (the member is current and owns
  every partition, `assigned` or `revoking`) and writes it as before, through each
  partition's own group (multiraft/node/partition_ops.py), inside its fence against
  releases (group_commits.py). An admin reset skips the coordinator, and so does a
  commit without a member for a group that has none in this node's copy of group 0
  (the commits of consumers that assign partitions themselves keep their one hop).
- `describe`: the coordinator's view of the group, with each resolved partition's
  committed offset, log start, high watermark, lag in records, and lag in time
  (`lag_ms`: the age of the oldest unconsumed record, read at the committed offset;
  record_times.py). At most `DESCRIBE_PARTITIONS_MAX` rows (`partitions_truncated`).
- `delete_group`: only while the group has no members (Kafka's NON_EMPTY_GROUP), then
  its offsets go from every partition as before (multiraft/node/partition_ops.py).

Partition bounds (log start, high watermark) come from a replica: this node's when it
hosts one, else the partition leader's over RPC (`groups.partition_bounds`, one call
per node for all its partitions).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import Heartbeat
from multiraft.errors import InvalidRequest, OffsetOutOfRange, UnknownGroup, UnknownTopic
from multiraft.node.partition_ops import ConsumeResult
from multiraft.node.record_times import first_at_or_after
from multiraft.node.routing import call_peer
from multiraft.state.consumer_offsets import OffsetCommit
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.group_coordinator import GroupCoordinator
    from multiraft.node.partition_ops import PartitionOps
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing

TopicPartition = tuple[str, int]
RESETS = ("earliest", "latest")
# Partition reads one fetch runs at once (a member may own up to 10,000 partitions).
READS_IN_FLIGHT_MAX = 64
# Partition rows one describe reads (offsets, bounds and one record each for the lag in
# time): the first this many in (topic, partition) order; `partitions_truncated` says when
# the group has more. Kafka's describe has no bound; ours keeps one request's work bounded.
DESCRIBE_PARTITIONS_MAX = 1_000


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    topic: str
    partition: int
    offset: int  # where the read started
    result: ConsumeResult | None
    error: ClientError | None = None


@dataclass(frozen=True, slots=True)
class MemberFetch:
    member: dict[str, Any]  # the member's view (assignment, revoking, epochs)
    partitions: list[PartitionFetch]
    # Where the read of every assigned partition started, answered or not (a read cancelled
    # because another partition answered first is not in `partitions`): a consumer instance
    # pins these, so a start taken from `latest` is not taken again later, past records
    # produced meanwhile (the native member keeps its own positions and ignores them).
    starts: dict[TopicPartition, int] = field(default_factory=dict)


class GroupReads:
    def __init__(self, coordinator: GroupCoordinator, reads: PartitionOps, routing: Routing,
                 catalog: CatalogHolder, rpc: Rpc) -> None:
        self._coordinator = coordinator
        self._reads = reads
        self._routing = routing
        self._registry: GroupRegistry = routing.registry
        self._catalog = catalog
        self._rpc = rpc
        rpc.register("groups.partition_bounds", self._serve_bounds)
        rpc.register("groups.partition_bounds_confirmed", self._serve_confirmed_bounds)

    # ------------------------------------------------------------------ fetch

    async def fetch(self, heartbeat: Heartbeat, positions: dict[TopicPartition, int], reset: str, *,
                    max_records: int, max_bytes: int, wait_ms: int) -> MemberFetch:
        if reset not in RESETS:
            raise InvalidRequest(f"auto_offset_reset must be one of {', '.join(RESETS)}")
        member = await self._coordinator.command(heartbeat)
        # The coordinator saw the member when this fetch began: a long-poll waits at most
        # half its session, so the member's next call comes in time to keep it alive.
        wait_ms = min(wait_ms, member["session_timeout_ms"] // 2)
        owned = [(a["topic"], p) for a in member["assignment"] for p in a["partitions"]]
        # The coordinator's catalog may be ahead of this node's (or a topic went and came back
        # smaller): partitions this node does not know are answered as errors, not read.
        assigned = [tp for tp in owned if self._known(tp)]
        unknown = [PartitionFetch(t, p, positions.get((t, p), 0), None, UnknownTopic(
            f"partition {t}/{p} is not in this node's catalog (yet); retry")) for t, p in owned if not self._known((t, p))]
        if not assigned:
            if wait_ms <= 0 or unknown:
                return MemberFetch(member, unknown)
            await asyncio.sleep(wait_ms / 1000)  # nothing to read yet: wait, then say what it has now
            return MemberFetch(await self._coordinator.command(heartbeat), [])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000  # one for every read: rounds of reads must not add up
        starts = await self._starts(heartbeat.group, assigned, positions, reset)
        per_partition_bytes = max(1, max_bytes // len(assigned))
        slots = asyncio.Semaphore(READS_IN_FLIGHT_MAX)

        async def one(tp: TopicPartition) -> PartitionFetch:
            async with slots:
                left_ms = max(0, int((deadline - loop.time()) * 1000))
                return await self._read(tp, starts[tp], reset, max_records, per_partition_bytes, left_ms)

        tasks = [asyncio.ensure_future(one(tp)) for tp in assigned]
        finished: list[PartitionFetch] = []
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                finished.extend(task.result() for task in done)
                # Records, or a position moved past offsets holding none (a filtered mirror's gaps)
                # while more of the log follows: waiting out the other partitions' polls then moved
                # a member a read's worth a poll. Not at the log's end: there each gap the sink
                # commits would answer the fetch at once (and a Confluent instance's GET writes its
                # positions to group 0 each time), a poll per gap instead of one per wait_ms.
                if any(f.result is not None and (f.result.batches
                                                 or f.offset < f.result.next_offset < f.result.high_watermark)
                       for f in finished):
                    break
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return MemberFetch(member, sorted(finished + unknown, key=lambda f: (f.topic, f.partition)), starts)

    def _known(self, tp: TopicPartition) -> bool:
        """Whether this node's catalog has the partition now."""
        info = self._catalog.catalog.topics.get(tp[0])
        return info is not None and 0 <= tp[1] < len(info.partitions)

    async def _read(self, tp: TopicPartition, offset: int, reset: str, max_records: int, max_bytes: int,
                    wait_ms: int) -> PartitionFetch:
        topic, partition = tp
        for _ in range(2):  # once more from the reset position when the offset left the log
            try:
                result = await self._reads.consume(topic, partition, offset, max_records=max_records,
                                                   max_bytes=max_bytes, wait_ms=wait_ms)
                return PartitionFetch(topic, partition, offset, result)
            except OffsetOutOfRange:
                try:
                    start, end = (await self.bounds([tp]))[tp]
                    if offset > end:  # past the answering replica's end: is it past the leader's too?
                        # Asked of a leader that confirms it still leads (a ReadIndex): a deposed
                        # leader that has not noticed yet believes it leads and its high watermark
                        # is stale; its answer reset positions the real leader holds (chaos seed
                        # 712994: an isolated n3, hw 240, sent a member at 262 back to 0).
                        start, end = (await self.bounds([tp], leader=True))[tp]
                except ClientError as error:
                    return PartitionFetch(topic, partition, offset, None, error)
                if start <= offset <= end:
                    # The replica that answered is behind the member's position, which the
                    # leader's log holds: not out of range, so no reset (a reset moved the
                    # member back to its policy's start and its next commit backwards,
                    # chaos seed 3). Kafka's OFFSET_NOT_AVAILABLE: fetch again.
                    leader = self._routing.leader_of(self._catalog.partition_group(topic, partition))
                    return PartitionFetch(topic, partition, offset, None, NotLeader(
                        leader, f"the replica read has not reached offset {offset} yet; fetch again"))
                offset = start if reset == "earliest" else end
            except ClientError as error:
                return PartitionFetch(topic, partition, offset, None, error)
        return PartitionFetch(topic, partition, offset, None, OffsetOutOfRange("the log moved twice; fetch again"))

    async def _starts(self, group: str, assigned: list[TopicPartition], positions: dict[TopicPartition, int],
                      reset: str) -> dict[TopicPartition, int]:
        starts = {tp: positions[tp] for tp in assigned if tp in positions}
        missing = [tp for tp in assigned if tp not in starts]
        for topic in sorted({t for t, _ in missing}):
            for committed in await self._reads.fetch_offsets(group, topic):
                tp = (topic, committed["partition"])
                if tp in missing:
                    starts[tp] = committed["offset"]
        unset = [tp for tp in missing if tp not in starts]
        if unset:
            bounds = await self.bounds(unset)
            for tp in unset:
                starts[tp] = bounds[tp][0] if reset == "earliest" else bounds[tp][1]
        return starts

    # ------------------------------------------------------------------ commit

    async def commit(self, group: str, member_id: str | None, member_epoch: int, commits: list[OffsetCommit], *,
                     admin_reset: bool = False) -> None:
        if admin_reset:
            await self._reads.commit_offsets(group, commits)  # the admin's act: no member, no check
            return
        if member_id is None and not self._catalog.groups.has_members(group):
            # A consumer that assigns itself (a group without members, as this node applied
            # group 0): straight to the partitions as before, no hop through the coordinator.
            await self._reads.commit_offsets(group, commits)
            return
        await self._coordinator.commit(group, member_id, member_epoch, commits)

    # ------------------------------------------------------------------ describe

    async def describe(self, group: str, authorize: Callable[[dict[str, Any]], None] | None = None,
                       topics: tuple[str, ...] = ()) -> dict[str, Any]:
        """`authorize`: raises when the caller may not see the coordinator's view (before
        the partitions are read). `topics`: also these topics' partitions; they describe a
        group without members too (state `empty`, Kafka's "no active members"), by its
        committed offsets there (UNKNOWN_GROUP when it has none)."""
        try:
            described = await self._coordinator.describe(group)
        except ClientError as error:  # UnknownGroup here, or its code from the coordinator's node
            if error.code != UnknownGroup.code or not topics:
                raise
            described = {"group": group, "state": "empty", "group_epoch": None, "assignment_epoch": None,
                         "assignor": None, "session_timeout_ms": None, "topics": [], "members": []}
        if authorize is not None:
            authorize(described)
        counts = {t["topic"]: t["partitions"] for t in described["topics"]}
        for topic in topics:
            counts.setdefault(topic, len(self._catalog.catalog.topic(topic).partitions))  # UnknownTopic if none
        # The group's resolved counts can be stale (a topic deleted and created again smaller
        # is re-resolved at the next heartbeat) and this node's catalog can trail: only the
        # partitions this node's catalog has get a row.
        known = [(topic, p) for topic, count in sorted(counts.items()) for p in range(count)
                 if self._known((topic, p))]
        tps = known[:DESCRIBE_PARTITIONS_MAX]
        described["partitions_total"] = len(known)
        described["partitions_truncated"] = len(known) > len(tps)
        committed: dict[TopicPartition, int] = {}
        for topic in sorted({t for t, _ in tps}):
            for row in await self._reads.fetch_offsets(group, topic):
                committed[(topic, row["partition"])] = row["offset"]
        bounds = await self.bounds(tps)
        owners = {(a["topic"], p): m["member_id"] for m in described["members"]
                  for a in m["assignment"] + m["revoking"] for p in a["partitions"]}
        rows = []
        for tp in tps:
            start, end = bounds[tp]
            offset = committed.get(tp)
            lag = end - (offset if offset is not None else start)
            rows.append({"topic": tp[0], "partition": tp[1], "committed_offset": offset, "log_start_offset": start,
                         "high_watermark": end, "lag": max(0, lag), "owner": owners.get(tp)})
        await self._lag_ms(rows)
        if not described["members"] and all(row["committed_offset"] is None for row in rows):
            raise UnknownGroup(f"consumer group {group!r} has no members and no offsets in {', '.join(topics)}")
        described["partitions"] = rows
        return described

    async def _lag_ms(self, rows: list[dict[str, Any]]) -> None:
        """Each lagging row's `lag_ms`: now less the timestamp of its first unconsumed record
        (0 without lag; None when that record cannot be read now)."""
        slots = asyncio.Semaphore(READS_IN_FLIGHT_MAX)
        now_ms = int(time.time() * 1000)

        async def one(row: dict[str, Any]) -> None:
            row["lag_ms"] = 0
            if not row["lag"]:
                return
            offset = row["committed_offset"] if row["committed_offset"] is not None else row["log_start_offset"]
            async with slots:
                try:
                    found = await first_at_or_after(self._reads, row["topic"], row["partition"], max(offset, 0))
                except ClientError:
                    found = None
            # None also when the lookup stopped in a long run of gaps (NotReached): unknown, not 0.
            row["lag_ms"] = max(0, now_ms - found[1]) if isinstance(found, tuple) else None

        await asyncio.gather(*(one(row) for row in rows))

    async def delete_group(self, group: str) -> int:
        await self._coordinator.require_empty(group)
        return await self._reads.delete_group(group)

    # ------------------------------------------------------------------ bounds

    async def bounds(self, tps: list[TopicPartition], *, leader: bool = False) -> dict[TopicPartition, tuple[int, int]]:
        """(log start offset, high watermark) of each partition, from a replica: this
        node's when it hosts one, else the leader's. With `leader`: from the leader only,
        after it confirmed its leadership and applied that far (a ReadIndex, as
        `fetch_offsets`), so the high watermark is at least any one a client saw before
        the call; a leader that cannot confirm (deposed, cut off) fails the call,
        retriable, and never answers its own stale bounds."""
        catalog = self._catalog.catalog
        local: dict[TopicPartition, tuple[int, int]] = {}
        remote: dict[int, list[tuple[TopicPartition, GroupId]]] = {}
        for tp in tps:
            if not self._known(tp):
                raise UnknownTopic(f"partition {tp[0]}/{tp[1]} is not in this node's catalog (yet); retry")
            info = catalog.topic(tp[0]).partitions[tp[1]]
            mine = not leader or self._routing.leader_of(info.group_id) == self._routing.id
            if leader and mine:
                here = await self._confirmed_local_bounds(info.group_id)
            else:
                here = self._local_bounds(info.group_id) if mine else None
            if here is not None:
                local[tp] = here
                continue
            target = self._routing.forward_target(info.group_id, info.replicas)
            if target == 0:
                raise LeaderNotAvailable(f"partition {tp[0]}/{tp[1]} has no known leader yet; retry")
            remote.setdefault(target, []).append((tp, info.group_id))
        for node, items in sorted(remote.items()):
            body = json.dumps([group_id for _, group_id in items]).encode()
            method = "groups.partition_bounds_confirmed" if leader else "groups.partition_bounds"
            answered = json.loads(await call_peer(self._rpc, node, method, body, RPC_TIMEOUT_S, write=False))
            for (tp, _), pair in zip(items, answered, strict=True):
                if pair is None:
                    raise LeaderNotAvailable(f"partition {tp[0]}/{tp[1]} moved; retry")
                local[tp] = (int(pair[0]), int(pair[1]))
        return local

    def _local_bounds(self, group_id: GroupId) -> tuple[int, int] | None:
        machine, store = self._registry.partitions.get(group_id), self._registry.stores.get(group_id)
        if machine is None or store is None:
            return None
        return int(store.log_start_offset), int(machine.state.high_watermark)

    async def _confirmed_local_bounds(self, group_id: GroupId) -> tuple[int, int] | None:
        """This node's bounds once it confirmed it leads the group (None: it does not)."""
        runtime = self._registry.leading(group_id)
        if runtime is None:
            return None
        try:
            await asyncio.wait_for(runtime.read_index(), RPC_TIMEOUT_S)
        except (ClientError, TimeoutError) as error:
            raise LeaderNotAvailable(f"group {group_id}: leadership not confirmed ({error}); retry") from None
        return self._local_bounds(group_id)

    async def _serve_confirmed_bounds(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> list[Any]:
            group_ids = json.loads(body)
            if not isinstance(group_ids, list) or not all(type(g) is int for g in group_ids):
                raise InvalidRequest("groups.partition_bounds_confirmed takes a list of group ids")
            return [await self._confirmed_local_bounds(GroupId(g)) for g in group_ids]

        return await answer(work(), lambda value: json.dumps(value).encode())

    async def _serve_bounds(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> list[Any]:
            group_ids = json.loads(body)
            if not isinstance(group_ids, list) or not all(type(g) is int for g in group_ids):
                raise InvalidRequest("groups.partition_bounds takes a list of group ids")
            return [self._local_bounds(GroupId(g)) for g in group_ids]

        return await answer(work(), lambda value: json.dumps(value).encode())
