"""JSON in and out of the HTTP API, strict on the way in and unable to fail on the way out.

In: a body must be standard JSON (RFC 8259: no `NaN`, no `Infinity`, no number
that overflows to one) nesting at most `JSON_DEPTH_MAX` levels. The stdlib parser
keeps integers exact (orjson would turn a 30-digit integer into a float, silently
changing a user's value); its C scanner raises `RecursionError` on a body nested
a thousand deep, which is turned into the same 400 as any other bad body.

Out: a stored record value is rendered as JSON only when it parses as standard
JSON within the same depth; it is then embedded byte for byte (`orjson.Fragment`),
so an integer beyond 64 bits and every other detail come back as they were stored.
Anything else comes back base64 (`value_b64`): one producer's odd value can never
make a read of the partition fail (it could, when a value nested 300 deep was
accepted and the renderer's own depth limit refused it on every read).

Work and memory per body are bounded before parsing: the parser's cost is one
Python object per value (a body of empty arrays once held the event loop for
seconds and grew memory by hundreds of MiB; docs/security.md), not per byte, so a
body may hold at most `values_max` values, counted without parsing as its
structural characters (`structure_count`). A body within the bound is parsed with
the cyclic collector paused: the objects are young and all survive the parse, so
collecting during it only rewalks them (several times the parse's own cost for
container-heavy bodies).

The depth walk costs Python work per container, so it runs only when the raw text
holds more brackets than the limit: a document with at most N brackets cannot nest
deeper than N. Record values are checked one by one (`value_too_deep`), so a large
produce body pays the walk only for values that could be too deep.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from multiraft.errors import InvalidRequest, RequestTooLarge

# Kafka has no JSON; Elasticsearch refuses documents nested beyond 20 object levels
# (index.mapping.depth.limit), Jackson's StreamReadConstraints default is 1,000. 64
# keeps every renderer (orjson stops at 254) and every client parser far from its limit.
JSON_DEPTH_MAX = 64
# Values (and object keys) one body may hold; see the module docstring. The default is
# for bodies of fixed shape (settings, assignments, memberships); produce and offset
# commits pass their own (multiraft/http/limits.py).
JSON_VALUES_MAX = 100_000
# Counting is done in slices so that a caller in a worker thread gives the GIL back
# between them (one C call over 16 MiB holds it for 10-40 ms on a loaded box).
_COUNT_SLICE_BYTES = 1 << 20
# Every byte but the structural ones: `bytes.translate` deleting these leaves exactly the
# structural characters, in one pass (four `bytes.count`s take about six times as long).
_NOT_STRUCTURAL = bytes(byte for byte in range(256) if byte not in b"[{,:")


def refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"body is not standard JSON: {name} is not a JSON value")


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequest(f"body is not standard JSON: the number {text[:40]} overflows a double")
    return value


def _bracket_count(text: bytes) -> int:
    return text.count(b"[") + text.count(b"{")


def depth_exceeds(document: Any, limit: int) -> bool:
    """Whether `document` nests more than `limit` containers deep (iterative: no recursion)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            children = node.values()
        elif type(node) is list:
            children = node
        else:
            continue
        if depth > limit:
            return True
        for child in children:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def structure_count(body: bytes) -> int:
    """An upper bound on the values and keys of the JSON text `body`, minus one.

    Every value but the root follows a `[`, a `,` or a `:` and every key a `{` or a
    `,`; a structural character inside a string only makes the bound looser.
    """
    total = 0
    for start in range(0, len(body), _COUNT_SLICE_BYTES):
        total += len(body[start:start + _COUNT_SLICE_BYTES].translate(None, _NOT_STRUCTURAL))
    return total


def check_values(body: bytes, values_max: int) -> None:
    """413 for a body that may hold more than `values_max` values (nothing parsed yet)."""
    # Structural characters are at most the body's length: most bodies skip the count.
    if len(body) > values_max and structure_count(body) > values_max:
        raise RequestTooLarge(f"the body may hold more than {values_max} JSON values (counted as its "
                              "brackets, commas and colons, inside strings too); send fewer or use "
                              "a binary batch")


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for a bounded parse (see the module docstring).

    Only the caller that found it on turns it back on, so a concurrent parse in
    another thread, or a caller that keeps it off, is never overridden.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def loads(body: bytes, *, check_depth: bool = True, values_max: int = JSON_VALUES_MAX) -> Any:
    """Parse a request body strictly; every failure is `InvalidRequest` (400), or
    `RequestTooLarge` (413) for a body of more than `values_max` values.

    `check_depth=False` is for a caller that bounds the depth of every part it keeps
    (produce checks each record value; its other fields have fixed shapes).
    """
    check_values(body, values_max)
    with collector_paused():  # the depth walk allocates a tuple per container: paused too
        try:
            document = json.loads(body, parse_constant=refuse_constant, parse_float=finite_float)
        except RecursionError:
            raise InvalidRequest(f"body nests deeper than {JSON_DEPTH_MAX} levels") from None
        except (ValueError, UnicodeDecodeError) as error:
            raise InvalidRequest(f"body is not valid JSON: {error}") from None
        if check_depth and _bracket_count(body) > JSON_DEPTH_MAX and depth_exceeds(document, JSON_DEPTH_MAX):
            raise InvalidRequest(f"body nests deeper than {JSON_DEPTH_MAX} levels")
    return document


def value_too_deep(encoded: bytes, value: Any, limit: int) -> bool:
    """Whether a record value (`encoded` is its JSON text) nests deeper than `limit`."""
    return _bracket_count(encoded) > limit and depth_exceeds(value, limit)


def stored_value(data: bytes) -> orjson.Fragment | None:
    """A stored value as JSON to embed in an answer, or None if it is not renderable
    (not standard JSON, not UTF-8, or nested beyond JSON_DEPTH_MAX)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if value_too_deep(data, parsed, JSON_DEPTH_MAX):
        return None
    return orjson.Fragment(data)
