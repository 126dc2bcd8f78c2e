"""Goal: a resync after the source truncated past a mirror (multiraft/node/mirror_truncated.py)
discards the mirror's whole copy, so it fires only on solid evidence: the pull's node still
leads the partition in the term it read in, confirmed by a ReadIndex on the partition's group
just before the proposal, and the partition's applied position (read again then) still below
the source's log start; the source's answer is refused when it cannot be true (offsets outside
0..2**63-1, a log start past the high watermark); the truncation must be seen again
`CONFIRM_AFTER_S` later (by the same run of the pull, in its term, at its position), and the
source's own description of its replicas (one per source address) must confirm it: the resync
starts at the lowest log start over them, and only once every replica lacks the pull's position.

The pull runs over tests/unit/test_mirror_pull.py's fakes and a real catalog, as in
tests/unit/test_mirror_truncated.py (whose setup this reuses). The source client's side, over
real sockets: tests/unit/test_mirror_source_views.py.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
import structlog

from multiraft.metadata.mirror_commands import (
    ResyncMirrorPartition,
    SetMirrorLinkPolicy,
    SetMirrorLinkState,
)
from multiraft.node.mirror_source import (
    LogChunk,
    SourceError,
    parse_log_answer,
)
from multiraft.node.mirror_truncated import TRUNCATED_RETRY_S, TruncatedResyncs
from raftlog.types import Index
from tests.unit.test_mirror_catalog import _catalog
from tests.unit.test_mirror_link_tls import _link
from tests.unit.test_mirror_pull import FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)
from tests.unit.test_mirror_truncated import (
    MIRROR,
    CatalogProposer,
    SimpleHolder,
    _behind,
    _setup,
    _truncation,
)

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
# past 0 meanwhile); the answer, the source's log starting at 100, decides nothing: no resync,
# the source not even asked to confirm it, and no second read (the pull ends with its leadership).
@asynchronous
async def test_a_pull_that_lost_leadership_during_its_read_proposes_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = SteeredSource({0: _log(5, first=100)})
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    source.during_read = lambda: registry.leaders.pop(old, None)
    try:
        await pulls.scan()
        await _until(lambda: pulls._tasks[old].done(), "the pull to end with its leadership")
        assert source.reads == [(0, 0)] and source.described == 0, (source.reads, source.described)
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


# Goal: the leadership lost after the decision, as the ReadIndex that precedes the proposal
# finds: no resync either.
@asynchronous
async def test_a_leader_that_cannot_confirm_its_leadership_proposes_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", clock=lambda: sum(pauses))
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
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    state = registry.partitions[old].state

    def applied_past() -> None:
        state.next_offset = max(state.next_offset, 104)

    source.during_read = applied_past
    try:
        await pulls.scan()
        await _until(lambda: state.next_offset == 110, "the pull copying on from the applied position")
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
        # Seen at 0, seen again (the confirmation finds 104 applied), then on from 104.
        assert source.reads[:3] == [(0, 0), (0, 0), (0, 104)], source.reads
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


# Goal: a truncation seen by reads all within `CONFIRM_AFTER_S` of the first resyncs nothing,
# however often; once seen again later (the clock moved), it resyncs.
@asynchronous
async def test_a_truncation_seen_once_does_not_resync(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    now = [0.0]
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", clock=lambda: now[0])
    try:
        await pulls.scan()
        await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= 5, "reads of the truncated source")
        assert proposer.proposed == [] and pulls.status[old].state == "source_truncated"
        assert "resync once the truncation is seen again 5 s on" in (pulls.status[old].last_error or "")
        now[0] = 5.0
        await _until(lambda: proposer.proposed, "the resync once seen again")
        assert catalog.topic("orders").partitions[0].start_offset == 100
    finally:
        await pulls.stop()


# Goal: single lying answers, each followed by an honest one (the review's huge log start, with
# a high watermark as huge so the answer parses), never make a resync, however far apart: a
# read finding no truncation forgets the one seen before.
@asynchronous
async def test_one_off_lying_answers_resync_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    huge = {"Raftlog-High-Watermark": str(2**63 - 1), "Raftlog-Log-Start-Offset": str(2**63 - 1)}
    source = SteeredSource({0: _log(5, first=0)})
    source.lies = [huge, {}, huge, {}, {}, huge]
    _, proposer, registry, pulls, old = _setup(monkeypatch, "resync", source_start=0, source=source,
                                               clock=lambda: sum(pauses))
    registry.partitions[old].state.next_offset = 10
    try:
        await pulls.scan()
        await _until(lambda: not source.lies and len(source.reads) >= 8, "the lies told and honest reads after")
        assert pauses.count(TRUNCATED_RETRY_S) == 3 and sum(pauses) > 3 * TRUNCATED_RETRY_S
        assert proposer.proposed == [] and source.described == 0 and pulls.status[old].state == "running"
    finally:
        await pulls.stop()


# Goal: a source whose reads keep saying its log starts at 100 while its description says a
# replica still starts at 0 (the mirror's position): no resync; each confirmation moves the
# client to the next source address, which may reach that replica.
@asynchronous
async def test_reads_the_description_does_not_confirm_resync_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100)})
    source.replica_starts = [100, 0, 100]
    _, proposer, _, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    try:
        await pulls.scan()
        await _until(lambda: source.described >= 3, "confirmations")
        assert proposer.proposed == [] and source.rotations >= 3
        shown = pulls.status[old].last_error or ""
        assert "a source replica still holds offset 0 (log starts [0, 100, 100]" in shown, shown
    finally:
        await pulls.stop()


# Goal: replicas disagree (retention runs per replica): no resync while one still holds the
# position; once every replica described lacks it, one resync, from the lowest log start over
# them (never past an offset a replica still has), not from the log start the read answered.
@asynchronous
async def test_disagreeing_replicas_resync_at_the_lowest_log_start_once_all_lack_the_position(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100)})
    source.replica_starts = [100, 0, 120]
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    try:
        await pulls.scan()
        await _until(lambda: source.described >= 2, "confirmations")
        assert proposer.proposed == []
        source.replica_starts = [100, 60, 120]
        await _until(lambda: proposer.proposed, "the resync")
        assert proposer.proposed == [ResyncMirrorPartition(name="orders", partition=0, group_id=int(old),
                                                           start_offset=60)]
        assert catalog.topic("orders").partitions[0].start_offset == 60
        [shown] = pulls.truncated.partitions("dr")
        assert (shown["deleted"], shown["start_offset"]) == ([0, 59], 60)
    finally:
        await pulls.stop()


# Goal: the link's policy changed to `stop` while the confirmation was out (here, as the
# partition's ReadIndex confirms the leadership): the policy is read again just before the
# proposal, and nothing is proposed.
@asynchronous
async def test_a_policy_changed_to_stop_during_the_confirmation_proposes_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", clock=lambda: sum(pauses))
    runtime = registry.leaders[old]

    def altered() -> None:
        if catalog.mirror_links["dr"].on_source_truncated == "resync":
            assert catalog.apply(Index(catalog.applied_index + 1),
                                 SetMirrorLinkPolicy(name="dr", on_source_truncated="stop")).ok

    runtime.on_read_index = altered
    try:
        await pulls.scan()
        await _until(lambda: runtime.read_indexes >= 1 and pauses.count(TRUNCATED_RETRY_S) >= 3, "the pull waiting")
        assert proposer.proposed == [] and "on_source_truncated is stop" in (pulls.status[old].last_error or "")
    finally:
        await pulls.stop()


# Goal: a sighting counts only for the pull that made it, in its term, at its position: one
# from an hour ago in an earlier term (the leadership moved away and back) or at another
# position confirms nothing; each starts the count again, and the resync needs the truncation
# seen again 5 s after that.
@asynchronous
async def test_an_old_sighting_confirms_nothing_in_another_term_or_at_another_position() -> None:
    catalog = _catalog(_link(on_source_truncated="resync"), MIRROR)
    group = int(catalog.topic("orders").partitions[0].group_id)
    group0 = CatalogProposer(catalog)
    now = [0.0]
    resyncs = TruncatedResyncs(SimpleHolder(catalog), group0, structlog.get_logger(),  # type: ignore[arg-type]
                               monotonic=lambda: now[0])
    source = FakeSource({0: _log(5, first=100)})
    source.start = 100
    async with asyncio.timeout(5):
        await resyncs.on_truncated(_truncation(group, term=1), source, _behind)
        now[0] = 3600.0
        _, shown = await resyncs.on_truncated(_truncation(group, term=2), source, _behind)
        assert group0.proposed == [] and "resync once the truncation is seen again 5 s on" in shown, shown
        now[0] = 7200.0
        await resyncs.on_truncated(_truncation(group, term=2, position=5), source, _behind)
        assert group0.proposed == [] and source.described == 0
        now[0] = 7205.0
        await resyncs.on_truncated(_truncation(group, term=2, position=5), source, _behind)
    assert len(group0.proposed) == 1


# Goal: a truncation seen before the link was paused confirms nothing after its resume an hour
# later (the pull starts again: its earlier sightings are forgotten); seen again 5 s after the
# resume, it resyncs.
@asynchronous
async def test_a_sighting_before_a_pause_confirms_nothing_after_the_resume(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    now = [0.0]
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", clock=lambda: now[0])

    def link_state(state: str) -> None:
        assert catalog.apply(Index(catalog.applied_index + 1), SetMirrorLinkState(name="dr", state=state)).ok

    try:
        await pulls.scan()
        await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= 1, "the truncation seen")
        link_state("paused")
        await pulls.scan()
        assert old not in pulls._tasks and pulls.status[old].state == "paused"
        now[0] = 3600.0
        link_state("running")
        seen = pauses.count(TRUNCATED_RETRY_S)
        await pulls.scan()
        await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= seen + 3, "the truncation seen after the resume")
        assert proposer.proposed == [] and "seen again 5 s on" in (pulls.status[old].last_error or "")
        now[0] = 3605.0
        await _until(lambda: proposer.proposed, "the resync once seen again 5 s after the resume")
    finally:
        await pulls.stop()
