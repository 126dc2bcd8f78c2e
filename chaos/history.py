"""The chaos history: typed operations and their JSON-lines file.

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

File format: one JSON object per line, one line per event, written as it
happens (so a crashed run keeps what was flushed). Invocation lines carry the
operation; completion lines carry only the index and what the answer said:

    {"type":"invoke","index":0,"process":1,"time":3.25,"f":"send","topic":"t","partition":0,"values":[7,8]}
    {"type":"ok","index":0,"process":1,"time":3.31,"offsets":[12,13]}
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

Value = int | str
Record = tuple[int, Value]

# The writer's file buffer. The workload writes from the asyncio loop, where a
# write system call per event (a few hundred per second, polls up to kilobytes)
# would be blocking I/O on the loop; with 1 MiB, one write lands every few
# seconds, and a crashed run loses at most that much of its tail.
WRITE_BUFFER_BYTES = 1 << 20


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

_KIND_OF_CLASS: dict[type, str] = {
    Send: "send",
    Poll: "poll",
    OffsetCommit: "commit",
    OffsetFetch: "fetch",
}


class HistoryWriter:
    """Appends events to a JSON-lines history as the workload runs.

    Cheap enough to call from asyncio tasks inline: one `orjson.dumps` and one
    buffered write per event, no system call (the buffer flushes on `flush`,
    `close` or when full). Misuse (completing an op twice, or as another kind,
    starting a second op on a busy process) is a runner bug and asserts.
    """

    def __init__(self, stream: BinaryIO, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._next_index = 0
        # index -> (kind, process, values sent) of every invoked, not yet completed op.
        self._open: dict[int, tuple[str, int, int]] = {}
        self._busy_processes: set[int] = set()

    @classmethod
    def open(
        cls, path: str | Path, *, clock: Callable[[], float] = time.monotonic
    ) -> HistoryWriter:
        return cls(open(path, "wb", buffering=WRITE_BUFFER_BYTES), clock=clock)

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def invoke_send(
        self,
        process: int,
        key: PartitionKey,
        values: Sequence[Value],
        *,
        producer: ProducerStamp | None = None,
    ) -> int:
        fields: dict[str, Any] = {
            "topic": key.topic,
            "partition": key.partition,
            "values": list(values),
        }
        if producer is not None:
            fields |= {
                "producer_id": producer.producer_id,
                "epoch": producer.epoch,
                "sequence": producer.sequence,
            }
        return self._invoke("send", process, fields, len(values))

    def invoke_poll(
        self, process: int, key: PartitionKey, position: int, *, final: bool = False
    ) -> int:
        fields: dict[str, Any] = {
            "topic": key.topic,
            "partition": key.partition,
            "position": position,
        }
        if final:
            fields["final"] = True
        return self._invoke("poll", process, fields)

    def invoke_commit(self, process: int, group: str, key: PartitionKey, offset: int) -> int:
        fields = {"group": group, "topic": key.topic, "partition": key.partition, "offset": offset}
        return self._invoke("commit", process, fields)

    def invoke_fetch(self, process: int, group: str, key: PartitionKey) -> int:
        return self._invoke(
            "fetch", process, {"group": group, "topic": key.topic, "partition": key.partition}
        )

    def ok_send(
        self, index: int, offsets: Sequence[int | None], *, duplicate: bool = False
    ) -> None:
        open_op = self._open.get(index)
        if open_op is not None and open_op[0] == "send":
            assert open_op[2] == len(offsets), (
                f"op {index}: {open_op[2]} values, {len(offsets)} offsets"
            )
        fields: dict[str, Any] = {"offsets": list(offsets)}
        if duplicate:
            fields["duplicate"] = True
        self._complete(index, "send", Outcome.OK, fields)

    def ok_poll(
        self, index: int, records: Sequence[Record], high_watermark: int, *, node: str | None = None
    ) -> None:
        fields: dict[str, Any] = {"records": list(records), "high_watermark": high_watermark}
        if node is not None:
            fields["node"] = node
        self._complete(index, "poll", Outcome.OK, fields)

    def ok_commit(self, index: int) -> None:
        self._complete(index, "commit", Outcome.OK, {})

    def ok_fetch(self, index: int, offset: int | None) -> None:
        self._complete(index, "fetch", Outcome.OK, {"offset": offset})

    def fail(self, index: int, error: str | None = None) -> None:
        """The op definitely did not happen (the server refused it before applying)."""
        self._complete(index, None, Outcome.FAIL, {} if error is None else {"error": error})

    def info(self, index: int, error: str | None = None) -> None:
        """The op may or may not have happened (timeout, outcome unknown)."""
        self._complete(index, None, Outcome.INFO, {} if error is None else {"error": error})

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        """Flush and close. Ops still open read back as info (outcome unknown)."""
        self._stream.close()

    def _invoke(self, kind: str, process: int, fields: dict[str, Any], values: int = 0) -> int:
        assert process not in self._busy_processes, f"process {process} already has an op open"
        index = self._next_index
        self._next_index += 1
        self._open[index] = (kind, process, values)
        self._busy_processes.add(process)
        event = {
            "type": "invoke",
            "index": index,
            "process": process,
            "time": self._clock(),
            "f": kind,
        }
        self._stream.write(orjson.dumps(event | fields) + b"\n")
        return index

    def _complete(
        self, index: int, kind: str | None, outcome: Outcome, fields: dict[str, Any]
    ) -> None:
        assert index in self._open, f"op {index} is not open"
        open_kind, process, _ = self._open.pop(index)
        if kind is not None:
            assert open_kind == kind, f"op {index} is a {open_kind}, completed as a {kind}"
        self._busy_processes.remove(process)
        event = {"type": str(outcome), "index": index, "process": process, "time": self._clock()}
        self._stream.write(orjson.dumps(event | fields) + b"\n")


def read_history(path: str | Path) -> list[AnyOp]:
    with open(path, "rb") as stream:
        return parse_history(stream)


def parse_history(lines: Iterable[bytes | str]) -> list[AnyOp]:
    """Pair invocations with completions into ops, in index (invocation) order."""
    invocations: dict[int, dict[str, Any]] = {}
    completions: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        event = _load_event(line, number)
        target = invocations if event["type"] == "invoke" else completions
        if event["index"] in target:
            raise HistoryError(f"line {number}: op {event['index']} appears twice")
        target[event["index"]] = event
    for index, completion in completions.items():
        invocation = invocations.get(index)
        if invocation is None:
            raise HistoryError(f"op {index} completes but was never invoked")
        if invocation["process"] != completion["process"]:
            raise HistoryError(f"op {index} completes on another process")
    return [_op(invocations[index], completions.get(index)) for index in sorted(invocations)]


def write_history(stream: BinaryIO, ops: Iterable[AnyOp]) -> None:
    """Write finished ops as the events a `HistoryWriter` would have written, in time order."""
    events: list[tuple[float, int, int, dict[str, Any]]] = []
    for op in ops:
        invocation, completion = _events_of(op)
        events.append((op.invoke_s, 0, op.index, invocation))
        if completion is not None:
            events.append((op.complete_s, 1, op.index, completion))
    events.sort(key=lambda event: event[:3])
    stream.writelines(orjson.dumps(event) + b"\n" for *_, event in events)


_EVENT_TYPES = frozenset(("invoke", "ok", "fail", "info"))
# Exact types: a bool is an int subclass that compares equal to 0 and 1 and would hide a bug.
_VALUE_TYPES = frozenset((int, str))


def _load_event(line: bytes | str, number: int) -> dict[str, Any]:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise HistoryError(f"line {number}: not JSON ({error})") from None
    if type(event) is not dict or event.get("type") not in _EVENT_TYPES:
        raise HistoryError(f"line {number}: not an event")
    if type(event.get("index")) is not int or type(event.get("process")) is not int:
        raise HistoryError(f"line {number}: index and process must be integers")
    return event


def _op(invocation: dict[str, Any], completion: dict[str, Any] | None) -> AnyOp:
    """Build one op; a missing completion means the outcome is unknown forever."""
    if completion is None:
        completion = {"type": "info", "time": math.inf}
    try:
        common = {
            "index": invocation["index"],
            "process": invocation["process"],
            "invoke_s": float(invocation["time"]),
            "complete_s": float(completion["time"]),
            "outcome": Outcome(completion["type"]),
            "error": completion.get("error"),
        }
        builder = _BUILDERS[invocation["f"]]
        return builder(common, invocation, completion)
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, HistoryError):
            raise
        raise HistoryError(f"op {invocation.get('index')}: malformed ({error!r})") from None


def _key(invocation: dict[str, Any]) -> PartitionKey:
    return PartitionKey(invocation["topic"], invocation["partition"])


def _send(common: dict[str, Any], invocation: dict[str, Any], completion: dict[str, Any]) -> Send:
    producer = None
    if "producer_id" in invocation:
        producer = ProducerStamp(
            producer_id=invocation["producer_id"],
            epoch=invocation["epoch"],
            sequence=invocation["sequence"],
        )
    return Send(
        **common,
        key=_key(invocation),
        values=_values(invocation["values"]),
        producer=producer,
        offsets=tuple(completion.get("offsets", ())),
        duplicate=completion.get("duplicate", False),
    )


def _poll(common: dict[str, Any], invocation: dict[str, Any], completion: dict[str, Any]) -> Poll:
    raw = completion.get("records", ())
    # Type checks by `map` and sets run in C: polls carry most of a history's bytes.
    if not set(map(len, raw)) <= {2}:
        raise HistoryError("a record is not an [offset, value] pair")
    if not set(map(type, map(itemgetter(0), raw))) <= {int}:
        raise HistoryError("a record offset is not an int")
    _check_values(list(map(itemgetter(1), raw)))
    return Poll(
        **common,
        key=_key(invocation),
        position=invocation["position"],
        final=invocation.get("final", False),
        records=tuple(map(tuple, raw)),
        high_watermark=completion.get("high_watermark"),
        node=completion.get("node"),
    )


def _values(values: list[Any]) -> tuple[Value, ...]:
    _check_values(values)
    return tuple(values)


def _commit(
    common: dict[str, Any], invocation: dict[str, Any], completion: dict[str, Any]
) -> OffsetCommit:
    return OffsetCommit(
        **common, group=invocation["group"], key=_key(invocation), offset=invocation["offset"]
    )


def _fetch(
    common: dict[str, Any], invocation: dict[str, Any], completion: dict[str, Any]
) -> OffsetFetch:
    return OffsetFetch(
        **common, group=invocation["group"], key=_key(invocation), offset=completion.get("offset")
    )


_BUILDERS: dict[str, Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], AnyOp]] = {
    "send": _send,
    "poll": _poll,
    "commit": _commit,
    "fetch": _fetch,
}


def _check_values(values: list[Any]) -> None:
    if not set(map(type, values)) <= _VALUE_TYPES:
        bad = next(value for value in values if type(value) not in _VALUE_TYPES)
        raise HistoryError(f"value {bad!r} is not an int or a string")


def _events_of(op: AnyOp) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The invocation and completion events of a finished op (None: never completed)."""
    invocation: dict[str, Any] = {
        "type": "invoke",
        "index": op.index,
        "process": op.process,
        "time": op.invoke_s,
        "f": _KIND_OF_CLASS[type(op)],
    }
    invocation |= {"topic": op.key.topic, "partition": op.key.partition}
    completion: dict[str, Any] = {"type": str(op.outcome), "index": op.index, "process": op.process}
    completion["time"] = op.complete_s
    if op.error is not None:
        completion["error"] = op.error
    _add_kind_fields(op, invocation, completion)
    if op.complete_s == math.inf:
        return invocation, None
    return invocation, completion


def _add_kind_fields(op: AnyOp, invocation: dict[str, Any], completion: dict[str, Any]) -> None:
    ok = op.outcome is Outcome.OK
    match op:
        case Send():
            invocation["values"] = list(op.values)
            if op.producer is not None:
                stamp = op.producer
                invocation |= {
                    "producer_id": stamp.producer_id,
                    "epoch": stamp.epoch,
                    "sequence": stamp.sequence,
                }
            if ok:
                completion["offsets"] = list(op.offsets)
            if op.duplicate:
                completion["duplicate"] = True
        case Poll():
            invocation["position"] = op.position
            if op.final:
                invocation["final"] = True
            if ok:
                completion |= {"records": list(op.records), "high_watermark": op.high_watermark}
            if op.node is not None:
                completion["node"] = op.node
        case OffsetCommit():
            invocation |= {"group": op.group, "offset": op.offset}
        case OffsetFetch():
            invocation["group"] = op.group
            if ok:
                completion["offset"] = op.offset
