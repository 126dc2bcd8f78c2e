"""Reading request input with errors that name the field (400, never a 500).

Handlers never index a body or a query without going through these: each
returns a typed value or raises `InvalidRequest` saying what was wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from multiraft.errors import InvalidRequest, RequestTimeout, RequestTooLarge, UnsupportedMediaType
from multiraft.http import jsontext
from multiraft.http.limits import BODY_READ_TIMEOUT_S, JSON_BYTES_MAX

T = TypeVar("T")
# A JSON body at most this large is decoded on the event loop: the worst such body (empty
# arrays, the costliest values) parses and is checked in a few milliseconds, below what a
# thread hand-off saves. Larger ones go to the worker pool below. (Binary batches use
# 256 KiB, multiraft/node/batch_checks.py: checking one costs ~100x less per byte.)
JSON_INLINE_BYTES_MAX = 16 * 1024
# Two workers: the GIL makes a third add no throughput, and a queue behind two keeps
# one client's large bodies from taking more than the share of the interpreter they get.
_JSON_WORKERS = 2
_json_pool = ThreadPoolExecutor(max_workers=_JSON_WORKERS, thread_name_prefix="raftlog-json")


async def decode_json(body: bytes, decode: Callable[..., T], *args: Any) -> T:
    """`decode(body, *args)`, on the loop for a small body, in the JSON worker pool for a
    larger one. A thread frees the loop only where the work gives the GIL back (Python
    code, between C calls), so a decoder run here splits its C work into short calls
    (multiraft/http/jsonrecords.py, `jsontext.structure_count`)."""
    if len(body) <= JSON_INLINE_BYTES_MAX:
        return decode(body, *args)
    return await asyncio.get_running_loop().run_in_executor(_json_pool, decode, body, *args)


async def read_body(request: web.Request) -> bytes:
    """The whole body, bounded in size (the app's client_max_size) and in time."""
    if request.content.is_eof():  # already received whole (small bodies): nothing to wait for
        return await request.read()
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {BODY_READ_TIMEOUT_S:.0f} s") from None
    except ConnectionError:
        # The client closed before its whole body arrived: its mistake, not ours (no one
        # reads the answer; it must not be logged as a handler failure).
        raise InvalidRequest("the connection closed before the request body was complete") from None


def require_json(request: web.Request, body: bytes,
                 content_types: tuple[str, ...] = ("application/json",)) -> None:
    """415 unless a body (or a declared type) says `Content-Type: application/json` (or,
    on the Confluent dialect's routes, one of its `application/vnd.kafka...+json` types:
    `content_types`).

    A browser sends a cross-site form or `text/plain` POST without asking the server
    first (no CORS preflight), so accepting those would let any web page drive a
    developer's local cluster. No JSON type is CORS-safelisted, so a page must ask first.
    """
    declared = "Content-Type" in request.headers
    if (body or declared) and request.content_type not in content_types:
        raise UnsupportedMediaType(f"expected Content-Type {' or '.join(content_types)}, got {request.content_type}")


async def bounded_body(request: web.Request, bytes_max: int) -> bytes:
    """`read_body`, 413 beyond `bytes_max`: before reading when the length is declared."""
    declared = request.content_length
    if declared is not None and declared > bytes_max:
        raise RequestTooLarge(f"the body is {declared} bytes, more than {bytes_max} for this route")
    body = await read_body(request)
    if len(body) > bytes_max:  # chunked transfer: the length was not declared
        raise RequestTooLarge(f"the body is {len(body)} bytes, more than {bytes_max} for this route")
    return body


async def json_object(request: web.Request, *, required: bool = True, check_depth: bool = True,
                      bytes_max: int = JSON_BYTES_MAX, values_max: int = jsontext.JSON_VALUES_MAX,
                      content_types: tuple[str, ...] = ("application/json",)) -> dict[str, Any]:
    """The body as a JSON object (`jsontext.loads`: standard JSON, bounded depth and
    values), at most `bytes_max` bytes (413), of a JSON content type (415, `require_json`).

    The defaults bound every route's parse; the offset commit passes larger ones
    (produce parses its own, `produce_body`). A body above JSON_INLINE_BYTES_MAX is
    parsed and its depth walked in the worker pool (`decode_json`).
    """
    body = await bounded_body(request, bytes_max)
    if not body and not required:
        return {}
    require_json(request, body, content_types)
    document = await decode_json(body, _loads, check_depth, values_max)
    if not isinstance(document, dict):
        raise InvalidRequest("body must be a JSON object")
    return document


def _loads(body: bytes, check_depth: bool, values_max: int) -> Any:
    return jsontext.loads(body, check_depth=check_depth, values_max=values_max)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_field(document: dict[str, Any], name: str, default: int | None = None, *,
              low: int | None = None, high: int | None = None) -> int:
    value = document.get(name, default)
    if value is None:
        raise InvalidRequest(f"{name} is required")
    if not is_int(value):
        raise InvalidRequest(f"{name} must be an integer")
    _check_range(name, value, low, high)
    return value


def str_field(document: dict[str, Any], name: str, default: str | None = None,
              choices: tuple[str, ...] = ()) -> str:
    value = document.get(name, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} is required and must be a string" if value is None
                             else f"{name} must be a string")
    if choices and value not in choices:
        raise InvalidRequest(f"{name} must be one of {', '.join(choices)}")
    return value


def query_int(request: web.Request, name: str, default: int | None = None, *,
              low: int | None = None, high: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise InvalidRequest(f"query parameter {name} is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer, got {raw[:40]!r}") from None
    _check_range(name, value, low, high)
    return value


def query_str(request: web.Request, name: str, default: str, choices: tuple[str, ...] = ()) -> str:
    value = request.query.get(name, default)
    if choices and value not in choices:
        raise InvalidRequest(f"query parameter {name} must be one of {', '.join(choices)}")
    return value


def path_partition(request: web.Request) -> int:
    raw = request.match_info["partition"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise InvalidRequest(f"partition must be a non-negative integer, got {raw[:40]!r}")
    return int(raw)


def _check_range(name: str, value: int, low: int | None, high: int | None) -> None:
    if low is not None and value < low:
        raise InvalidRequest(f"{name} must be at least {low}")
    if high is not None and value > high:
        raise InvalidRequest(f"{name} must be at most {high}")
