"""Resetting a group's committed offsets (Kafka's `kafka-consumer-groups.sh --reset-offsets`).

Pure: what a reset asks for (`ResetRequest`, checked on construction) and where it
puts one partition (`planned_offset`). The node reads the partitions' bounds, the
committed offsets and, for a time, the offset of that time, then writes the plan
through each partition's own group (multiraft/node/group_admin.py).

Kafka's rules, kept here:
- only while the group has no members (Kafka: "Assignments can only be reset if the
  group is inactive"): a member reading on would overwrite the reset with its next
  commit, or read from where it was regardless;
- every target is clamped to [log start, high watermark] (Kafka warns and clamps an
  offset or a shift that leaves the log); a partition without a committed offset
  shifts from the log start;
- a dry run shows the plan and changes nothing (the tool's default without --execute).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from multiraft.consumer_groups.commands import PARTITION_MAX, TOPIC_NAME_PATTERN, is_int
from multiraft.errors import InvalidRequest

# Partitions one reset may name: each may cost a binary search of reads (by time), so a
# reset stays one request's bounded work (a bigger group resets in several calls).
RESET_PARTITIONS_MAX = 1_000
RESET_TOPICS_MAX = 100
OFFSET_MAX = 2**63 - 1
# Times are Unix milliseconds; 0 to year 9999.
TIMESTAMP_MS_MAX = 253_402_300_799_999


class ResetStrategy(enum.Enum):
    EARLIEST = "earliest"  # the log start
    LATEST = "latest"  # the high watermark: nothing left to read
    OFFSET = "offset"  # `value`, clamped
    TIMESTAMP = "timestamp"  # the first offset whose record is at or after `value` ms
    SHIFT = "shift"  # the committed offset plus `value` (negative: back), clamped


# The strategies that need a `value`, and its range (the OpenAPI document says the same).
RESET_VALUE_RANGES: dict[ResetStrategy, tuple[int, int]] = {
    ResetStrategy.OFFSET: (0, OFFSET_MAX), ResetStrategy.TIMESTAMP: (0, TIMESTAMP_MS_MAX),
    ResetStrategy.SHIFT: (-OFFSET_MAX, OFFSET_MAX)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetTopic:
    """A topic, and its partitions (None: every partition the topic has)."""

    topic: str
    partitions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not TOPIC_NAME_PATTERN.fullmatch(self.topic):
            raise InvalidRequest(f"topic names must match {TOPIC_NAME_PATTERN.pattern}")
        if self.partitions is None:
            return
        if not isinstance(self.partitions, tuple) or not 1 <= len(self.partitions) <= RESET_PARTITIONS_MAX:
            raise InvalidRequest(f"partitions lists 1..{RESET_PARTITIONS_MAX} partition numbers")
        for partition in self.partitions:
            if not is_int(partition) or not 0 <= partition <= PARTITION_MAX:
                raise InvalidRequest(f"a partition number is 0..{PARTITION_MAX}")
        if len(set(self.partitions)) != len(self.partitions):
            raise InvalidRequest("partitions lists each partition once")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetRequest:
    group: str
    strategy: ResetStrategy
    value: int | None  # the offset, the time (ms) or the shift; None for earliest and latest
    topics: tuple[ResetTopic, ...]
    execute: bool = False  # False: a dry run, the plan only

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, ResetStrategy):
            raise InvalidRequest(f"strategy is one of {', '.join(s.value for s in ResetStrategy)}")
        if self.strategy in RESET_VALUE_RANGES:
            _check_value(self.strategy, self.value)
        elif self.value is not None:
            raise InvalidRequest(f"a reset to {self.strategy.value} takes no value")
        if not isinstance(self.topics, tuple) or not 1 <= len(self.topics) <= RESET_TOPICS_MAX:
            raise InvalidRequest(f"a reset names 1..{RESET_TOPICS_MAX} topics")
        names = [t.topic for t in self.topics]
        if len(set(names)) != len(names):
            raise InvalidRequest("a reset names each topic once")
        if not isinstance(self.execute, bool):
            raise InvalidRequest("execute is true or false")


def _check_value(strategy: ResetStrategy, value: object) -> None:
    low, high = RESET_VALUE_RANGES[strategy]
    if not is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise InvalidRequest(f"a reset to {strategy.value} needs a value in [{low}, {high}]")


def planned_offset(request: ResetRequest, committed: int | None, start: int, end: int,
                   at_time: int | None = None) -> int:
    """Where the reset puts one partition whose log holds [start, end) and whose group
    offset is `committed` (None: none yet). `at_time`: for a reset to a time, the first
    offset at or after it (the node's lookup; `end` when every record is older)."""
    assert 0 <= start <= end, "a log's start is at most its high watermark"
    strategy = request.strategy
    if strategy is ResetStrategy.EARLIEST:
        wanted = start
    elif strategy is ResetStrategy.LATEST:
        wanted = end
    elif strategy is ResetStrategy.OFFSET:
        assert request.value is not None
        wanted = request.value
    elif strategy is ResetStrategy.SHIFT:
        assert request.value is not None
        wanted = (committed if committed is not None else start) + request.value
    else:
        assert strategy is ResetStrategy.TIMESTAMP and at_time is not None, "a reset to a time needs its offset"
        wanted = at_time
    return min(max(wanted, start), end)
