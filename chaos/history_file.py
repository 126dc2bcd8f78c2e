"""The history file: a chaos history as JSON lines, read back into ops or written whole.

File format: one JSON object per line, one line per event, written as it
happens (so a crashed run keeps what was flushed). Invocation lines carry the
operation; completion lines carry only the index and what the answer said:

    {"type":"invoke","index":0,"process":1,"time":3.25,"f":"send","topic":"t","partition":0,"values":[7,8]}
    {"type":"ok","index":0,"process":1,"time":3.31,"offsets":[12,13]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from chaos import group_events
from chaos.history import (
    AnyOp,
    GroupCommit,
    GroupFetch,
    HistoryError,
    Membership,
    OffsetCommit,
    OffsetFetch,
    Outcome,
    PartitionKey,
    Poll,
    ProducerStamp,
    Send,
    Value,
)

_KIND_OF_CLASS: dict[type, str] = {
    Send: "send",
    Poll: "poll",
    OffsetCommit: "commit",
    OffsetFetch: "fetch",
    Membership: "member",
    GroupFetch: "group-fetch",
    GroupCommit: "group-commit",
}


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
    "member": group_events.build_member,
    "group-fetch": group_events.build_group_fetch,
    "group-commit": group_events.build_group_commit,
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
    completion: dict[str, Any] = {"type": str(op.outcome), "index": op.index, "process": op.process}
    completion["time"] = op.complete_s
    if op.error is not None:
        completion["error"] = op.error
    if isinstance(op, Membership | GroupFetch | GroupCommit):
        invocation |= group_events.invocation_fields(op)
        completion |= group_events.completion_fields(op)
    else:
        invocation |= {"topic": op.key.topic, "partition": op.key.partition}
        _add_kind_fields(op, invocation, completion)
    if op.complete_s == math.inf:
        return invocation, None
    return invocation, completion


def _add_kind_fields(op: Send | Poll | OffsetCommit | OffsetFetch, invocation: dict[str, Any], completion: dict[str, Any]) -> None:
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
