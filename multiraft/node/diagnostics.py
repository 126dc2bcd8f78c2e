"""SIGUSR1: write every asyncio task's await chain to the log (a running node's
"goroutine dump"). For a node that is alive but stuck — a link that never notices
its peer died, a loop waiting for an event nobody sets — the chain shows where
each task waits; it is how such a hang is found without stopping the process."""

from __future__ import annotations

import asyncio
from typing import Any

STACK_FRAMES_MAX = 12  # per task; the innermost frames are the interesting ones
TASKS_MAX = 5_000  # a node with thousands of quiet groups: enough to see them all


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where `task` is suspended, outermost first, as "file:line function"."""
    frames = task.get_stack(limit=STACK_FRAMES_MAX)
    return [f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
            for frame in frames]


def dump_tasks(logger: Any, extra: dict[str, Any] | None = None) -> int:
    """Log one `task_dump` line per task (bounded); returns how many were written."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())[:TASKS_MAX]
    for task in tasks:
        logger.warning("task_dump", task=task.get_name(), done=task.done(), chain=await_chain(task))
    logger.warning("task_dump_end", tasks=len(tasks), **(extra or {}))
    return len(tasks)
