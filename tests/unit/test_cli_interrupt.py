"""The first Ctrl-C asks a consumer command to stop at its next safe point; the second stops it now."""

from __future__ import annotations

import os
import signal
import time

import pytest

from multiraft.cli.interrupt import StopOnInterrupt


def _deliver_sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # Python runs the handler in the main thread at its next check for signals


def test_first_ctrl_c_sets_the_flag_and_wakes_the_poll_the_second_interrupts() -> None:
    woken: list[bool] = []
    before = signal.getsignal(signal.SIGINT)
    with StopOnInterrupt(lambda: woken.append(True)) as interrupt:
        assert not interrupt.requested
        _deliver_sigint()
        assert interrupt.requested and woken == [True]
        with pytest.raises(KeyboardInterrupt):
            _deliver_sigint()
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back
