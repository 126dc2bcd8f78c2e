"""The coordinator's fence between member commits and releases (multiraft/node/group_commits.py).

Goal: a release (an acknowledged revocation, a leave, an expiry) waits for the commits
in flight on the partitions it gives away, and a commit for a partition being released
is refused; a release that waits past its bound goes on and says so; commits on other
partitions neither wait nor are refused.
"""

from __future__ import annotations

import asyncio

import pytest

from multiraft.errors import PartitionNotAssigned
from multiraft.node.group_commits import CommitFence

pytestmark = pytest.mark.asyncio
TP = ("t", 0)


async def test_a_release_waits_for_the_commit_in_flight_and_refuses_new_ones() -> None:
    fence = CommitFence()
    order: list[str] = []
    may_finish = asyncio.Event()

    async def commit() -> None:
        with fence.committing("g", [TP]):
            order.append("commit started")
            await may_finish.wait()
            order.append("commit written")

    async def release() -> None:
        async with fence.releasing("g", [TP]) as drained:
            assert drained
            order.append("released")

    async with asyncio.timeout(5):
        committing = asyncio.create_task(commit())
        await asyncio.sleep(0)
        releasing = asyncio.create_task(release())
        await asyncio.sleep(0.01)
        with pytest.raises(PartitionNotAssigned), fence.committing("g", [TP]):
            pass
        with fence.committing("g", [("t", 1)]), fence.committing("other", [TP]):
            pass  # other partitions and other groups go on
        may_finish.set()
        await asyncio.gather(committing, releasing)
    assert order == ["commit started", "commit written", "released"]
    assert fence.in_flight() == 0
    with fence.committing("g", [TP]):
        pass  # released: commits are judged by the state again


async def test_a_release_waits_at_most_its_bound() -> None:
    fence = CommitFence()
    with fence.committing("g", [TP]):
        async with asyncio.timeout(5):
            async with fence.releasing("g", [TP], wait_s=0.05) as drained:
                assert not drained
