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

Consumer group members (KIP-848 over HTTP; the workload in
`chaos/group_workload.py`, the checks in `chaos/group_checks.py`); a member is
named by its member id, and a process that joins again is a new member:

- `member`: a join (with its subscription), a heartbeat (with what the member
  said it `owned`) or a leave. An ok join or heartbeat carries what the member
  was told (`MemberView`: its epoch, its assignment, what it must give back).
- `group-fetch`: a member's fetch of records from its partitions. `ok` carries
  what it was told, the records `(partition, offset, value)` and, per partition
  read, where the read started and where it ended (`next_offset`). `final`
  marks the last phase's drain.
- `group-commit`: a member's (or an admin reset's) commit of offsets for several
  partitions at once; checked as one register write per partition.

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


class MemberAction(enum.StrEnum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberView:
    """What a join, heartbeat or fetch answer told a member: the partitions it may read
    and commit at `epoch` (its member epoch), and those it must give back."""

    member_id: str
    epoch: int
    assigned: tuple[PartitionKey, ...]
    revoking: tuple[PartitionKey, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Membership(Op):
    group: str
    action: MemberAction
    member_id: str | None  # None: a join that lets the server draw the id
    epoch: int | None = None  # the member epoch sent (heartbeat, leave)
    topics: tuple[str, ...] = ()  # a join's subscription
    # A join's settings as sent (the group's first join sets its session timeout).
    session_timeout_ms: int | None = None
    rebalance_timeout_ms: int | None = None
    owned: tuple[PartitionKey, ...] | None = None  # a heartbeat's `owned`
    view: MemberView | None = None  # ok join or heartbeat only

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        answers = self.outcome is Outcome.OK and self.action is not MemberAction.LEAVE
        if answers != (self.view is not None):
            raise HistoryError(f"op {self.index}: an ok join or heartbeat, and only it, has a view")
        if self.action is MemberAction.JOIN and not self.topics:
            raise HistoryError(f"op {self.index}: a join without a subscription")
        if self.action is not MemberAction.JOIN and (self.member_id is None or self.epoch is None):
            raise HistoryError(f"op {self.index}: a {self.action} names its member and epoch")


GroupRecord = tuple[PartitionKey, int, Value]  # (partition, offset, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRead:
    """One partition of a member's fetch: where its read started and ended."""

    key: PartitionKey
    offset: int
    next_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupFetch(Op):
    group: str
    member_id: str
    epoch: int
    positions: tuple[tuple[PartitionKey, int], ...] = ()  # sent
    final: bool = False
    # ok only:
    view: MemberView | None = None
    records: tuple[GroupRecord, ...] = ()
    reads: tuple[PartitionRead, ...] = ()

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        if (self.outcome is Outcome.OK) != (self.view is not None):
            raise HistoryError(f"op {self.index}: an ok fetch, and only it, has a view")
        if self.outcome is not Outcome.OK and (self.records or self.reads):
            raise HistoryError(f"op {self.index}: only an ok fetch has records")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCommit(Op):
    group: str
    member_id: str | None  # None with `admin_reset`
    epoch: int | None
    offsets: tuple[tuple[PartitionKey, int], ...]
    admin_reset: bool = False

    def __post_init__(self) -> None:
        Op.__post_init__(self)
        if not self.offsets:
            raise HistoryError(f"op {self.index}: a commit of nothing")
        if not self.admin_reset and (self.member_id is None or self.epoch is None):
            raise HistoryError(f"op {self.index}: a member's commit names its member and epoch")


GroupOp = Membership | GroupFetch | GroupCommit
AnyOp = Send | Poll | OffsetCommit | OffsetFetch | Membership | GroupFetch | GroupCommit
