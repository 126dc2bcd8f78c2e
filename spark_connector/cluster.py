"""What the driver asks the cluster at planning, through the public HTTP client.

`plan` resolves the subscription to partitions, takes each partition's state
once (merged over the views of every alive node: the leader's offsets when it
answers, else the highest high watermark and log start any replica reports),
turns timestamps into offsets, and hands the numbers to the pure functions of
`spark_connector.planning`. Nothing here runs on executors.

Offsets by timestamp: the API has no time index, so `offset_for_timestamp`
binary-searches the log, one small read per probe (log2 of the batch count,
about 20 reads for a million batches). Like Kafka's time index it assumes the
timestamps of a partition do not decrease (true for one producer's clock); the
answer is the first offset whose timestamp is at or after the one asked for.
"""

from __future__ import annotations

import re
from typing import Any

from multiraft.client import AsyncClient, RaftlogError, normalize
from spark_connector.decode import record_timestamps
from spark_connector.errors import ConnectorError, OptionError
from spark_connector.options import (
    EARLIEST,
    LATEST,
    Bound,
    ReadOptions,
    Subscription,
    TopicPartition,
)
from spark_connector.planning import (
    PartitionState,
    ReadTask,
    assign_servers,
    resolve_ranges,
    split_ranges,
)


async def subscribed_partitions(client: AsyncClient, subscription: Subscription) -> dict[str, list[int]]:
    """{topic: partitions} the subscription names; unknown topics and partitions are errors."""
    listed = {t["name"]: int(t["partitions"]) for t in await client.list_topics()}
    if subscription.pattern is not None:
        pattern = re.compile(subscription.pattern)
        topics = sorted(t for t in listed if pattern.fullmatch(t))
        if not topics:
            raise OptionError(subscription.option, f"{subscription.pattern!r} matches no topic "
                                                   f"(topics: {', '.join(sorted(listed)) or 'none'})")
        return {t: list(range(listed[t])) for t in topics}
    wanted = subscription.topics or tuple(subscription.assignment)
    for topic in wanted:
        if topic not in listed:
            raise OptionError(subscription.option, f"no topic {topic!r} in the cluster")
    if subscription.topics:
        return {t: list(range(listed[t])) for t in subscription.topics}
    for topic, partitions in subscription.assignment.items():
        missing = [p for p in partitions if p >= listed[topic]]
        if missing:
            raise OptionError(subscription.option, f"topic {topic!r} has {listed[topic]} partitions; "
                                                   f"there is no partition {missing[0]}")
    return {t: list(ps) for t, ps in subscription.assignment.items()}


def merge_views(topic: str, partition: int, views: list[dict[str, Any]], addresses: dict[int, str]) -> PartitionState:
    """One state from the nodes' views: the leader's offsets when it answered, else the highest."""
    hosted = [v for v in views if v.get("high_watermark") is not None]
    if not hosted:
        raise ConnectorError(f"{topic}/{partition}: no replica answered with its offsets (are its nodes down?)")
    leader_views = [v for v in hosted if v.get("role") == "leader"]
    chosen = leader_views[0] if leader_views else max(hosted, key=lambda v: (v["high_watermark"],
                                                                              v["log_end_offset"]))
    replicas = tuple(normalize(addresses[r]) for r in views[0]["replicas"] if r in addresses)
    leader_id = chosen.get("leader") or next((v["leader"] for v in views if v.get("leader")), None)
    high_watermark = max(v["high_watermark"] for v in hosted)
    log_start = chosen["log_start_offset"] if leader_views else max(v["log_start_offset"] for v in hosted)
    log_end = max(chosen["log_end_offset"], high_watermark)
    return PartitionState(topic, partition, replicas or tuple(normalize(a) for a in addresses.values()),
                          normalize(addresses[leader_id]) if leader_id in addresses else None,
                          min(log_start, high_watermark), high_watermark, log_end)


async def partition_states(client: AsyncClient, partitions: dict[str, list[int]]) -> dict[TopicPartition, PartitionState]:
    addresses = await client.node_addresses()
    states = {}
    for topic, numbers in partitions.items():
        views = await client.partition_views(topic)
        for number in numbers:
            states[(topic, number)] = merge_views(topic, number, views.get(number, []), addresses)
    return states


# Reads one probe of the search makes past offsets that hold no record (a filtered mirror's
# gap batches, which reads leave out: the read's next offset jumps) before it stops there; after
# the first (1 byte: the batch at the offset) each reads PROBE_READ_BYTES, about 1,800 gaps.
PROBE_READS_MAX = 64
PROBE_READ_BYTES = 64 * 1024


