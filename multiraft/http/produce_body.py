"""A JSON produce body turned into records, large ones in a worker thread.

A produce body may be 16 MiB. Turning it into records is a parse (`json.loads`, C)
then Python work per record (`parse_records`: encode each value, check limits). Done
on the event loop, a body of empty arrays once held it for seconds and a legitimate
10,000-record body for tens of milliseconds, during which no heartbeat of any group
went out (docs/security.md, "The event loop").

What bounds it now:
- The parse is bounded before it starts: at most `JSON_BULK_VALUES_MAX` values per
  body (`jsontext.check_values`, a count of structural characters), so a body of
  empty containers is refused in milliseconds, and the parse that does run builds at
  most that many objects (memory and time per request both bounded).
- A body above `params.JSON_INLINE_BYTES_MAX` (16 KiB) is handled in the bounded JSON
  worker pool (`params.decode_json`). A thread alone would not
  free the loop: `json.loads` is one C call, and the stdlib scanner and orjson alike
  hold the GIL throughout (measured: a second thread made no progress during
  either). So everything the worker does is split into short C calls with Python
  between them, where the interpreter hands the GIL to the loop every switch
  interval (5 ms): the structural count runs in 1 MiB slices, the parse one record
  at a time (`jsonrecords`), and `parse_records` is Python. The longest call left
  is one record's parse, bounded by the values bound. docs/security.md has the
  figures (bench/json_bodies.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http import jsonrecords, jsontext
from multiraft.http.limits import JSON_BULK_VALUES_MAX, RECORDS_PER_REQUEST_MAX, REQUEST_BYTES_MAX
from multiraft.http.params import bounded_body, decode_json, int_field, require_json, str_field
from multiraft.http.records import ParsedRecord, encode_records, parse_records
from multiraft.node.api import Acks

ACKS = tuple(a.value for a in Acks)
TOPIC_FIELDS = frozenset({"format", "acks", "records"})
PARTITION_FIELDS = TOPIC_FIELDS | {"producer_id", "producer_epoch", "base_sequence"}
_IDEMPOTENT = ("producer_id", "producer_epoch", "base_sequence")


@dataclass(frozen=True, slots=True)
class ProduceBody:
    records: list[ParsedRecord]
    acks: str
    batch: bytes | None  # a partition produce's one batch, with the idempotent-producer fields


def _decode(body: bytes, allowed: frozenset[str], acks_default: str, encode: bool) -> ProduceBody:
    """Parse, check and convert (and for one partition, encode): every failure a ClientError.

    With the cyclic collector paused throughout: the objects made here are bounded (the
    values bound) and form no cycles, while a collection triggered by them would walk
    every one of them in one C call (tens of milliseconds for a 10,000-record body).
    """
    with jsontext.collector_paused():
        return _decode_paused(body, allowed, acks_default, encode)


def _decode_paused(body: bytes, allowed: frozenset[str], acks_default: str, encode: bool) -> ProduceBody:
    document = jsonrecords.loads(body, values_max=JSON_BULK_VALUES_MAX)  # parse_records bounds each depth
    if not isinstance(document, dict):
        raise InvalidRequest("body must be a JSON object")
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise InvalidRequest(f"unknown fields {unknown}")
    fmt = str_field(document, "format", "json")
    acks = str_field(document, "acks", acks_default, ACKS)
    records = parse_records(document.get("records"), fmt, RECORDS_PER_REQUEST_MAX)
    if not encode:
        return ProduceBody(records, acks, None)
    return ProduceBody(records, acks, encode_records(records, **_producer(document)))


def _producer(document: dict[str, Any]) -> dict[str, int]:
    present = [name in document for name in _IDEMPOTENT]
    if not any(present):
        return {}
    if not all(present):
        raise InvalidRequest("producer_id, producer_epoch and base_sequence go together")
    return {
        "producer_id": int_field(document, "producer_id", low=0, high=2**63 - 1),
        "producer_epoch": int_field(document, "producer_epoch", low=0, high=2**15 - 1),
        "base_sequence": int_field(document, "base_sequence", low=0, high=2**31 - 1),
    }


async def produce_body(request: web.Request, *, partition: bool, acks_default: str = "quorum") -> ProduceBody:
    """The request's records (every one checked) and acks; for `partition`, also the
    encoded batch with the idempotent-producer fields."""
    body = await bounded_body(request, REQUEST_BYTES_MAX)
    require_json(request, body)
    allowed = PARTITION_FIELDS if partition else TOPIC_FIELDS
    return await decode_json(body, _decode, allowed, acks_default, partition)
