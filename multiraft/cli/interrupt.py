"""Ctrl-C as a request to stop at the next safe point, not an exception at any line.

The default SIGINT handler raises KeyboardInterrupt wherever the main thread is:
inside a lock's `with`, between a poll's answer and its printing, in the middle
of a commit. A consumer that must leave its group cleanly and commit exactly
what it printed cannot be stopped that way (a member interrupted at the wrong
line never exited: tests/integration/test_group_cli_processes.py). So the first
Ctrl-C only sets a flag and wakes the consumer's long poll (Kafka's wakeup());
the command's loop looks at the flag after each poll. A second Ctrl-C is the
impatient user: it raises KeyboardInterrupt as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any


class StopOnInterrupt:
    """`with StopOnInterrupt(consumer.wakeup) as interrupt: ... if interrupt.requested: break`."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.requested = False
        self._wake = wake
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self.requested = True
        self._wake()
