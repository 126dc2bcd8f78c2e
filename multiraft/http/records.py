"""JSON records <-> record batches, in the three formats of DESIGN.md section 6.

- `json`: a value is any JSON document nesting at most `VALUE_DEPTH_MAX` levels,
  stored as its compact JSON text and returned as it was stored; a stored value
  that is not standard JSON within that depth (a binary producer may store anything)
  comes back as `value_b64`, so rendering a read never fails (`jsontext`).
- `string`: UTF-8 text (a stored value that is not UTF-8 comes back as `value_b64`).
- `binary`: base64, for keys, values and header values.
Keys are strings (base64 in `binary`); header values are strings (base64 in
`binary`). Headers are a list of `{"name", "value"}` objects, so a name may
repeat, as Kafka allows.

Parsing is where every record is checked against the limits, so a bad record
fails the whole request before anything is proposed.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from typing import Any

from multiraft.errors import InvalidRequest, MessageTooLarge
from multiraft.http import jsontext
from multiraft.http.limits import HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX
from multiraft.http.params import is_int
from storage.batch import Record, decode_columns, encode_batch

FORMATS = ("json", "string", "binary")
# A value sits at depth 4 of a produce body ({"records": [{"value": ...}]}), so the
# body's limit holds when each value nests at most this deep.
VALUE_DEPTH_MAX = jsontext.JSON_DEPTH_MAX - 3
_RECORD_FIELDS = {"key", "value", "headers", "partition", "timestamp"}


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int | None
    timestamp_ms: int


def _text(value: object, fmt: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string")
    if fmt == "binary":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{what} is not valid base64") from None
    return _utf8(value, what)


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") parses as JSON but is no UTF-8 text
        raise InvalidRequest(f"{what} is not valid Unicode text (a lone surrogate)") from None


# One encoder for every value: json.dumps with options builds a new one per call.
_VALUE_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _value(value: object, fmt: str, what: str) -> bytes | None:
    if value is None:
        return None
    if fmt == "json":
        try:
            encoded = _VALUE_ENCODER.encode(value).encode()
        except RecursionError:
            raise InvalidRequest(f"{what} nests deeper than {VALUE_DEPTH_MAX} levels") from None
        except UnicodeEncodeError:
            raise InvalidRequest(f"{what} is not valid Unicode text (a lone surrogate)") from None
        # A text of at most VALUE_DEPTH_MAX bytes cannot nest deeper: most values skip the check.
        if len(encoded) > VALUE_DEPTH_MAX and jsontext.value_too_deep(encoded, value, VALUE_DEPTH_MAX):
            raise InvalidRequest(f"{what} nests deeper than {VALUE_DEPTH_MAX} levels")
        return encoded
    return _text(value, fmt, what)


def _headers(headers: object, fmt: str, what: str) -> tuple[tuple[str, bytes], ...]:
    if headers is None:
        return ()
    if not isinstance(headers, list) or len(headers) > HEADERS_PER_RECORD_MAX:
        raise InvalidRequest(f"{what}.headers must be a list of at most {HEADERS_PER_RECORD_MAX} items")
    parsed = []
    for header in headers:
        if not isinstance(header, dict) or set(header) - {"name", "value"} or not isinstance(header.get("name"), str):
            raise InvalidRequest(f"{what}.headers items are {{\"name\": string, \"value\": string}}")
        _utf8(header["name"], f"{what}.headers name")
        parsed.append((header["name"], _text(header.get("value", ""), "binary" if fmt == "binary" else "string",
                                             f"{what}.headers value")))
    return tuple(parsed)


def parse_records(records: object, fmt: str, records_max: int, now_ms: int | None = None) -> list[ParsedRecord]:
    """Validate and convert a request's `records` list (every record, or nothing)."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}")
    if not isinstance(records, list) or not records:
        raise InvalidRequest("records must be a non-empty list")
    if len(records) > records_max:
        raise InvalidRequest(f"at most {records_max} records per request, got {len(records)}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    parsed = []
    for i, record in enumerate(records):
        what = f"records[{i}]"
        if not isinstance(record, dict) or set(record) - _RECORD_FIELDS:
            raise InvalidRequest(f"{what} must be an object with fields {sorted(_RECORD_FIELDS)}")
        key = None if record.get("key") is None else _text(record["key"], fmt, f"{what}.key")
        try:
            value = _value(record.get("value"), fmt, f"{what}.value")
        except ValueError as error:  # NaN or infinity in a json value
            raise InvalidRequest(f"{what}.value is not representable as JSON: {error}") from None
        headers = _headers(record.get("headers"), fmt, what)
        partition = record.get("partition")
        if partition is not None and (not is_int(partition) or partition < 0):
            raise InvalidRequest(f"{what}.partition must be a non-negative integer")
        timestamp = record.get("timestamp", now_ms)
        if not is_int(timestamp) or not 0 <= timestamp < 2**62:
            raise InvalidRequest(f"{what}.timestamp must be milliseconds since the epoch")
        size = len(key or b"") + len(value or b"") + sum(len(n) + len(v) for n, v in headers)
        if size > RECORD_BYTES_MAX:
            raise MessageTooLarge(f"{what} is {size} bytes, more than {RECORD_BYTES_MAX}", RECORD_BYTES_MAX)
        parsed.append(ParsedRecord(key, value, headers, partition, timestamp))
    return parsed


def encode_records(records: list[ParsedRecord], *, producer_id: int = -1, producer_epoch: int = -1,
                   base_sequence: int = -1) -> bytes:
    """One batch for records of one partition (timestamps as deltas from the earliest)."""
    first = min(r.timestamp_ms for r in records)
    if max(r.timestamp_ms for r in records) - first >= 2**32:
        raise InvalidRequest("timestamps of one request span more than 49 days")
    batch_records = [Record(r.key, r.value, r.headers, r.timestamp_ms - first) for r in records]
    return encode_batch(batch_records, first_timestamp_ms=first, producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=base_sequence)


def _render(data: bytes | None, fmt: str, name: str, into: dict[str, Any]) -> None:
    if data is None:
        into[name] = None
        return
    if fmt == "json":
        rendered = jsontext.stored_value(data)
        if rendered is not None:
            into[name] = rendered
            return
    elif fmt == "string":
        try:
            into[name] = data.decode()
            return
        except UnicodeDecodeError:
            pass
    else:
        into[name] = base64.b64encode(data).decode()
        return
    into[f"{name}_b64"] = base64.b64encode(data).decode()


def render_batch(base_offset: int, batch: bytes, fmt: str, out: list[dict[str, Any]], limit: int,
                 skip_below: int = 0) -> None:
    """Append a stored batch's records at offsets >= `skip_below` to `out`, at most `limit` in all.

    Decodes only the records it appends (`decode_columns(start, stop)`).
    """
    start = max(0, skip_below - base_offset)
    decoded = decode_columns(batch, start, start + max(0, limit - len(out)))
    first = decoded.header.first_timestamp_ms
    key_format = "binary" if fmt == "binary" else "string"
    for i in range(len(decoded.keys)):
        record: dict[str, Any] = {"offset": base_offset + start + i,
                                  "timestamp": first + decoded.timestamp_deltas_ms[i]}
        _render(decoded.keys[i], key_format, "key", record)
        _render(decoded.values[i], fmt, "value", record)
        record["headers"] = [
            {"name": n, "value": base64.b64encode(v).decode() if fmt == "binary" else v.decode("utf-8", "replace")}
            for n, v in decoded.headers[i]
        ]
        out.append(record)
