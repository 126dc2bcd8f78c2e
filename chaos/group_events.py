"""The consumer-group ops of a chaos history as JSON events (`chaos/history_file.py`).

Partitions travel as `[topic, partition]` pairs, positions and offsets as
`[topic, partition, offset]`, a fetch's records as `[topic, partition, offset,
value]` and its per-partition reads as `[topic, partition, offset, next_offset,
high_watermark]`: flat lists, because fetches carry most of a group history's bytes.

    {"type":"invoke","index":4,"process":2001,"time":9.5,"f":"member","group":"cg","action":"heartbeat",
     "member_id":"m1","epoch":3,"owned":[["t",0]]}
    {"type":"ok","index":4,"process":2001,"time":9.6,"view":{"member_id":"m1","epoch":4,
     "assigned":[["t",0]],"revoking":[["t",1]]}}
"""

from __future__ import annotations

from typing import Any

from chaos.history import (
    GroupCommit,
    GroupFetch,
    GroupOp,
    HistoryError,
    MemberAction,
    Membership,
    MemberView,
    Outcome,
    PartitionKey,
    PartitionRead,
)


def view_json(view: MemberView) -> dict[str, Any]:
    return {"member_id": view.member_id, "epoch": view.epoch, "assigned": keys_json(view.assigned),
            "revoking": keys_json(view.revoking)}


def keys_json(keys: tuple[PartitionKey, ...] | list[PartitionKey]) -> list[list[Any]]:
    return [[key.topic, key.partition] for key in keys]


def offsets_json(offsets: tuple[tuple[PartitionKey, int], ...] | list[tuple[PartitionKey, int]]) -> list[list[Any]]:
    return [[key.topic, key.partition, offset] for key, offset in offsets]


def _keys(raw: list[Any]) -> tuple[PartitionKey, ...]:
    return tuple(PartitionKey(topic, partition) for topic, partition in raw)


def _offsets(raw: list[Any]) -> tuple[tuple[PartitionKey, int], ...]:
    return tuple((PartitionKey(topic, partition), offset) for topic, partition, offset in raw)


def _view(raw: dict[str, Any] | None) -> MemberView | None:
    if raw is None:
        return None
    return MemberView(member_id=raw["member_id"], epoch=raw["epoch"], assigned=_keys(raw["assigned"]),
                      revoking=_keys(raw.get("revoking", ())))


def build_member(common: dict[str, Any], invocation: dict[str, Any], completion: dict[str, Any]) -> Membership:
    owned = invocation.get("owned")
    return Membership(**common, group=invocation["group"], action=MemberAction(invocation["action"]),
                      member_id=invocation.get("member_id"), epoch=invocation.get("epoch"),
                      topics=tuple(invocation.get("topics", ())), owned=None if owned is None else _keys(owned),
                      session_timeout_ms=invocation.get("session_timeout_ms"),
                      rebalance_timeout_ms=invocation.get("rebalance_timeout_ms"),
                      view=_view(completion.get("view")))


def build_group_fetch(common: dict[str, Any], invocation: dict[str, Any],
                      completion: dict[str, Any]) -> GroupFetch:
    records = []
    for topic, partition, offset, value in completion.get("records", ()):
        if type(offset) is not int or type(value) not in (int, str):
            raise HistoryError(f"op {common['index']}: a fetched record is not [topic, partition, offset, value]")
        records.append((PartitionKey(topic, partition), offset, value))
    reads = tuple(PartitionRead(key=PartitionKey(topic, partition), offset=offset, next_offset=next_offset,
                                high_watermark=high_watermark)
                  for topic, partition, offset, next_offset, high_watermark in completion.get("reads", ()))
    return GroupFetch(**common, group=invocation["group"], member_id=invocation["member_id"],
                      epoch=invocation["epoch"], positions=_offsets(invocation.get("positions", ())),
                      final=invocation.get("final", False), view=_view(completion.get("view")),
                      records=tuple(records), reads=reads)


def build_group_commit(common: dict[str, Any], invocation: dict[str, Any],
                       completion: dict[str, Any]) -> GroupCommit:
    return GroupCommit(**common, group=invocation["group"], member_id=invocation.get("member_id"),
                       epoch=invocation.get("epoch"), offsets=_offsets(invocation["offsets"]),
                       admin_reset=invocation.get("admin_reset", False))


def invocation_fields(op: GroupOp) -> dict[str, Any]:
    """What a `HistoryWriter` writes in the invocation event of `op` (besides the common fields)."""
    match op:
        case Membership():
            fields: dict[str, Any] = {"group": op.group, "action": str(op.action), "member_id": op.member_id,
                                      "epoch": op.epoch}
            if op.topics:
                fields["topics"] = list(op.topics)
            for name in ("session_timeout_ms", "rebalance_timeout_ms"):
                if getattr(op, name) is not None:
                    fields[name] = getattr(op, name)
            if op.owned is not None:
                fields["owned"] = keys_json(op.owned)
            return fields
        case GroupFetch():
            fields = {"group": op.group, "member_id": op.member_id, "epoch": op.epoch,
                      "positions": offsets_json(op.positions)}
            if op.final:
                fields["final"] = True
            return fields
        case GroupCommit():
            fields = {"group": op.group, "member_id": op.member_id, "epoch": op.epoch,
                      "offsets": offsets_json(op.offsets)}
            if op.admin_reset:
                fields["admin_reset"] = True
            return fields


def completion_fields(op: GroupOp) -> dict[str, Any]:
    """What a `HistoryWriter` writes in the completion event of an ok `op`."""
    if op.outcome is not Outcome.OK:
        return {}
    match op:
        case Membership():
            return {} if op.view is None else {"view": view_json(op.view)}
        case GroupFetch():
            assert op.view is not None
            return {"view": view_json(op.view), "records": records_json(op.records),
                    "reads": reads_json(op.reads)}
        case GroupCommit():
            return {}


def records_json(records: Any) -> list[list[Any]]:
    return [[key.topic, key.partition, offset, value] for key, offset, value in records]


def reads_json(reads: Any) -> list[list[Any]]:
    return [[read.key.topic, read.key.partition, read.offset, read.next_offset, read.high_watermark]
            for read in reads]
