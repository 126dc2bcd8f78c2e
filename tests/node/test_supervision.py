"""Goal (issue 21, family 9): a node's long-lived loops survive what they raise.

The reconciler, killed once by a DiskFullError (a StorageError, not an OSError),
used to end for good: the node opened no group again. Now its supervisor logs the
failure and runs it again, and the node goes on opening groups."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import structlog

from multiraft.node.replicas import Replicas
from multiraft.runtime import supervision
from storage.errors import DiskFullError
from tests.chaos_server.test_node_hooks import started
from tests.node.test_node_cluster import configs, until

pytestmark = [pytest.mark.asyncio]


async def test_a_loop_that_fails_is_run_again_and_each_failure_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "RESTART_DELAY_S", 0.01)
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise DiskFullError("no space left")

    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(5):
            await supervision.supervised("flaky", flaky, structlog.get_logger())
    assert len(runs) == 3
    assert [entry["task"] for entry in logs if entry["event"] == "node_task_failed"] == ["flaky", "flaky"]


async def test_a_background_task_that_raises_is_logged() -> None:
    async def boom() -> None:
        raise RuntimeError("boom")

    with structlog.testing.capture_logs() as logs:
        task = supervision.watch(asyncio.create_task(boom()), "boom", structlog.get_logger())
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert [entry["task"] for entry in logs if entry["event"] == "background_task_failed"] == ["boom"]


@pytest.mark.integration
async def test_the_reconciler_survives_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "RESTART_DELAY_S", 0.05)
    real = Replicas.reconcile_loop
    calls: list[int] = []

    async def failing_once(self: Replicas) -> None:
        calls.append(1)
        if len(calls) == 1:
            await self._catalog.wait_changed()
            self._catalog.changed()  # left for the next round, which must see it
            raise DiskFullError("the disk filled while opening a group")
        await real(self)

    monkeypatch.setattr(Replicas, "reconcile_loop", failing_once)
    async with started(configs(tmp_path, n=1), None) as (node,):
        await node.create_topic("after-the-failure", 2, 1, {})
        await node.wait_for_topic("after-the-failure")
        groups = {p.group_id for p in node.catalog.topic("after-the-failure").partitions}
        await until(lambda: groups <= set(node.groups), "the topic's groups opened after the failure")
    assert len(calls) >= 2
