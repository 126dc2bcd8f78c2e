"""The HTTP boundary's errors and the one middleware that shapes every error answer.

Every failure leaves the server as `{"error_code", "message"}` with the status of
the one error table (`multiraft.errors.error_table`), the way h11 turns local
errors into remote ones at a single place. The conditions only HTTP has (unknown
route, body too large, wrong content type, a client too slow to send its body, a
foreign web origin) are defined in `multiraft.errors` with every other code, so the
table is the same in every process, a client's included.

The Confluent REST v2 dialect's paths (`/topics`, `/brokers`, `/consumers/...`) answer in
Confluent's shape instead, `{"error_code": <int>, "message"}`, through the one mapping of
multiraft/http/confluent_errors.py.

A `NotLeader` answer also carries the leader's id and HTTP address in headers
(`Raftlog-Leader-Id`, `Raftlog-Leader`), so a client can go straight there
without a body shape of its own.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from multiraft.errors import (  # the HTTP-only conditions live with the others, in the one table's module
    InvalidBatch,
    InvalidRequest,
    MethodNotAllowed,
    RequestTooLarge,
    RouteNotFound,
    Timeout,
    Unauthenticated,
    answered,
    error_body,
)
from multiraft.http.confluent_errors import (
    V2_JSON,
    confluent_body,
    confluent_error,
    is_confluent_path,
)
from raftlog.errors import ClientError, NotLeader
from storage.errors import InvalidBatchError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_logger = structlog.get_logger("multiraft.http")


def _http_exception_error(exception: web.HTTPException) -> ClientError:
    if isinstance(exception, web.HTTPRequestEntityTooLarge):
        return RequestTooLarge(exception.text or "request body too large")
    if isinstance(exception, web.HTTPNotFound):
        return RouteNotFound("no such resource")
    if isinstance(exception, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"method not allowed; allowed: {', '.join(sorted(exception.allowed_methods))}")
    error = InvalidRequest(exception.reason or "bad request")
    error.http_status = exception.status if 400 <= exception.status < 500 else 400
    return error


def error_response(request: web.Request, error: ClientError) -> web.Response:
    error = answered(error)
    headers: dict[str, str] = {}
    if isinstance(error, NotLeader) and error.leader_hint:
        headers["Raftlog-Leader-Id"] = str(error.leader_hint)
        node = request.app.get(NODE_KEY)
        info = node.catalog.nodes.get(error.leader_hint) if node is not None else None
        if info is not None:
            headers["Raftlog-Leader"] = info.http_addr
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = 'Bearer realm="raftlog"'
    if isinstance(error, MethodNotAllowed):
        headers["Allow"] = error.message.rpartition("allowed: ")[2]
    if is_confluent_path(request.path):  # Confluent's shape, the same headers (a 405's Allow included)
        status, _ = confluent_error(error)
        return web.json_response(confluent_body(error), status=status, headers=headers, content_type=V2_JSON)
    return web.json_response(error_body(error), status=error.http_status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure to the one error shape; never a traceback in an answer."""
    try:
        return await handler(request)
    except ClientError as error:
        return error_response(request, error)
    except InvalidBatchError as error:
        return error_response(request, InvalidBatch(str(error)))
    except web.HTTPException as exception:
        if exception.status < 400:
            raise
        return error_response(request, _http_exception_error(exception))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return error_response(request, InvalidRequest(f"body is not valid JSON: {error}"))
    except TimeoutError:
        return error_response(request, Timeout("the cluster did not answer in time"))
    except Exception as error:  # a bug: log it here, answer without internals
        if isinstance(error, ConnectionError) and _client_gone(request):
            raise  # the client left, or was dropped on a deadline, mid-answer: no one to answer
        _logger.exception("http_handler_failed", method=request.method, path=request.path)
        error = ClientError("internal error; see the node's log")
        return web.json_response(error_body(error), status=500)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


NODE_KEY: web.AppKey[Any] = web.AppKey("node", Any)
