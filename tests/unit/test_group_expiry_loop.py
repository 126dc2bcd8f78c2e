"""The coordinator's expiry loop (multiraft/node/group_coordinator.py `run`) over a fake
metadata runtime.

Goal: a proposal of an expiry that fails with a client error other than NOT_LEADER (a
full inbox, a step-down's OUTCOME_UNKNOWN, commits still in flight) neither ends the
loop (which its supervisor would restart, after a back-off) nor loses the expiry for a
session: the next scan proposes it again.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from multiraft.consumer_groups import (
    ExpireMembers,
    JoinGroup,
    StaticTopics,
    Subscription,
    decode_group_command,
)
from multiraft.consumer_groups.state import GroupResult
from multiraft.node.catalog_holder import CatalogHolder
from multiraft.node.group_coordinator import GroupCoordinator
from multiraft.node.registry import METADATA_GROUP
from raftlog.errors import OutcomeUnknown, ProposalDropped
from raftlog.messages import Role

pytestmark = pytest.mark.asyncio


class FakeRuntime:
    def __init__(self, failures: list[Exception]) -> None:
        self.core = SimpleNamespace(role=Role.LEADER, term=3, applied_index=5, commit_index=5, leader=1,
                                    log=SimpleNamespace(term_or_none=lambda index: 3))
        self.failures = failures
        self.proposed: list[Any] = []

    async def propose(self, payloads: list[bytes], kind: Any) -> list[GroupResult]:
        self.proposed.append(decode_group_command(payloads[0]))
        if self.failures:
            raise self.failures.pop(0)
        return [GroupResult(0, value=1)]


async def test_the_expiry_loop_survives_proposal_errors_and_retries_at_the_next_scan() -> None:
    catalog = CatalogHolder()
    result = catalog.groups.apply(1, JoinGroup(group="g", member_id="m", subscription=Subscription(topics=("t",)),
                                               session_timeout_ms=500), StaticTopics({"t": 1}))
    assert result.error is None
    runtime = FakeRuntime([ProposalDropped("inbox full"), OutcomeUnknown("stepped down")])
    now = [0]
    coordinator = GroupCoordinator(SimpleNamespace(groups={METADATA_GROUP: runtime}), catalog,
                                   SimpleNamespace(register=lambda *args: None), commit_offsets=None,  # type: ignore[arg-type]
                                   logger=structlog.get_logger(), clock_ms=lambda: now[0])
    loop = asyncio.create_task(coordinator.run())
    try:
        async with asyncio.timeout(5):
            while coordinator._term != 3:  # the first scan took over: every member seen at 0
                await asyncio.sleep(0.01)
            now[0] = 10_000  # silent past its session
            while len(runtime.proposed) < 3:
                assert not loop.done(), loop
                await asyncio.sleep(0.01)
                now[0] += 10  # 10 ms a poll: far less than the 500 ms session
    finally:
        loop.cancel()
    assert runtime.proposed == [ExpireMembers(group="g", member_ids=("m",))] * 3
