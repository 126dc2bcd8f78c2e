"""Goal: SIGUSR1 on a node logs where each of its asyncio tasks waits, so a node that
is alive but stuck can be diagnosed without stopping it (the chaos runner sends it
when a node does not come back)."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from multiraft.node.diagnostics import dump_tasks

pytestmark = pytest.mark.asyncio


async def waits_for_an_event_nobody_sets(event: asyncio.Event) -> None:
    await event.wait()


async def test_the_dump_names_where_each_task_waits() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(waits_for_an_event_nobody_sets(event), name="stuck-one")
    await asyncio.sleep(0)
    try:
        with structlog.testing.capture_logs() as logs:
            written = dump_tasks(structlog.get_logger(), {"peers": {2: {"connected": True}}})
        stuck = [entry for entry in logs if entry.get("task") == "stuck-one"]
        assert len(stuck) == 1
        assert any("waits_for_an_event_nobody_sets" in frame for frame in stuck[0]["chain"])
        assert logs[-1]["event"] == "task_dump_end" and logs[-1]["tasks"] == written >= 2
        assert logs[-1]["peers"] == {2: {"connected": True}}
    finally:
        task.cancel()
