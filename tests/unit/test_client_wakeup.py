"""Kafka's wakeup(): a long poll ends early, and an answer that arrived is never thrown away."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.client.wakeup import Wakeup


def test_a_wakeup_ends_the_wait_and_cancels_what_it_waited_for() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        ended = asyncio.Event()

        async def long_poll() -> str:
            try:
                await asyncio.sleep(30)
            finally:
                ended.set()
            return "records"

        asyncio.get_running_loop().call_later(0.05, wakeup.set)
        started = asyncio.get_running_loop().time()
        assert await wakeup.wait_for(long_poll()) is None
        assert asyncio.get_running_loop().time() - started < 5
        assert ended.is_set()  # unwound before wait_for returned: nothing runs on behind the caller
        assert await wakeup.wait_for(asyncio.sleep(0, "next")) == "next"  # the wake-up was used up

    asyncio.run(scenario())


def test_an_answer_that_arrived_wins_over_a_wakeup() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        answer.set_result("records")
        wakeup.set()
        assert await wakeup.wait_for(answer) == "records"
        assert await wakeup.wait_for(asyncio.sleep(30)) is None  # kept for the next wait

    asyncio.run(scenario())


def test_a_wakeup_before_the_wait_is_kept_for_it() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        wakeup.set()
        assert await asyncio.wait_for(wakeup.wait_for(asyncio.sleep(30, "late")), 5) is None

    asyncio.run(scenario())


def test_errors_pass_through_and_an_outer_cancel_cancels_the_inner_wait() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()

        async def fails() -> None:
            raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            await wakeup.wait_for(fails())
        ended = asyncio.Event()

        async def long_poll() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                ended.set()

        waiting = asyncio.ensure_future(wakeup.wait_for(long_poll()))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert ended.is_set()

    asyncio.run(scenario())
