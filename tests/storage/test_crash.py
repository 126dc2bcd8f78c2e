"""Crash tests: a real writer process killed with SIGKILL at random points.

Goal: after reopening, the log is a prefix of what was written, with no
corruption reported, and it contains every entry whose sync was reported.
The writer uses the write-behind double, so a kill loses what power loss would.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from raftlog.types import Index
from tests.storage.crash_writer import expected_entry
from tests.storage.helpers import SegmentHarness

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_and_kill(root: str, seed: int, rng: random.Random) -> int:
    """Start the writer, kill it after a random number of reported syncs; return
    the highest index it reported durable."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.crash_writer", root, str(seed)],
        cwd=_REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    reported = 0
    wanted = rng.randint(1, 60)
    deadline = time.monotonic() + 20
    try:
        for line in process.stdout:
            reported = max(reported, int(line.split()[1]))
            wanted -= 1
            if wanted <= 0 or time.monotonic() > deadline:
                break
        time.sleep(rng.random() * 0.005)
        os.kill(process.pid, signal.SIGKILL)
        # Lines printed before the kill still count: each was a completed sync.
        for line in process.stdout:
            reported = max(reported, int(line.split()[1]))
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        process.stdout.close()
    return reported


def _check_reopened(root: str, reported: int) -> int:
    harness = SegmentHarness(root)
    try:
        store = harness.store
        assert store.recovery.corruption == (), store.recovery
        last = store.last_index()
        assert last >= reported, f"reported durable through {reported}, reopened at {last}"
        expected = [expected_entry(i) for i in range(1, last + 1)]
        assert store.entries(Index(1), Index(last + 1), 1 << 40) == expected
        return last
    finally:
        harness.close()


def _sweep(tmp_path, seeds: range) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        root = str(tmp_path / f"seed{seed}")
        reported = _run_and_kill(root, seed, rng)
        last = _check_reopened(root, reported)
        # Kill it a second time from the recovered state: recovery must compose.
        reported = max(last, _run_and_kill(root, seed + 10_000, rng))
        _check_reopened(root, reported)


def test_kill_dash_nine_loses_nothing_reported(tmp_path):
    _sweep(tmp_path, range(12))


@pytest.mark.slow
def test_kill_dash_nine_many_seeds(tmp_path):
    _sweep(tmp_path, range(12, 212))
