"""Kafka's `consumer.wakeup()`: end a consumer's long poll early, without losing a record.

A consumer that follows a topic spends nearly all its time in one long poll (up
to `wait_ms`, seconds). Ctrl-C, or a program shutting down, must not wait that
long, and must not stop a poll at an arbitrary await either: a poll cut between
"the answer arrived and the positions moved" and "the records were returned"
would skip records that the next commit then marks as read. So only the long
wait itself is interruptible, and only before its answer is taken: a wait that
is woken returns None and leaves every position where it was; an answer that is
already there wins over the wake-up and is returned as usual.

A wake-up with no wait in progress is kept for the next one (Kafka does the
same), so a wake-up that lands between two polls is not lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Wakeup:
    """One consumer's wake-up flag. Lives on the consumer's event loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """Wake the wait in progress, or the next one. Call on the consumer's loop."""
        self._event.set()

    async def wait_for(self, awaitable: Awaitable[T]) -> T | None:
        """The awaitable's result, or None if woken before it completed (the awaitable is
        then cancelled and has finished unwinding when this returns)."""
        answer = asyncio.ensure_future(awaitable)
        woken = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({answer, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut = not answer.done()
            woken.cancel()
            answer.cancel()
            await asyncio.gather(answer, woken, return_exceptions=True)
        if not cut:
            return answer.result()  # an answer that arrived is never thrown away
        self._event.clear()
        return None
