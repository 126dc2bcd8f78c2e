"""Goal: a resync after the source truncated past a mirror (multiraft/node/mirror_truncated.py)
discards the mirror's whole copy, so it fires only on solid evidence: the pull's node still
leads the partition in the term it read in, confirmed by a ReadIndex on the partition's group
just before the proposal, and the partition's applied position (read again then) still below
the source's log start.

The pull runs over tests/unit/test_mirror_pull.py's fakes and a real catalog, as in
tests/unit/test_mirror_truncated.py (whose setup this reuses).
"""

from __future__ import annotations

from typing import Any

import pytest

from multiraft.node.mirror_source import LogChunk
from tests.unit.test_mirror_pull import FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)
from tests.unit.test_mirror_truncated import _setup

asynchronous = pytest.mark.asyncio(loop_scope="function")


class SteeredSource(FakeSource):
    """A source whose `during_read` runs while each read is out (the long poll), before it answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.during_read: Any = None

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        chunk = await super().read_log(topic, partition, offset, max_bytes, wait_ms)
        if self.during_read is not None:
            self.during_read()
        return chunk


# Goal: A leads at position 0 and sends its read; leadership moves while it is out (B may copy
# past 0 meanwhile); the answer, the source's log starting at 100, decides nothing: no resync.
@asynchronous
async def test_a_pull_that_lost_leadership_during_its_read_proposes_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = SteeredSource({0: _log(5, first=100)})
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source=source)
    source.during_read = lambda: registry.leaders.pop(old, None)
    try:
        await pulls.scan()
        await _until(lambda: pulls._tasks[old].done(), "the pull to end with its leadership")
        assert source.reads and proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


# Goal: the leadership lost after the decision, as the ReadIndex that precedes the proposal
# finds: no resync either.
@asynchronous
async def test_a_leader_that_cannot_confirm_its_leadership_proposes_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync")
    runtime = registry.leaders[old]
    runtime.on_read_index = lambda: registry.leaders.pop(old, None)
    try:
        await pulls.scan()
        await _until(lambda: pulls._tasks[old].done(), "the pull to end with its leadership")
        assert runtime.read_indexes >= 1, "the leadership confirmed before a proposal"
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


# Goal: the partition's applied position passes the source's log start while the read is out
# (the pull's window position is then stale): no resync; the pull settles at the applied
# position and copies on from there.
@asynchronous
async def test_the_applied_position_passing_the_log_start_during_the_read_resyncs_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = SteeredSource({0: _log(5, first=100)})
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source=source)
    state = registry.partitions[old].state

    def applied_past() -> None:
        state.next_offset = max(state.next_offset, 104)

    source.during_read = applied_past
    try:
        await pulls.scan()
        await _until(lambda: state.next_offset == 110, "the pull copying on from the applied position")
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
        assert source.reads.count((0, 0)) == 1 and (0, 104) in source.reads  # on from 104, not from 0 again
    finally:
        await pulls.stop()
