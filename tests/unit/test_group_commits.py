"""The coordinator's fence between member commits and releases (multiraft/node/group_commits.py).

Goal: a release (an acknowledged revocation, a leave, an expiry) waits for the commits
in flight on the partitions it gives away, and a commit for a partition being released
is refused; both are bounded, a commit's writes below a release's wait, and a release
that still finds a commit in flight past its bound is refused (retriable) rather than
going on; commits on other partitions neither wait nor are refused.
"""

from __future__ import annotations

import asyncio

import pytest

from multiraft.errors import PartitionNotAssigned, Timeout
from multiraft.node.group_commits import CommitFence
from raftlog.errors import ProposalDropped

pytestmark = pytest.mark.asyncio
TP = ("t", 0)


async def test_a_release_waits_for_the_commit_in_flight_and_refuses_new_ones() -> None:
    fence = CommitFence()
    order: list[str] = []
    may_finish = asyncio.Event()

    async def commit() -> None:
        async with fence.committing("g", [TP]):
            order.append("commit started")
            await may_finish.wait()
            order.append("commit written")

    async def release() -> None:
        async with fence.releasing("g", [TP]):
            order.append("released")

    async with asyncio.timeout(5):
        committing = asyncio.create_task(commit())
        await asyncio.sleep(0)
        releasing = asyncio.create_task(release())
        await asyncio.sleep(0.01)
        with pytest.raises(PartitionNotAssigned):
            async with fence.committing("g", [TP]):
                pass
        async with fence.committing("g", [("t", 1)]), fence.committing("other", [TP]):
            pass  # other partitions and other groups go on
        may_finish.set()
        await asyncio.gather(committing, releasing)
    assert order == ["commit started", "commit written", "released"]
    assert fence.in_flight() == 0
    async with fence.committing("g", [TP]):
        pass  # released: commits are judged by the state again


async def test_a_commit_ends_within_its_bound_so_a_release_finds_it_ended() -> None:
    # The commit's writes hang (a partition without a quorum): the commit ends at its own
    # bound with TIMEOUT, and a release that waited for it goes on, inside its own bound.
    fence = CommitFence(commit_write_s=0.05, release_wait_s=0.5)
    released = False

    async def commit() -> None:
        async with fence.committing("g", [TP]):
            await asyncio.Event().wait()

    async def release() -> None:
        nonlocal released
        async with fence.releasing("g", [TP]):
            released = True

    async with asyncio.timeout(5):
        committing = asyncio.create_task(commit())
        await asyncio.sleep(0)
        await release()
        with pytest.raises(Timeout):
            await committing
    assert released and fence.in_flight() == 0


async def test_a_release_that_still_finds_a_commit_in_flight_is_refused() -> None:
    # Past its bound (the loop stalled the commit's own bound) a release is refused, not
    # proposed behind a commit in flight; nothing stays marked releasing.
    fence = CommitFence(commit_write_s=1.0, release_wait_s=1.01)
    fence._release_wait_s = 0.05  # as if the commit's bound had not fired yet
    gate = asyncio.Event()

    async def commit() -> None:
        async with fence.committing("g", [TP]):
            await gate.wait()

    async with asyncio.timeout(5):
        committing = asyncio.create_task(commit())
        await asyncio.sleep(0)
        with pytest.raises(ProposalDropped):
            async with fence.releasing("g", [TP]):
                raise AssertionError("a release went on past a commit in flight")
        gate.set()
        await committing
        async with fence.committing("g", [TP]):
            pass  # not left releasing
