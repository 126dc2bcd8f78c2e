"""Partition planning as pure functions: offsets in, the read tasks of a Spark job out.

The driver fetches each partition's state once (`spark_connector.cluster`),
then these functions decide, without I/O:

1. `resolve_ranges`: the fixed [start, end) of every partition. `latest` is the
   high watermark seen at planning (the log end with `isolation=uncommitted`),
   so an export is a repeatable range however much is produced meanwhile.
   A start below the log start means retention removed records: an error by
   default, skipped with a `DataLossWarning` when `failOnDataLoss=false`.
2. `split_ranges`: Spark's Kafka rules. `maxRecordsPerPartition` cuts every
   range into pieces of at most that many records; `minPartitions`, when it
   exceeds the number of ranges, cuts ranges in proportion to their size
   (KafkaOffsetRangeCalculator does the same). Empty ranges are dropped.
3. `assign_servers`: each piece gets a preferred replica, the least loaded (in
   records) of its partition's replicas, so reads spread over every replica
   instead of piling on leaders; the other replicas follow as fallbacks.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from spark_connector.errors import DataLossError, DataLossWarning, OptionError
from spark_connector.options import EARLIEST, LATEST, TopicPartition


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition as the driver saw it at planning (merged over the nodes' views)."""

    topic: str
    partition: int
    replicas: tuple[str, ...]  # HTTP addresses of the replicas, in placement order
    leader: str | None  # HTTP address of the leader, when one is known
    log_start_offset: int
    high_watermark: int
    log_end_offset: int

    def __post_init__(self) -> None:
        assert self.log_start_offset >= 0
        assert self.log_start_offset <= self.log_end_offset
        assert self.high_watermark <= self.log_end_offset

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def upper(self, isolation: str) -> int:
        """The highest end a read may have: the high watermark, or the log end when uncommitted."""
        return self.log_end_offset if isolation == "uncommitted" else self.high_watermark


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    def __post_init__(self) -> None:
        assert 0 <= self.start <= self.end, self

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark input partition: a range and the servers to read it from, preferred first."""

    range: OffsetRange
    servers: tuple[str, ...]


def _describe(state: PartitionState, isolation: str) -> str:
    end_name = "log end" if isolation == "uncommitted" else "high watermark"
    return (f"{state.topic}/{state.partition} holds offsets [{state.log_start_offset}, "
            f"{state.upper(isolation)}) (log start, {end_name})")


def resolve_ranges(states: list[PartitionState], starting: Mapping[TopicPartition, int],
                   ending: Mapping[TopicPartition, int], *, isolation: str = "committed",
                   fail_on_data_loss: bool = True, starting_option: str = "startingOffsets",
                   ending_option: str = "endingOffsets") -> list[OffsetRange]:
    """Concrete [start, end) per partition; `starting`/`ending` hold offsets or EARLIEST/LATEST."""
    ranges = []
    for state in sorted(states, key=lambda s: s.key):
        upper = state.upper(isolation)
        start_spec, end_spec = starting[state.key], ending[state.key]
        start = state.log_start_offset if start_spec == EARLIEST else upper if start_spec == LATEST else start_spec
        end = upper if end_spec == LATEST else end_spec
        assert end_spec != EARLIEST and start >= 0 and end >= 0
        if start > upper:
            raise OptionError(starting_option, f"starts {state.topic}/{state.partition} at {start}, past its "
                                               f"end: {_describe(state, isolation)}")
        if end > upper:
            raise OptionError(ending_option, f"ends {state.topic}/{state.partition} at {end}, past its end: "
                                             f"{_describe(state, isolation)}")
        if start > end:
            raise OptionError(starting_option, f"starts {state.topic}/{state.partition} at {start}, after "
                                               f"its end {end} ({ending_option})")
        if start < state.log_start_offset:
            start = data_lost(state.topic, state.partition, start, state.log_start_offset, end,
                              fail_on_data_loss)
        ranges.append(OffsetRange(state.topic, state.partition, start, end))
    return ranges


def data_lost(topic: str, partition: int, wanted: int, log_start: int, end: int, fail: bool) -> int:
    """Retention removed [wanted, log_start): raise, or warn and return where reading resumes."""
    lost_end = min(log_start, end)
    message = (f"{topic}/{partition}: offsets [{wanted}, {lost_end}) are no longer in the log (retention "
               f"moved its start to {log_start})")
    if fail:
        raise DataLossError(f"{message}. Some data may have been lost; to skip what is gone and read "
                            f"the rest, set the option failOnDataLoss to false")
    warnings.warn(f"{message}; skipped them (failOnDataLoss=false)", DataLossWarning, stacklevel=2)
    return lost_end


def split_ranges(ranges: list[OffsetRange], *, min_partitions: int | None = None,
                 max_records: int | None = None) -> list[OffsetRange]:
    """Pieces of the non-empty ranges per maxRecordsPerPartition and minPartitions, in order."""
    pieces = [r for r in ranges if r.size > 0]
    if max_records is not None:
        assert max_records >= 1
        pieces = [p for r in pieces for p in _cut(r, math.ceil(r.size / max_records))]
    if min_partitions is not None and min_partitions > len(pieces):
        total = sum(p.size for p in pieces)
        pieces = [q for p in pieces for q in _cut(p, math.ceil(p.size * min_partitions / total))]
    return pieces


def _cut(piece: OffsetRange, parts: int) -> list[OffsetRange]:
    """`parts` contiguous pieces of near-equal size covering `piece` exactly."""
    parts = max(1, min(parts, piece.size))
    bounds = [piece.start + piece.size * i // parts for i in range(parts + 1)]
    out = [OffsetRange(piece.topic, piece.partition, a, b) for a, b in itertools.pairwise(bounds)]
    assert out[0].start == piece.start and out[-1].end == piece.end and all(p.size > 0 for p in out)
    return out


def assign_servers(pieces: list[OffsetRange], states: Mapping[TopicPartition, PartitionState],
                   cluster_servers: tuple[str, ...] = ()) -> list[ReadTask]:
    """Each piece read from its least-loaded replica; other replicas, then other nodes, as fallbacks.

    Any node answers a read (a non-replica forwards it), so the other nodes are a
    last resort for when every replica is down or unreachable from the executor.
    """
    load: dict[str, int] = {}
    tasks = []
    for piece in pieces:
        replicas = states[(piece.topic, piece.partition)].replicas
        assert replicas, f"{piece.topic}/{piece.partition} has no replicas"
        preferred = min(replicas, key=lambda server: (load.get(server, 0), replicas.index(server)))
        load[preferred] = load.get(preferred, 0) + piece.size
        fallbacks = [s for s in replicas if s != preferred] + [s for s in cluster_servers if s not in replicas]
        tasks.append(ReadTask(piece, (preferred, *fallbacks)))
    return tasks
