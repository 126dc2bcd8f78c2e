"""The chaos history: its typed operations.

A history is what the workload saw, nothing more: every operation a logical
client ("process") invoked against the HTTP API and how it completed. The
checker (`chaos/checker.py`) judges the cluster from it alone, so it must
record exactly what the client knew, the way Jepsen does (CHAOS.md 2.1):

- an operation is *invoked*, then *completes* `ok` (it happened), `fail` (it
  definitely did not happen: the server refused it before applying) or `info`
  (indeterminate: a timeout, `OUTCOME_UNKNOWN`, a lost connection). An
  operation whose completion was never written (the runner stopped first) reads
  back as `info`, completing at infinity: its outcome is unknown forever.
- a process runs one operation at a time, so its operations are totally
  ordered; concurrency comes from many processes. An idempotent producer with
  five batches in flight is five processes sharing one producer id.
- times are `time.monotonic()` seconds, taken by the writer at the moment it is
  called, so they order events across processes of one runner.
- values sent to one partition are unique (the workload never reuses one),
  except that an idempotent producer may re-send an ambiguous batch unchanged,
  with the same producer id, epoch and sequence: the server must deduplicate it.

Operation kinds (one partition each; a request that names several partitions
is recorded as one operation per partition with the same times, which is sound
for the per-partition checks because they are local):

- `send`: values appended to one partition. `ok` carries the offset of every
  value (`None` where the server did not say, e.g. `acks=none`) and the
  `duplicate` flag of an idempotent produce answer.
- `poll`: one read of one partition from `position` (committed isolation);
  `ok` carries the `(offset, value)` records in the order returned, the high
  watermark the answering server reported, and which server incarnation
  answered (when known). `final` marks the reads of the last phase, which heals
  everything and reads every partition from offset 0 to its high watermark.
- `commit` / `fetch`: a consumer group's committed offset for one partition,
  written and read back, treated by the checker as a linearizable register.

The history is written as it happens by `chaos/history_writer.py` and read back
(or written whole) by `chaos/history_file.py`, which describes the file format.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

Value = int | str
Record = tuple[int, Value]


class HistoryError(ValueError):
    """A history that breaks its own format or the workload's rules (a runner bug)."""


class Outcome(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class PartitionKey(NamedTuple):
    """A Jepsen *key*: one topic-partition (a NamedTuple: hashing is the hot path)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerStamp:
    """What makes an idempotent send a retry of another: the same three numbers."""

    producer_id: int
    epoch: int
    sequence: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """Fields every operation has. `complete_s` is `math.inf` if it never completed."""

    index: int
    process: int
    invoke_s: float
    complete_s: float
    outcome: Outcome
    error: str | None = None

    def __post_init__(self) -> None:
        if self.index < 0:
            raise HistoryError(f"op {self.index}: negative index")
        if not self.complete_s >= self.invoke_s:
            raise HistoryError(f"op {self.index}: completes before it is invoked")
        if self.complete_s == math.inf and self.outcome is not Outcome.INFO:
            raise HistoryError(f"op {self.index}: an op that never completed must be info")


@dataclass(frozen=True, slots=True, kw_only=True)
class Send(Op):
    key: PartitionKey
    values: tuple[Value, ...]
    producer: ProducerStamp | None = None
    # ok only: one offset per value, None where the answer gave none.
    offsets: tuple[int | None, ...] = ()
    duplicate: bool = False

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        if not self.values:
            raise HistoryError(f"op {self.index}: a send with no values")
        if self.outcome is Outcome.OK:
            if len(self.offsets) != len(self.values):
                raise HistoryError(
                    f"op {self.index}: {len(self.values)} values, {len(self.offsets)} offsets"
                )
        elif self.offsets or self.duplicate:
            raise HistoryError(f"op {self.index}: only an ok send has offsets")
        if self.duplicate and self.producer is None:
            raise HistoryError(f"op {self.index}: only an idempotent send can be a duplicate")


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll(Op):
    key: PartitionKey
    position: int
    final: bool = False
    # ok only.
    records: tuple[Record, ...] = ()
    high_watermark: int | None = None
    # The server incarnation that answered (e.g. "n2#3": node 2, third start), or
    # None if unknown. A high watermark only has to grow within one incarnation.
    node: str | None = None

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        if self.position < 0:
            raise HistoryError(f"op {self.index}: negative position")
        if self.outcome is Outcome.OK:
            if self.high_watermark is None:
                raise HistoryError(f"op {self.index}: an ok poll without its high watermark")
        elif self.records or self.high_watermark is not None:
            raise HistoryError(f"op {self.index}: only an ok poll has records")


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommit(Op):
    group: str
    key: PartitionKey
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetch(Op):
    group: str
    key: PartitionKey
    # ok only: the committed offset read, None if the group has none yet.
    offset: int | None = None

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        if self.outcome is not Outcome.OK and self.offset is not None:
            raise HistoryError(f"op {self.index}: only an ok fetch has an offset")


AnyOp = Send | Poll | OffsetCommit | OffsetFetch
