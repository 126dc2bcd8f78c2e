"""Request/response calls between nodes, over the same per-peer connection as Raft.

Used where one node must ask another to act: forward a produce to the partition
leader, forward a metadata command to the metadata leader, send node heartbeats
to the controller. A request frame carries (request id, method, body); the
answer frame carries (request id, status, body). Bodies are bytes (JSON for
metadata, raw batch bytes for produce): nothing executable crosses the wire.

Every call has a deadline; unanswered calls fail with `RpcTimeout` (outcome
unknown for writes). The number of calls in flight is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from multiraft.transport.frames import FrameTooLarge, FrameType

FRAME_RPC_REQUEST = FrameType.RPC_REQUEST
FRAME_RPC_RESPONSE = FrameType.RPC_RESPONSE
STATUS_OK = 0
STATUS_ERROR = 1  # body: JSON {"error_code", "message"}
CALLS_IN_FLIGHT_MAX = 4096
LIVENESS_CHECK_S = 0.05
RPC_TIMEOUT_S = 5.0  # the node's calls to peers (forwarding, metadata, heartbeats)

_REQUEST = struct.Struct(">QH")  # request id, method length
_RESPONSE = struct.Struct(">QB")  # request id, status

Handler = Callable[[int, bytes], Awaitable[tuple[int, bytes]]]


class RpcError(Exception):
    """The call could not be made or answered."""


class RpcUnreachable(RpcError):
    """The peer's node is silent (no frames for an election timeout): it may be down."""


class RpcOutcomeUnknown(RpcError):
    """The request went out but no answer came back: the peer may have acted on it.
    A caller forwarding a write must say "outcome unknown", never "not done"."""


class RpcTimeout(RpcOutcomeUnknown):
    pass


class RpcPeerLost(RpcOutcomeUnknown, RpcUnreachable):
    """The peer went silent after the request was sent."""


class RemoteError(RpcError):
    def __init__(self, body: bytes) -> None:
        super().__init__(body.decode(errors="replace"))
        self.body = body


class Rpc:
    def __init__(self, send: Callable[[int, int, int, bytes], bool], logger: Any) -> None:
        self._send = send
        self._logger = logger
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._handlers: dict[str, Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Node-level liveness of a peer: a call to a node that falls silent fails fast
        # (a killed leader must not hold its callers for the whole timeout).
        self.peer_alive: Callable[[int], bool] = lambda peer: True

    def register(self, method: str, handler: Handler) -> None:
        """`handler(source_node, body) -> (status, body)` answers requests for `method`."""
        self._handlers[method] = handler

    async def call(self, peer: int, method: str, body: bytes, timeout_s: float) -> bytes:
        if len(self._pending) >= CALLS_IN_FLIGHT_MAX:
            raise RpcError("too many calls in flight")
        request_id = next(self._ids)
        name = method.encode()
        frame = _REQUEST.pack(request_id, len(name)) + name + body
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            if not self.peer_alive(peer):
                raise RpcUnreachable(f"node {peer} is silent; it may be down")
            if not self._send(peer, FRAME_RPC_REQUEST, 0, frame):
                raise RpcError(f"cannot send to node {peer}")
            status, answer = await self._wait(peer, method, future, timeout_s)
        finally:
            self._pending.pop(request_id, None)
        if status != STATUS_OK:
            raise RemoteError(answer)
        return answer

    async def _wait(
        self, peer: int, method: str, future: asyncio.Future[tuple[int, bytes]], timeout_s: float
    ) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RpcTimeout(f"node {peer} did not answer {method} within {timeout_s} s")
            done, _ = await asyncio.wait({future}, timeout=min(remaining, LIVENESS_CHECK_S))
            if done:
                return future.result()
            if not self.peer_alive(peer):
                raise RpcPeerLost(f"node {peer} went silent while answering {method}")

    def on_frame(self, source: int, frame_type: int, body: bytes) -> None:
        """Feed RPC frames from the transport (called on the event loop)."""
        if frame_type == FRAME_RPC_RESPONSE:
            if len(body) < _RESPONSE.size:
                return
            request_id, status = _RESPONSE.unpack_from(body)
            future = self._pending.get(request_id)
            if future is not None and not future.done():
                future.set_result((status, body[_RESPONSE.size :]))
        elif frame_type == FRAME_RPC_REQUEST:
            if len(self._tasks) >= CALLS_IN_FLIGHT_MAX or len(body) < _REQUEST.size:
                return  # shed: the caller times out and retries
            request_id, name_length = _REQUEST.unpack_from(body)
            start = _REQUEST.size
            method = body[start : start + name_length].decode(errors="replace")
            task = asyncio.create_task(self._serve(source, request_id, method, body[start + name_length :]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, source: int, request_id: int, method: str, body: bytes) -> None:
        handler = self._handlers.get(method)
        if handler is None:
            status, answer = STATUS_ERROR, b'{"error_code":"INVALID_REQUEST","message":"unknown method"}'
        else:
            try:
                status, answer = await handler(source, body)
            except Exception as error:  # answer every request; a handler bug must not hang callers
                self._logger.error("rpc_handler_failed", method=method, error=repr(error))
                status, answer = STATUS_ERROR, b'{"error_code":"INTERNAL","message":"internal error"}'
        try:
            self._send(source, FRAME_RPC_RESPONSE, 0, _RESPONSE.pack(request_id, status) + answer)
        except FrameTooLarge as error:  # a handler's bug, but the caller must hear of it, not wait
            self._logger.error("rpc_answer_too_large", method=method, error=str(error))
            answer = b'{"error_code":"INVALID_REQUEST","message":"the answer exceeds a transport frame; ask for less"}'
            self._send(source, FRAME_RPC_RESPONSE, 0, _RESPONSE.pack(request_id, STATUS_ERROR) + answer)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcError("stopping"))
        self._pending.clear()


def error_answer(error: Any) -> tuple[int, bytes]:
    """An RPC error answer: the HTTP layer's one error body (a NOT_LEADER names the leader)."""
    from multiraft.errors import error_body

    return STATUS_ERROR, json.dumps(error_body(error)).encode()


async def answer(work: Awaitable[Any], encode: Callable[[Any], bytes]) -> tuple[int, bytes]:
    """Run a handler's work; a `ClientError` becomes an error answer, anything else an OK one."""
    from raftlog.errors import ClientError

    try:
        value = await work
    except ClientError as error:
        return error_answer(error)
    return STATUS_OK, encode(value)
