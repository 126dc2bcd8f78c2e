"""The checks of a mirror following its source (chaos/mirror_follow.py): a partition
increase, and a resync after the source's retention truncated past the mirror. Pure
functions over what the run read at its end.

- `mirror-not-grown`: the source topic has more partitions than its mirror once the
  bounded wait at the end is over (discovery grows a mirror within a round, about a
  second, docs/mirror.md "A mirror topic follows its source's partition increase").
  A mirror with *more* partitions than its source is `mirror-differs`. The partitions
  both sides have are compared as any mirror partition (`compare_logs`: offsets, bytes,
  values), the grown ones from their first offset on.
- `mirror-resync-stuck`: a partition of the `resync` link that its status does not
  report `running` at the end (still `source_truncated`, `backing_off`, ...), or whose
  sink log ends below the source's log start (it holds only offsets the source deleted:
  it never resynced). Its content is compared from the source's log start to its end
  (`compare_logs`: mirror-lost, mirror-differs, mirror-duplicate, mirror-incomplete);
  what the mirror held below the source's log start (the old incarnation's copy, or the
  new one's first offsets that the source's retention deleted since) is not judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chaos.anomalies import Anomaly, anomaly, listing
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy, compare_logs


def check_grown(topic: str, source_count: int, sink_count: int, source: Mapping[PartitionKey, LogCopy],
                sink: Mapping[PartitionKey, LogCopy | None], waited_s: float = 0.0) -> list[Anomaly]:
    """`source_count`/`sink_count`: the topic's partitions on each side at the end;
    `source`/`sink`: the logs read (a partition the sink lacks is not in `sink`)."""
    found: list[Anomaly] = []
    if sink_count < source_count:
        missing = list(range(sink_count, source_count))
        found.append(anomaly("mirror-not-grown", PartitionKey(topic, sink_count),
                             f"the sink's mirror of {topic} has {sink_count} partitions, the source {source_count}, "
                             f"after {waited_s:.0f} s (partitions {listing(missing)} not mirrored)", ()))
    if sink_count > source_count:
        found.append(anomaly("mirror-differs", PartitionKey(topic, source_count),
                             f"the sink's mirror of {topic} has {sink_count} partitions, more than the source's "
                             f"{source_count}", ()))
    for key in sorted(source):
        if key.partition >= sink_count:
            continue  # not grown: said above
        theirs = sink.get(key)
        if theirs is None:
            found.append(anomaly("mirror-incomplete", key, f"the sink's copy was not read in {waited_s:.0f} s; "
                                 f"source end {source[key].high_watermark}", ()))
            continue
        found += compare_logs(key, source[key], theirs, waited_s)
    return found


def from_offset(copy: LogCopy, start: int) -> LogCopy:
    """`copy` from offset `start` on: the batches (and skipped ones) based below it left out."""
    if copy.log_start >= start:
        return copy
    return LogCopy(start, copy.high_watermark, tuple((b, d) for b, d in copy.batches if b >= start),
                   tuple(r for r in copy.skipped if r[0] >= start))


def check_resynced(key: PartitionKey, source: LogCopy, sink: LogCopy | None, state: str, last_error: str | None,
                   waited_s: float = 0.0) -> list[Anomaly]:
    """One partition of the resync link: `state`/`last_error` as the link's status gave
    them last (`unknown`: no status named it)."""
    found: list[Anomaly] = []
    if state != "running":
        found.append(anomaly("mirror-resync-stuck", key, f"the link reports the partition {state}, not running, "
                             f"after {waited_s:.0f} s (last error: {last_error})", ()))
    if sink is None:
        found.append(anomaly("mirror-incomplete", key, f"the sink's copy was not read in {waited_s:.0f} s; "
                             f"source log {source.log_start}..{source.high_watermark}", ()))
        return found
    if sink.high_watermark < source.log_start:
        found.append(anomaly("mirror-resync-stuck", key, f"the sink's log ends at {sink.high_watermark}, below the "
                             f"source's log start {source.log_start}: it holds only offsets the source deleted "
                             f"(never resynced)", ()))
    return found + compare_logs(key, source, from_offset(sink, source.log_start), waited_s)


def count_events(lines: Iterable[dict[str, Any]], topics: Iterable[str]) -> dict[str, int]:
    """From the sink nodes' JSON log lines: the mirror growths (`mirror_topic_grown`) and
    the resyncs after a truncation (`mirror_source_truncated_resync`, the resyncs that
    replaced an incarnation) of `topics`. The logs are appended across restarts, so this
    counts what the link's status (each node's memory) forgets when a sink node restarts."""
    wanted = set(topics)
    counts = {"grown": 0, "resynced": 0}
    for entry in lines:
        if entry.get("topic") not in wanted:
            continue
        if entry.get("event") == "mirror_topic_grown":
            counts["grown"] += 1
        elif entry.get("event") == "mirror_source_truncated_resync":
            counts["resynced"] += 1
    return counts


def summary_part(follow: Mapping[str, Any]) -> str:
    """`follow: chaos-grow 1 -> 5 partitions in 3 grows (sink: 5, 3 growths logged), 2/2
    truncated partitions identical from the source's log start, 2 truncations (2 settled),
    2 resyncs logged`; with no grow or no resync logged, in capitals, so a run that claims
    to test them and did not cannot pass unnoticed."""
    grows, resyncs = follow["grows"], follow["events"]["resynced"]
    text = (f"{follow['grow_topic']} {follow['grow_from']} -> {follow['source_partitions']} partitions in {grows} "
            f"grows (sink: {follow['sink_partitions']}, {follow['events']['grown']} growths logged), "
            f"{follow['resync_identical']}/{follow['resync_compared']} truncated partitions identical from the "
            f"source's log start, {follow['truncations']} truncations ({follow['settled']} settled), "
            f"{resyncs} resyncs logged")
    if grows == 0 or resyncs == 0:
        return f"follow: NOT EXERCISED ({'no grow' if grows == 0 else 'no resync'}): {text}"
    return f"follow: {text}"
