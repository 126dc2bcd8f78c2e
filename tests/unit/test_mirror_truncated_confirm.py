"""Goal: a resync after the source truncated past a mirror (multiraft/node/mirror_truncated.py)
discards the mirror's whole copy, so it fires only on solid evidence: the pull's node still
leads the partition in the term it read in, confirmed by a ReadIndex on the partition's group
just before the proposal, and the partition's applied position (read again then) still below
the source's log start; the source's answer is refused when it cannot be true (offsets outside
0..2**63-1, a log start past the high watermark).

The pull runs over tests/unit/test_mirror_pull.py's fakes and a real catalog, as in
tests/unit/test_mirror_truncated.py (whose setup this reuses).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from multiraft.node.mirror_source import LogChunk, SourceError, parse_log_answer
from tests.unit.test_mirror_pull import FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)
from tests.unit.test_mirror_truncated import _setup

asynchronous = pytest.mark.asyncio(loop_scope="function")


class SteeredSource(FakeSource):
    """A source whose `during_read` runs while each read is out (the long poll), before it
    answers; each answer goes over the wire's shape (body and headers) through the client's
    `parse_log_answer`, the headers of the next ones replaced by `lies` (one a read) first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.during_read: Any = None
        self.lies: list[dict[str, str]] = []

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        chunk = await super().read_log(topic, partition, offset, max_bytes, wait_ms)
        if self.during_read is not None:
            self.during_read()
        return parse_log_answer(*_wire(chunk, self.lies.pop(0) if self.lies else {}))


def _wire(chunk: LogChunk, lie: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """`chunk` as the source's log route sends it, some headers replaced by `lie`."""
    body = b"".join(struct.pack(">qI", base, len(data)) + data for base, data in chunk.batches)
    headers = {"Raftlog-Next-Offset": str(chunk.next_offset), "Raftlog-High-Watermark": str(chunk.high_watermark),
               "Raftlog-Log-Start-Offset": str(chunk.log_start_offset),
               "Raftlog-Skipped": ",".join(f"{base}:{count}" for base, count in chunk.skipped)}
    return body, {**headers, **lie}


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


# Goal: an answer no source replica can give is refused, whole, as a malformed one: offsets
# outside 0..2**63-1 (positions or skipped ranges), a log start past the high watermark.
def test_an_impossible_log_answer_is_refused() -> None:
    chunk = LogChunk(_log(2, first=10), ((10, 2),), 14, 14, 10)
    assert parse_log_answer(*_wire(chunk, {})) == chunk
    assert parse_log_answer(*_wire(chunk, {"Raftlog-Log-Start-Offset": "14"})).log_start_offset == 14
    for lie in ({"Raftlog-Log-Start-Offset": str(2**63 - 1)}, {"Raftlog-Log-Start-Offset": "15"},
                {"Raftlog-Log-Start-Offset": "-1"}, {"Raftlog-High-Watermark": str(2**63)},
                {"Raftlog-Next-Offset": "-5"}, {"Raftlog-Skipped": f"10:{2**64}"}, {"Raftlog-Skipped": "-3:1"},
                {"Raftlog-High-Watermark": str(2**63), "Raftlog-Log-Start-Offset": str(2**63)}):
        with pytest.raises(SourceError, match=r"outside 0\.\.2\*\*63-1|past its high watermark"):
            parse_log_answer(*_wire(chunk, lie))


# Goal: one answer whose log start lies past the source's own high watermark (the review's
# reproduction: 2**63-1 against 10) is refused, the pull backs off, and the next, honest, answer
# finds nothing truncated: no resync.
@asynchronous
async def test_a_lying_answer_past_the_high_watermark_resyncs_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = SteeredSource({0: _log(5, first=0)})
    source.lies = [{"Raftlog-Log-Start-Offset": str(2**63 - 1)}]
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source_start=0, source=source)
    registry.partitions[old].state.next_offset = 10  # the mirror holds 0..9, the source's high watermark 10
    try:
        await pulls.scan()
        await _until(lambda: len(source.reads) >= 3 and pulls.status[old].state == "running", "honest reads")
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
        assert source.lies == [] and pulls.status[old].failures == 0 and pulls.status[old].position == 10
    finally:
        await pulls.stop()
