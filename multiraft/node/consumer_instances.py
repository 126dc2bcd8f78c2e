"""Confluent REST v2 consumer instances, served by any node (docs/node.md, "Confluent
consumer instances").

An instance lives in group 0 (multiraft/consumer_groups/instances.py): a member of its
group plus its settings and fetch positions. So any node serves any call on it, and it
outlives the node that created it:

- its changes (create, delete, subscribe, assign, seek, and the positions a records GET
  moved to) are group commands, proposed at the coordinator (the metadata leader) like
  a join (`GroupCoordinator.command`);
- a call that needs its state reads it at the coordinator (`view`, RPC
  `groups.instance_view`), which also keeps the instance alive there;
- a records GET is a member fetch (`GroupReads.fetch`) from the instance's positions
  (else the group's committed offsets, else its `auto.offset.reset`); the edge renders
  what it returns and hands the positions it reached to `advance`, one group-0 write
  when they moved, which is applied before the records are answered: the next GET,
  through any node, starts where this one ended.

What the instance's client cannot do, the node does for it: a revocation (another
member joined) is acknowledged at its next records GET, after committing what it
read of those partitions when `auto.commit.enable` is on; and auto-commit commits the
positions at most every `AUTO_COMMIT_INTERVAL_MS` (Kafka's auto.commit.interval.ms),
at the start of a records GET.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import (
    AssignInstance,
    CreateInstance,
    DeleteInstance,
    Heartbeat,
    InstancePositions,
    SubscribeInstance,
    Subscription,
)
from multiraft.consumer_groups.commands import check_group, check_member_id
from multiraft.consumer_groups.topics import glob_match
from multiraft.errors import InvalidRequest
from multiraft.node.group_reads import MemberFetch
from multiraft.node.registry import METADATA_GROUP
from multiraft.node.routing import call_peer
from multiraft.state.consumer_offsets import OffsetCommit
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer
from raftlog.errors import ClientError, LeaderNotAvailable
from raftlog.messages import Role

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.group_coordinator import GroupCoordinator
    from multiraft.node.group_reads import GroupReads
    from multiraft.node.partition_ops import PartitionOps
    from multiraft.node.registry import GroupRegistry

TopicPartition = tuple[str, int]
# Kafka's auto.commit.interval.ms default.
AUTO_COMMIT_INTERVAL_MS = 5_000
# Records one GET returns at most (Kafka's max.poll.records default).
POLL_RECORDS_MAX = 500
# Instances whose last auto-commit time this node remembers (past it, all are forgotten:
# the worst is one early auto-commit each).
AUTO_COMMIT_MEMORY_MAX = 10_000


def pairs(partitions: list[dict[str, Any]]) -> tuple[TopicPartition, ...]:
    """[{"topic", "partitions"}] -> sorted (topic, partition) pairs."""
    return tuple(sorted((item["topic"], p) for item in partitions for p in item["partitions"]))


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ConsumerInstances:
    def __init__(self, coordinator: GroupCoordinator, group_reads: GroupReads, reads: PartitionOps,
                 registry: GroupRegistry, catalog: CatalogHolder, rpc: Rpc, logger: Any,
                 clock_ms: Callable[[], int] = _monotonic_ms) -> None:
        self._coordinator = coordinator
        self._group_reads = group_reads
        self._reads = reads
        self._registry = registry
        self._catalog = catalog
        self._rpc = rpc
        self._logger = logger
        self._clock_ms = clock_ms
        self._auto_committed_ms: dict[tuple[str, str], int] = {}
        rpc.register("groups.instance_view", self._serve_view)

    # ------------------------------------------------------------------ changes

    async def create(self, command: CreateInstance) -> dict[str, Any]:
        return await self._coordinator.command(command)

    async def delete(self, group: str, member_id: str) -> None:
        """Commits what it read first when auto-commit is on (Kafka's close() does)."""
        view = await self.view(group, member_id)
        if view["config"]["auto_commit"]:
            await self._auto_commit(view, pairs(view["member"]["assignment"]) + pairs(view["member"]["revoking"]))
        await self._coordinator.command(DeleteInstance(group=group, member_id=member_id))

    async def subscribe(self, group: str, member_id: str, subscription: Subscription | None) -> dict[str, Any]:
        return await self._coordinator.command(SubscribeInstance(group=group, member_id=member_id,
                                                                 subscription=subscription))

    async def assign(self, group: str, member_id: str, partitions: tuple[TopicPartition, ...]) -> dict[str, Any]:
        return await self._coordinator.command(AssignInstance(group=group, member_id=member_id, partitions=partitions))

    async def seek(self, group: str, member_id: str, positions: dict[TopicPartition, int]) -> None:
        await self._coordinator.command(InstancePositions(
            group=group, member_id=member_id, positions=tuple((t, p, o) for (t, p), o in sorted(positions.items())),
            seek=True))

    async def seek_edge(self, group: str, member_id: str, partitions: tuple[TopicPartition, ...], edge: str) -> None:
        """Seek to the log start (`beginning`) or the high watermark (`end`) of each partition."""
        bounds = await self._group_reads.bounds(list(partitions))
        await self.seek(group, member_id, {tp: bounds[tp][0 if edge == "beginning" else 1] for tp in partitions})

    async def advance(self, group: str, member_id: str, positions: dict[TopicPartition, int]) -> None:
        """Where a records GET ended (one group-0 write; kept only for what the member holds)."""
        if positions:
            await self._coordinator.command(InstancePositions(
                group=group, member_id=member_id,
                positions=tuple((t, p, o) for (t, p), o in sorted(positions.items()))))

    # ------------------------------------------------------------------ reads

    async def poll(self, view: dict[str, Any], *, max_bytes: int, wait_ms: int) -> MemberFetch:
        """A records GET's reads: give back what is revoked (committing it first with
        auto-commit), auto-commit on its interval, then fetch as the member."""
        group, member_id = view["group"], view["instance_id"]
        member = view["member"]
        revoking = pairs(member["revoking"])
        if view["config"]["auto_commit"]:
            key = (group, member_id)
            if revoking or self._clock_ms() - self._auto_committed_ms.get(key, 0) >= AUTO_COMMIT_INTERVAL_MS:
                await self._auto_commit(view, pairs(member["assignment"]) + revoking)
                if len(self._auto_committed_ms) >= AUTO_COMMIT_MEMORY_MAX:
                    self._auto_committed_ms.clear()
                self._auto_committed_ms[key] = self._clock_ms()
        epoch = member["member_epoch"]
        if revoking:
            member = await self._coordinator.command(Heartbeat(group=group, member_id=member_id, member_epoch=epoch,
                                                               owned=pairs(member["assignment"])))
            epoch = member["member_epoch"]
        positions = {(p["topic"], p["partition"]): p["offset"] for p in view["positions"]}
        return await self._group_reads.fetch(
            Heartbeat(group=group, member_id=member_id, member_epoch=epoch), positions,
            view["config"]["auto_offset_reset"], max_records=POLL_RECORDS_MAX, max_bytes=max_bytes, wait_ms=wait_ms)

    async def commit(self, view: dict[str, Any], offsets: dict[TopicPartition, int] | None,
                     metadata: dict[TopicPartition, str] | None = None) -> None:
        """`offsets` None: commit every position (what was fetched, or sought). `metadata`:
        the client's string per partition, kept beside the offset as a native commit's is."""
        if offsets is None:
            offsets = {(p["topic"], p["partition"]): p["offset"] for p in view["positions"]}
        if not offsets:
            return
        notes = metadata or {}
        commits = [OffsetCommit(group=view["group"], topic=t, partition=p, offset=o, metadata=notes.get((t, p), ""))
                   for (t, p), o in sorted(offsets.items())]
        await self._group_reads.commit(view["group"], view["instance_id"], view["member"]["member_epoch"], commits)

    async def committed(self, group: str, partitions: tuple[TopicPartition, ...]
                        ) -> dict[TopicPartition, tuple[int, str]]:
        """The group's committed (offset, metadata) of each partition that has one."""
        found: dict[TopicPartition, tuple[int, str]] = {}
        for topic in sorted({t for t, _ in partitions}):
            for row in await self._reads.fetch_offsets(group, topic):
                if (topic, row["partition"]) in partitions:
                    found[(topic, row["partition"])] = (row["offset"], row.get("metadata") or "")
        return found

    async def _auto_commit(self, view: dict[str, Any], held: tuple[TopicPartition, ...]) -> None:
        """Best effort, as Kafka's auto-commit: a failure is logged, and the read goes on."""
        positions = {(p["topic"], p["partition"]): p["offset"] for p in view["positions"]}
        offsets = {tp: positions[tp] for tp in held if tp in positions}
        if not offsets:
            return
        try:
            await self.commit({**view, "positions": [{"topic": t, "partition": p, "offset": o}
                                                     for (t, p), o in sorted(offsets.items())]}, None)
        except ClientError as error:
            self._logger.warning("instance_auto_commit_failed", group=view["group"], instance=view["instance_id"],
                                 error=str(error))

    def pattern_topics(self, pattern: str) -> list[str]:
        """The topics a subscription's glob matches now, in this node's catalog (Kafka's
        subscription() for a pattern: what it matches, not only what the member holds)."""
        return sorted(name for name in self._catalog.catalog.topics if glob_match(pattern, name))

    # ------------------------------------------------------------------ the view, at the coordinator

    async def view(self, group: str, member_id: str) -> dict[str, Any]:
        """The instance as the coordinator has it (settings, member, positions); keeps it alive."""
        request = {"group": group, "member_id": member_id}
        runtime = self._registry.groups.get(METADATA_GROUP)
        if runtime is None:
            raise LeaderNotAvailable("the metadata group is not open on this node yet")
        if runtime.core.role is Role.LEADER:
            return await self._view(request)
        leader = runtime.core.leader
        if leader == 0:
            raise LeaderNotAvailable("no group coordinator (metadata leader) known yet; retry")
        body = await call_peer(self._rpc, leader, "groups.instance_view", json.dumps(request).encode(),
                               RPC_TIMEOUT_S, write=False)
        return json.loads(body)  # type: ignore[no-any-return]

    async def _view(self, request: dict[str, Any]) -> dict[str, Any]:
        group, member_id = request.get("group"), request.get("member_id")
        check_group(group)
        check_member_id(member_id)
        assert isinstance(group, str) and isinstance(member_id, str)
        await self._coordinator.leading()
        view = self._catalog.groups.instance_view(group, member_id)
        self._coordinator.note(group, member_id)
        return view

    async def _serve_view(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> dict[str, Any]:
            try:
                request = json.loads(body)
            except ValueError:
                raise InvalidRequest("an instance view request is JSON") from None
            if not isinstance(request, dict):
                raise InvalidRequest("an instance view request is a JSON object")
            return await self._view(request)

        return await answer(work(), lambda value: json.dumps(value).encode())
