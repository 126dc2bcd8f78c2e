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

The depth walk costs Python work per container, so it runs only when the raw text
holds more brackets than the limit: a document with at most N brackets cannot nest
deeper than N. Record values are checked one by one (`value_too_deep`), so a large
produce body pays the walk only for values that could be too deep.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from multiraft.errors import InvalidRequest

# Kafka has no JSON; Elasticsearch refuses documents nested beyond 20 object levels
# (index.mapping.depth.limit), Jackson's StreamReadConstraints default is 1,000. 64
# keeps every renderer (orjson stops at 254) and every client parser far from its limit.
JSON_DEPTH_MAX = 64


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"body is not standard JSON: {name} is not a JSON value")


def _finite_float(text: str) -> float:
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


def loads(body: bytes, *, check_depth: bool = True) -> Any:
    """Parse a request body strictly; every failure is `InvalidRequest` (400).

    `check_depth=False` is for a caller that bounds the depth of every part it keeps
    (produce checks each record value; its other fields have fixed shapes).
    """
    try:
        document = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
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
