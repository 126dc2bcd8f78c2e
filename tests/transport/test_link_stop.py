"""Goal: a link stopped while it waits for its connection's watch task to end stops.
`_write_loop` cancels the watch and awaits it; the link's stop (`cancel()`) can arrive
during that wait, and the old `suppress(CancelledError)` swallowed it: the link dialled
its peer again, forever (tests/transport/test_peer_resets.py hung on it in a long run)."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.transport.peer_link import reap

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _slow_to_cancel(started: asyncio.Event) -> bytes:
    """A watch whose cancellation takes a while to finish (a read ending in the loop)."""
    try:
        started.set()
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        raise
    return b""


async def test_the_callers_own_cancellation_goes_on_while_it_reaps() -> None:
    started = asyncio.Event()
    watch = asyncio.create_task(_slow_to_cancel(started))
    await started.wait()
    finished_normally = False

    async def link() -> None:
        nonlocal finished_normally
        watch.cancel()
        await reap(watch)
        finished_normally = True  # the old code came here and dialled again

    task = asyncio.create_task(link())
    await asyncio.sleep(0.01)  # inside reap, waiting for the watch to end
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert not finished_normally and task.cancelled()


async def test_the_watchs_own_end_is_quiet() -> None:
    # The watch cancelled by us (the connection closed) ends quietly, and so does a
    # watch whose read failed (OSError): the caller goes on to dial again.
    started = asyncio.Event()
    watch = asyncio.create_task(_slow_to_cancel(started))
    await started.wait()
    watch.cancel()
    await reap(watch)

    async def failed_read() -> bytes:
        raise ConnectionResetError("reset by peer")

    read = asyncio.create_task(failed_read())
    await asyncio.sleep(0)
    await reap(read)
