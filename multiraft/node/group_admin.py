"""Consumer group admin beyond describe: resetting offsets, and the figures of /metrics.

**Reset** (Kafka's `--reset-offsets`; the plan's rules are in multiraft/consumer_groups/
resets.py). Refused while the group has members (`NON_EMPTY_GROUP`), asked of the
coordinator first; then the plan is read (committed offsets, bounds, and for a time
the offset of that time, record_times.py) and, unless it is a dry run, written as a
commit without a member *through the coordinator*: it checks again that the group has
no members, inside its commit fence (group_commits.py), and writes each offset through
its partition's own Raft group, so a reset is replicated and durable as any commit.
A member that joins between the plan and the write finds the commit refused.

**Metrics** (docs/http.md "Metrics"). A scrape of any node shows, for the groups with
members:
- the group's state and member count, from the metadata leader only (each group once
  in the cluster; at most `GROUPS_MAX` groups);
- per (group, partition) its committed offset and lag, from the partition's leader
  only, read from its applied state (no RPC), and the lag in seconds (one local read
  of the record at the committed offset). At most `METRICS_GROUP_PARTITIONS_MAX`
  series per node (groups by name, then topic and partition); past that the rest are
  left out and `truncated` says so, which bounds label cardinality and scrape work.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import summary
from multiraft.consumer_groups.resets import (
    RESET_PARTITIONS_MAX,
    ResetRequest,
    ResetStrategy,
    planned_offset,
)
from multiraft.errors import InvalidRequest, UnknownTopic
from multiraft.node.record_times import first_at_or_after, offset_for_time
from multiraft.node.registry import METADATA_GROUP
from multiraft.state.consumer_offsets import OffsetCommit
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.group_coordinator import GroupCoordinator
    from multiraft.node.group_reads import GroupReads
    from multiraft.node.partition_ops import PartitionOps
    from multiraft.node.registry import GroupRegistry

TopicPartition = tuple[str, int]
# Reads a reset or a scrape runs at once.
READS_IN_FLIGHT_MAX = 64
# Offsets one commit of a reset carries: the coordinator writes a commit's offsets one
# after another within its fence's bound (COMMIT_WRITE_S), so a large reset goes in parts.
RESET_COMMIT_CHUNK = 50
# (group, partition) series one node's /metrics shows: label cardinality stays bounded
# (Prometheus' own advice is to keep a metric's series in the low thousands).
METRICS_GROUP_PARTITIONS_MAX = 1_000


@dataclass(frozen=True, slots=True)
class GroupGauge:
    group: str
    state: str  # stable | reconciling
    members: int


@dataclass(frozen=True, slots=True)
class GroupPartitionGauge:
    group: str
    topic: str
    partition: int
    committed_offset: int | None
    lag: int  # records: high watermark less the committed offset (the log start without one)
    lag_seconds: float | None  # age of the oldest unconsumed record; None when unreadable now


@dataclass(frozen=True, slots=True)
class GroupMetrics:
    groups: list[GroupGauge]
    partitions: list[GroupPartitionGauge]
    truncated: bool


class GroupAdmin:
    def __init__(self, coordinator: GroupCoordinator, group_reads: GroupReads, reads: PartitionOps,
                 catalog: CatalogHolder, registry: GroupRegistry) -> None:
        self._coordinator = coordinator
        self._group_reads = group_reads
        self._reads = reads
        self._catalog = catalog
        self._registry = registry

    # ------------------------------------------------------------------ reset

    async def reset_offsets(self, request: ResetRequest) -> dict[str, Any]:
        """The plan, written unless it is a dry run."""
        await self._coordinator.require_empty(request.group)
        tps = self._partitions(request)
        committed: dict[TopicPartition, int] = {}
        for topic in sorted({t for t, _ in tps}):
            for row in await self._reads.fetch_offsets(request.group, topic):
                committed[(topic, row["partition"])] = row["offset"]
        bounds = await self._group_reads.bounds(tps)
        times = await self._times(request, tps, bounds) if request.strategy is ResetStrategy.TIMESTAMP else {}
        rows = []
        for tp in tps:
            start, end = bounds[tp]
            new = planned_offset(request, committed.get(tp), start, end, times.get(tp))
            rows.append({"topic": tp[0], "partition": tp[1], "committed_offset": committed.get(tp),
                         "new_offset": new, "log_start_offset": start, "high_watermark": end})
        if request.execute:
            commits = [OffsetCommit(group=request.group, topic=r["topic"], partition=r["partition"],
                                    offset=r["new_offset"]) for r in rows]
            for first in range(0, len(commits), RESET_COMMIT_CHUNK):
                await self._coordinator.commit(request.group, None, 0, commits[first:first + RESET_COMMIT_CHUNK])
        return {"group": request.group, "executed": request.execute, "offsets": rows}

    def _partitions(self, request: ResetRequest) -> list[TopicPartition]:
        catalog = self._catalog.catalog
        tps: list[TopicPartition] = []
        for chosen in request.topics:
            info = catalog.topics.get(chosen.topic)
            if info is None:
                raise UnknownTopic(f"unknown topic {chosen.topic!r}")
            count = len(info.partitions)
            partitions = chosen.partitions if chosen.partitions is not None else tuple(range(count))
            for partition in sorted(partitions):
                if partition >= count:
                    raise UnknownTopic(f"topic {chosen.topic!r} has {count} partitions, not {partition}")
                tps.append((chosen.topic, partition))
            if len(tps) > RESET_PARTITIONS_MAX:
                raise InvalidRequest(f"a reset covers at most {RESET_PARTITIONS_MAX} partitions; "
                                     "name fewer topics or partitions per call")
        return tps

    async def _times(self, request: ResetRequest, tps: list[TopicPartition],
                     bounds: dict[TopicPartition, tuple[int, int]]) -> dict[TopicPartition, int]:
        assert request.value is not None
        slots = asyncio.Semaphore(READS_IN_FLIGHT_MAX)
        found: dict[TopicPartition, int] = {}

        async def one(tp: TopicPartition) -> None:
            async with slots:
                found[tp] = await offset_for_time(self._reads, tp[0], tp[1], *bounds[tp], request.value)

        await asyncio.gather(*(one(tp) for tp in tps))
        return found

    # ------------------------------------------------------------------ metrics

    async def metrics(self) -> GroupMetrics:
        state = self._catalog.groups
        metadata = self._registry.groups.get(METADATA_GROUP)
        gauges = []
        if metadata is not None and metadata.core.role is Role.LEADER:
            for name, group in sorted(state.groups.items()):
                gauges.append(GroupGauge(name, str(summary(group)["state"]), len(group.members)))
        led = self._led_partitions()
        rows: list[tuple[str, str, int, GroupId]] = []
        truncated = False
        for name, group in sorted(state.groups.items()):
            for topic, count in sorted(group.counts.items()):
                for partition, group_id in sorted(led.get(topic, {}).items()):
                    if partition >= count:
                        continue
                    if len(rows) >= METRICS_GROUP_PARTITIONS_MAX:
                        truncated = True
                        break
                    rows.append((name, topic, partition, group_id))
        partitions = await self._lags(rows)
        return GroupMetrics(gauges, partitions, truncated)

    def _led_partitions(self) -> dict[str, dict[int, GroupId]]:
        """{topic: {partition: group id}} of the partitions this node leads."""
        led: dict[str, dict[int, GroupId]] = {}
        for group_id, machine in list(self._registry.partitions.items()):
            if self._registry.leading(group_id) is not None:
                led.setdefault(machine.state.topic, {})[machine.state.partition] = group_id
        return led

    async def _lags(self, rows: list[tuple[str, str, int, GroupId]]) -> list[GroupPartitionGauge]:
        slots = asyncio.Semaphore(READS_IN_FLIGHT_MAX)
        now_ms = int(time.time() * 1000)

        async def one(row: tuple[str, str, int, GroupId]) -> GroupPartitionGauge | None:
            group, topic, partition, group_id = row
            machine, store = self._registry.partitions.get(group_id), self._registry.stores.get(group_id)
            if machine is None or store is None:
                return None  # closed meanwhile (topic deleted, replica moved)
            committed = machine.state.committed_offset(group)
            offset = committed.offset if committed is not None else int(store.log_start_offset)
            lag = max(0, machine.state.high_watermark - offset)
            seconds: float | None = 0.0
            if lag:
                async with slots:
                    try:
                        found = await first_at_or_after(self._reads, topic, partition, offset)
                    except ClientError:
                        found = None
                # None also when the lookup stopped in a long run of gaps (NotReached): unknown.
                seconds = max(0, now_ms - found[1]) / 1000 if isinstance(found, tuple) else None
            return GroupPartitionGauge(group, topic, partition, committed.offset if committed else None, lag,
                                       seconds)

        found = await asyncio.gather(*(one(row) for row in rows))
        return [gauge for gauge in found if gauge is not None]

