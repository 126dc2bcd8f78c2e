"""Consumer offsets retention: partition leaders propose the removal of idle groups.

Kafka removes a group's committed offsets once the group has been idle for
`offsets.retention.minutes` (7 days), checking every
`offsets.retention.check.interval.ms` (10 minutes). Here both are node settings
(`consumer_offsets_retention_ms`, `consumer_offsets_retention_check_ms`), and the
work is a partition's own: offsets live in the partition's group, so every check
interval each node looks at the partitions it leads and, for each holding groups
whose last commit there is older than the retention as of its wall clock, proposes
one `offsets_expire` META entry naming them with that time and that retention.

Apply (`PartitionState._expire`) reads no clock: it removes the named groups whose
commit (a time the committing leader put in the commit's entry) is older than the
entry's own time minus its own retention, so every replica removes the same ones,
and a group that committed again after the pass chose it stays. The leader's clock
decides, as Kafka's group coordinator's does.

Bounded per pass: at most `PROPOSALS_PER_PASS_MAX` entries of at most
`EXPIRE_GROUPS_PER_ENTRY_MAX` groups (what is left goes in the next pass), the scan
of a partition stops at its first group inside the retention
(`PartitionState.idle_groups`), the proposals are awaited together under one
deadline, and a failed one (leadership lost, a full inbox) is only logged: the next
pass finds the same groups again. A partition with nothing idle gets no entry, so a
quiet group stays quiet.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from multiraft.state.consumer_offsets import EXPIRE_GROUPS_PER_ENTRY_MAX, OffsetsExpire, encode_meta
from raftlog.errors import ClientError
from raftlog.messages import EntryKind
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.config import NodeConfig
    from multiraft.node.registry import GroupRegistry

# Entries proposed by one pass (as the replica mover's 100 proposals per round).
PROPOSALS_PER_PASS_MAX = 100
# How long one pass waits for its proposals; the rest are left to apply on their own.
PASS_TIMEOUT_S = 15.0


def wall_clock_ms() -> int:
    """The time a leader writes into commits and retention passes (ms since the epoch)."""
    return int(time.time() * 1000)


async def retention_loop(registry: GroupRegistry, config: NodeConfig, logger: Any) -> None:
    interval_s = config.consumer_offsets_retention_check_ms / 1000
    while True:
        await asyncio.sleep(interval_s)
        await expire_idle_groups(registry, config.consumer_offsets_retention_ms, wall_clock_ms(), logger)


def choose_expiries(registry: GroupRegistry, retention_ms: int, as_of_ms: int) -> list[tuple[GroupId, OffsetsExpire]]:
    """The entries one pass as of `as_of_ms` proposes: per partition led here, its idle groups."""
    chosen: list[tuple[GroupId, OffsetsExpire]] = []
    for group_id in sorted(registry.partitions):
        runtime = registry.leading(group_id)
        if runtime is None or runtime.failed:
            continue
        idle = registry.partitions[group_id].state.idle_groups(as_of_ms, retention_ms, EXPIRE_GROUPS_PER_ENTRY_MAX)
        if idle:
            chosen.append((group_id, OffsetsExpire(as_of_ms=as_of_ms, retention_ms=retention_ms, groups=idle)))
            if len(chosen) == PROPOSALS_PER_PASS_MAX:
                break
    return chosen


async def expire_idle_groups(registry: GroupRegistry, retention_ms: int, as_of_ms: int, logger: Any) -> int:
    """One retention pass as of `as_of_ms`; returns the number of groups removed."""
    chosen = choose_expiries(registry, retention_ms, as_of_ms)
    if not chosen:
        return 0
    outcomes: list[int | BaseException] = []
    try:
        async with asyncio.timeout(PASS_TIMEOUT_S):
            outcomes = await asyncio.gather(*(_propose(registry, g, e) for g, e in chosen), return_exceptions=True)
    except TimeoutError:
        logger.info("offsets_retention_pass_timed_out", partitions=len(chosen))
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    for failure in failures:
        if not isinstance(failure, ClientError):
            raise failure  # a bug: the supervisor logs it and runs the loop again
    removed = sum(o for o in outcomes if isinstance(o, int))
    logger.info("consumer_offsets_expired", partitions=len(chosen), groups_removed=removed,
                     failed=len(failures), as_of_ms=as_of_ms)
    return removed


async def _propose(registry: GroupRegistry, group_id: GroupId, expiry: OffsetsExpire) -> int:
    runtime = registry.groups.get(group_id)
    if runtime is None:  # closed since the choice (topic deleted, replica moved)
        return 0
    (result,) = await runtime.propose([encode_meta(expiry)], EntryKind.META)
    assert result.error is None, "an offsets_expire entry is validated before it is proposed"
    return int(result.count)
