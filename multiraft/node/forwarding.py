"""Produce forwarded per leader node: the batches of one request, one RPC per node.

A topic produce spread over N partitions becomes N batches. The node that took the
request proposes the batches of the partitions it leads and forwards the others to
their leaders. Forwarded one RPC per partition, a request over 8 partitions of a
3-node cluster cost up to 8 frames out, 8 served calls and 8 answers (issue 26: 58 %
more CPU than the same records routed by the client). Coalesced, the batches for
the partitions one node leads travel in one `partition.produce_many` call and come
back as one answer holding each partition's outcome:

    request (8 partitions)       node 1 (leads 0, 3, 6)  -> proposed here
      +-- 0 1 2 3 4 5 6 7  --->  node 2 (leads 1, 4, 7)  -> one RPC: [1, 4, 7]
                                 node 3 (leads 2, 5)     -> one RPC: [2, 5]

Every partition still is its own batch, its own proposal, its own outcome: one
partition's failure (no leader, a full inbox, a refused producer) is reported for
that partition only. A call that fails as a whole (the destination is silent, the
answer never came) fails the partitions it carried, with the error a single
forward would have met (NOT_LEADER, retriable, or OUTCOME_UNKNOWN), never the others.

Bounds: one call carries at most `FORWARD_ITEMS_MAX` batches and at most
`FORWARD_BODY_BYTES_MAX` bytes of body (the largest batch, as one forward carried it
before): more is split into several calls (`chunks`). A single batch always fits
alone.

Wire (request body): acks (u8), item count (u32), then per item the group id (u64),
the batch length (u32) and the batch. Answer: a JSON list, in request order, of
either a `ProduceResult`'s fields or the one error body (`multiraft.errors.error_body`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multiraft.errors import InvalidRequest, error_body
from multiraft.node.acks import Acks
from multiraft.node.produce_result import ProduceResult
from multiraft.transport.remote_errors import error_from_body
from raftlog.errors import ClientError, OutcomeUnknown
from raftlog.types import GroupId
from storage.batch import BATCH_BYTES_MAX

METHOD = "partition.produce_many"
# The body of one forwarded call: what one forwarded batch could reach before (a batch
# is at most BATCH_BYTES_MAX), so a coalesced call never needs a larger frame than a
# single forward did (the transport's frame_bytes_max keeps 64 KiB above it).
FORWARD_BODY_BYTES_MAX = BATCH_BYTES_MAX
# Batches in one call: each becomes a produce served concurrently on the leader (the
# RPC layer bounds calls, not what one call fans out to). A request spans at most
# RECORDS_PER_REQUEST_MAX (10,000) partitions; 1,024 of them to one node is one call.
FORWARD_ITEMS_MAX = 1024

_HEADER = struct.Struct(">BI")  # acks code, item count
_ITEM = struct.Struct(">QI")  # group id, batch length


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionBatch:
    """One partition's records of a topic produce, as the edge hands them to the node."""

    partition: int
    batch: bytes

    def __post_init__(self) -> None:
        if type(self.partition) is not int or self.partition < 0:
            raise ValueError(f"partition {self.partition!r} is not a partition number")
        if not self.batch:
            raise ValueError("an empty batch")


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardItem:
    """One partition's batch on its way to the partition's leader."""

    group_id: GroupId
    batch: bytes

    def __post_init__(self) -> None:
        if not 0 <= self.group_id < 2**64:
            raise ValueError(f"group id {self.group_id} out of range")
        if not self.batch:
            raise ValueError("an empty batch")

    @property
    def wire_bytes(self) -> int:
        return _ITEM.size + len(self.batch)


def chunks(items: Sequence[ForwardItem], body_bytes_max: int = FORWARD_BODY_BYTES_MAX,
           items_max: int = FORWARD_ITEMS_MAX) -> list[list[ForwardItem]]:
    """`items` in order, cut into calls of at most `items_max` items whose bodies stay
    within `body_bytes_max`; an item too large to share a call goes alone."""
    assert body_bytes_max > _HEADER.size and items_max >= 1
    result: list[list[ForwardItem]] = []
    current: list[ForwardItem] = []
    size = _HEADER.size
    for item in items:
        if current and (len(current) == items_max or size + item.wire_bytes > body_bytes_max):
            result.append(current)
            current, size = [], _HEADER.size
        current.append(item)
        size += item.wire_bytes
    if current:
        result.append(current)
    return result


def encode_request(acks: Acks, items: Sequence[ForwardItem]) -> bytes:
    assert 1 <= len(items) <= FORWARD_ITEMS_MAX, len(items)
    parts = [_HEADER.pack(acks.code, len(items))]
    for item in items:
        parts.append(_ITEM.pack(item.group_id, len(item.batch)))
        parts.append(item.batch)
    return b"".join(parts)


def decode_request(body: bytes) -> tuple[Acks, list[ForwardItem]]:
    """A peer's call, checked: InvalidRequest for a malformed or oversized one."""
    if len(body) < _HEADER.size:
        raise InvalidRequest("a forwarded produce shorter than its header")
    acks_code, count = _HEADER.unpack_from(body)
    acks = Acks.from_code(acks_code)
    if not 1 <= count <= FORWARD_ITEMS_MAX:
        raise InvalidRequest(f"a forwarded produce of {count} batches (1 to {FORWARD_ITEMS_MAX})")
    items = []
    position = _HEADER.size
    for _ in range(count):
        if position + _ITEM.size > len(body):
            raise InvalidRequest("a forwarded produce cut short")
        group_id, length = _ITEM.unpack_from(body, position)
        position += _ITEM.size
        if length == 0 or position + length > len(body):
            raise InvalidRequest("a forwarded produce's batch length is out of bounds")
        items.append(ForwardItem(group_id=GroupId(group_id), batch=body[position : position + length]))
        position += length
    if position != len(body):
        raise InvalidRequest("a forwarded produce with trailing bytes")
    return acks, items


Outcome = ProduceResult | ClientError


def _outcome_fields(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, ClientError):
        return error_body(outcome)
    return {"base_offset": outcome.base_offset, "count": outcome.count, "duplicate": outcome.duplicate}


def encode_answer(outcomes: Sequence[Outcome]) -> bytes:
    return json.dumps([_outcome_fields(o) for o in outcomes], separators=(",", ":")).encode()


def decode_answer(body: bytes, count: int) -> list[Outcome]:
    """The leader's answer, one outcome per batch sent. A malformed answer means the
    leader may have stored any of them: OUTCOME_UNKNOWN for each, never a wrong offset."""
    try:
        decoded = json.loads(body)
        if not isinstance(decoded, list) or len(decoded) != count:
            raise ValueError(f"a list of {count} outcomes expected")
        return [_decode_outcome(fields) for fields in decoded]
    except (ValueError, TypeError, KeyError, RecursionError) as error:  # JSON and UTF-8 errors are ValueErrors
        unknown = OutcomeUnknown(f"the leader answered a forwarded produce malformed ({error!r})")
        return [unknown] * count


def _decode_outcome(fields: object) -> Outcome:
    if not isinstance(fields, dict):
        raise TypeError(f"an outcome is a JSON object, not {type(fields).__name__}")
    if "error_code" in fields:
        return error_from_body(json.dumps(fields).encode())  # rare: the one path errors take
    return ProduceResult(base_offset=fields["base_offset"], count=fields["count"], duplicate=fields["duplicate"])
