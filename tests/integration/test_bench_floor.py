"""Goal: the floor pipeline bench/sequential.py compares raftlog with does the work it
claims (each write appended by the leader and both followers, answered in order,
through raftlog's own client), and leaves no process behind. A floor that skipped
its fsyncs or answered early would make every ratio it prints a lie."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import uvloop

from bench import floor
from storage.batch import Record, encode_batch
from tests.free_ports import require_free_ports

pytestmark = pytest.mark.integration

BASE_PORT = 17640
WRITES = 20


def _sizes(directory: str) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in Path(directory).glob("*.log")}


def test_every_write_lands_on_all_three_logs_and_the_processes_stop() -> None:
    require_free_ports(["127.0.0.1"], range(BASE_PORT, BASE_PORT + 3), "the floor pipeline test")
    record = encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=1)

    async def run() -> tuple[list[int], dict[str, int], tuple[int, ...]]:
        async with floor.pipeline(BASE_PORT) as pipeline:
            offsets = [(await pipeline.client.produce_batch("floor", 0, record))["base_offset"]
                       for _ in range(WRITES)]
            expected = WRITES * len(record)
            deadline = time.monotonic() + 10  # the slower follower answers after the commit
            while min(_sizes(pipeline.directory).values(), default=0) < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return offsets, _sizes(pipeline.directory), pipeline.pids

    offsets, sizes, pids = uvloop.run(run())
    assert offsets == list(range(WRITES))
    assert sorted(sizes) == ["follower-17641.log", "follower-17642.log", "leader.log"]
    assert set(sizes.values()) == {WRITES * len(record)}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
