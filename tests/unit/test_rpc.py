"""RPC failures say whether the request may have been acted on: a caller that
forwards a write must answer OUTCOME_UNKNOWN after a request went out unanswered,
and may answer "not done" (retriable) only when nothing was sent. Two real `Rpc`
endpoints wired back to back on one event loop (no network needed for this)."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from multiraft.transport.rpc import (
    STATUS_OK,
    Rpc,
    RpcError,
    RpcOutcomeUnknown,
    RpcPeerLost,
    RpcTimeout,
    RpcUnreachable,
)


def pair() -> tuple[Rpc, Rpc, list[int]]:
    endpoints: dict[int, Rpc] = {}
    served: list[int] = []

    def sender(source: int):  # type: ignore[no-untyped-def]
        def send(peer: int, frame_type: int, group: int, body: bytes) -> bool:
            target = endpoints[peer]
            asyncio.get_running_loop().call_soon(target.on_frame, source, frame_type, body)
            return True
        return send

    endpoints[1] = Rpc(sender(1), structlog.get_logger())
    endpoints[2] = Rpc(sender(2), structlog.get_logger())

    async def slow(source: int, body: bytes) -> tuple[int, bytes]:
        served.append(source)
        await asyncio.sleep(10)
        return STATUS_OK, b""

    async def echo(source: int, body: bytes) -> tuple[int, bytes]:
        served.append(source)
        return STATUS_OK, body

    endpoints[2].register("slow", slow)
    endpoints[2].register("echo", echo)
    return endpoints[1], endpoints[2], served


@pytest.mark.asyncio
async def test_rpc_failures_say_whether_the_request_went_out() -> None:
    caller, callee, served = pair()
    try:
        assert await caller.call(2, "echo", b"x", 1.0) == b"x"

        with pytest.raises(RpcTimeout) as timed_out:
            await caller.call(2, "slow", b"", 0.2)
        assert isinstance(timed_out.value, RpcOutcomeUnknown), "sent, unanswered: may have happened"

        alive = {2: True}
        caller.peer_alive = lambda peer: alive[peer]
        call = asyncio.create_task(caller.call(2, "slow", b"", 5.0))
        await asyncio.sleep(0.1)
        alive[2] = False  # the peer falls silent after the request went out
        with pytest.raises(RpcPeerLost) as lost:
            await call
        assert isinstance(lost.value, RpcOutcomeUnknown)

        served.clear()
        with pytest.raises(RpcUnreachable) as unreachable:
            await caller.call(2, "echo", b"", 1.0)
        assert not isinstance(unreachable.value, RpcOutcomeUnknown), "never sent: definitely not done"
        await asyncio.sleep(0.05)
        assert served == [], "a call to a silent peer is not sent at all"
        assert issubclass(RpcOutcomeUnknown, RpcError)
    finally:
        await caller.stop()
        await callee.stop()