async def _probe(client: AsyncClient, state: PartitionState, middle: int, high: int, isolation: str,
                 server: str) -> tuple[int, bytes] | int | None:
    """The first batch holding a record at or after `middle`; None when there is none below
    `high`; the offset it stopped at (an int: no record in [middle, it), nor known after)
    when PROBE_READS_MAX reads met only offsets without records."""
    position, max_bytes = middle, 1
    for _ in range(PROBE_READS_MAX):
        read = await client.consume_batches(state.topic, state.partition, position, max_records=1,
                                            max_bytes=max_bytes, isolation=isolation, server=server)
        batch = next(((b, data) for b, data in read.batches if b + record_timestamps(data)[0] > position), None)
        if batch is not None and batch[0] >= high:
            return None  # past gaps, but at or past the end searched: none below it
        if batch is not None or read.batches or read.next_offset <= position or read.next_offset >= high:
            return batch
        position, max_bytes = read.next_offset, PROBE_READ_BYTES  # only offsets without records: on
    return position


async def offset_for_timestamp(client: AsyncClient, state: PartitionState, timestamp_ms: int,
                               isolation: str = "committed") -> int | None:
    """The first offset in the partition whose record timestamp is >= `timestamp_ms`; None if none.

    Invariant of the search: every record in [log start, low) is older than the
    timestamp, and the answer (if any) is at or below `high`. Offsets without records
    (a filtered mirror's gaps) are passed: a probe in a run of them reads on to the next
    record (taking "no record at `middle`" for "none after it" moved `high` below older
    records, which startingTimestamp then included). A probe that stops in a run longer
    than its bound moves `high` to `middle`: the conservative side, older records may be
    included, none at or after the timestamp left out.
    """
    low, high = state.log_start_offset, state.upper(isolation)
    server = state.leader or state.replicas[0]
    found_any = False
    while low < high:
        middle = (low + high) // 2
        batch = await _probe(client, state, middle, high, isolation, server)
        if batch is None or isinstance(batch, int):  # none at or after `middle` below the end (or unknown)
            high = middle
            continue
        base, data = batch
        count, stamps = record_timestamps(data)
        first = max(base, low)
        last = min(base + count, high)
        hits = [o for o in range(first, last) if stamps[o - base] >= timestamp_ms]
        if not hits:
            low = max(last, middle + 1)
        elif hits[0] == first and base > low:
            # Older records may precede this batch; [middle, base) holds none, so `middle`
            # answers as `base` does (and the search moves even when the batch lies past it).
            high, found_any = min(base, middle), True
        else:
            return hits[0]
    return low if found_any or low < state.upper(isolation) else None


async def concrete_offsets(client: AsyncClient, bound: Bound, states: dict[TopicPartition, PartitionState],
                    options: ReadOptions, side: str) -> dict[TopicPartition, int]:
    """Offsets (or EARLIEST/LATEST) per partition for one side, timestamps looked up."""
    out: dict[TopicPartition, int] = {}
    unknown = sorted(bound.named_partitions() - set(states))
    if unknown:
        raise OptionError(bound.option, f"names {unknown[0][0]}/{unknown[0][1]}, which is not read "
                                        f"(not in the topic or the subscription)")
    for key, state in states.items():
        timestamp = bound.timestamp_ms if bound.timestamp_ms is not None else bound.timestamps_ms.get(key)
        if timestamp is None:
            out[key] = bound.offsets.get(key, bound.default)
            continue
        offset = await offset_for_timestamp(client, state, timestamp, options.isolation)
        if offset is None and side == "starting" and options.timestamp_strategy == "error":
            raise OptionError(bound.option, f"{key[0]}/{key[1]} has no record at or after timestamp "
                                            f"{timestamp} ms (set startingOffsetsByTimestampStrategy to "
                                            f"latest to start at the end instead)")
        out[key] = LATEST if offset is None else offset
    return out


async def plan(options: ReadOptions) -> list[ReadTask]:
    """The read tasks of one query: ranges fixed now, split, spread over replicas."""
    async with AsyncClient(list(options.servers), timeout_s=30.0, attempts=6) as client:
        try:
            partitions = await subscribed_partitions(client, options.subscription)
            states = await partition_states(client, partitions)
            starting = await concrete_offsets(client, options.starting, states, options, "starting")
            ending = await concrete_offsets(client, options.ending, states, options, "ending")
            cluster_servers = tuple(normalize(a) for a in (await client.node_addresses()).values())
        except RaftlogError as error:
            raise ConnectorError(f"planning the read of {options.subscription.option} failed: "
                                 f"{error.code}: {error.message}") from error
    assert all(v != EARLIEST for v in ending.values())
    ranges = resolve_ranges(list(states.values()), starting, ending, isolation=options.isolation,
                            fail_on_data_loss=options.fail_on_data_loss,
                            starting_option=options.starting.option, ending_option=options.ending.option)
    pieces = split_ranges(ranges, min_partitions=options.min_partitions,
                          max_records=options.max_records_per_partition)
    return assign_servers(pieces, states, cluster_servers)
