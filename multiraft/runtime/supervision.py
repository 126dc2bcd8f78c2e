"""Every long-lived task of a node has an owner that notices when it dies.

A loop that raised used to end silently: the reconciler, killed once by a
`DiskFullError` (a `StorageError`, not an `OSError`), left the node opening no
group again while it went on answering health checks. `supervised` runs a loop
again after a failure, with a growing pause (a loop that fails at once must not
spin), and logs every failure with its traceback; `watch` gives a one-off
background task a done-callback that logs what it raised (aiokafka's `_fail_all`
idea: nothing an owner waits on may vanish without a trace).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 30.0
# A loop that ran this long before failing starts again after the shortest pause.
HEALTHY_RUN_S = 60.0


async def supervised(name: str, loop: Callable[[], Awaitable[Any]], logger: Any) -> None:
    """Run `loop()` until it returns or the task is cancelled; after a failure, log it and
    run it again."""
    delay = RESTART_DELAY_S
    clock = asyncio.get_running_loop().time
    while True:
        started = clock()
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            if clock() - started > HEALTHY_RUN_S:
                delay = RESTART_DELAY_S
            logger.exception("node_task_failed", task=name, restart_in_s=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RESTART_DELAY_MAX_S)


def watch(task: asyncio.Task[Any], name: str, logger: Any) -> asyncio.Task[Any]:
    """Log what a background task raised when it ends (cancellation is not a failure)."""

    def done(finished: asyncio.Task[Any]) -> None:
        if finished.cancelled():
            return
        error = finished.exception()
        if error is not None:
            logger.error("background_task_failed", task=name, error=repr(error), exc_info=error)

    task.add_done_callback(done)
    return task
