"""The checks of a mirror following its source (chaos/mirror_follow_checks.py) on hand-built
logs: a sink that did not grow, a grown partition or a resynced one that lost or changed a
record, a resync stuck, each caught; a mirror that grew and resynced right passes. Also the
nemesis's owed slots and limits that make every `--mirror` run grow and truncate, and a run
with one of the new classes failing."""

from __future__ import annotations

import random
from pathlib import Path

from chaos.anomalies import ANOMALY_CLASSES, anomaly
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy
from chaos.mirror_follow_checks import (
    check_grown,
    check_resynced,
    count_events,
    from_offset,
    summary_part,
)
from chaos.nemesis import Nemesis
from tests.chaos.mirror_logs import batch_of as _batch
from tests.chaos.mirror_logs import log_of as _log

GROW = "chaos-grow"
TRUNC = PartitionKey("trunc-a", 0)


def _names(found: list) -> list[str]:
    return sorted(a.name for a in found)


def _grown(count: int) -> dict[PartitionKey, LogCopy]:
    return {PartitionKey(GROW, p): _log(_batch(10 * p + 1, 10 * p + 2), _batch(10 * p + 3)) for p in range(count)}


def test_the_classes_are_known() -> None:
    assert "mirror-not-grown" in ANOMALY_CLASSES and "mirror-resync-stuck" in ANOMALY_CLASSES


def test_a_mirror_grown_with_its_source_passes() -> None:
    assert check_grown(GROW, 3, 3, _grown(3), _grown(3)) == []


def test_a_mirror_that_did_not_grow_is_caught() -> None:
    # Goal: the source grew to 3 partitions; the sink's mirror stayed at 1. The partition
    # both have is identical, so only the count shows it.
    found = check_grown(GROW, 3, 1, _grown(3), _grown(1), waited_s=60)
    assert _names(found) == ["mirror-not-grown"]
    assert "has 1 partitions, the source 3, after 60 s (partitions 1, 2 not mirrored)" in found[0].explanation


def test_a_mirror_with_more_partitions_than_its_source_differs() -> None:
    assert _names(check_grown(GROW, 2, 3, _grown(2), _grown(2))) == ["mirror-differs"]


def test_a_grown_partition_that_lost_a_record_or_was_not_read_is_caught() -> None:
    sink = _grown(3)
    key = PartitionKey(GROW, 2)
    sink[key] = _log(_batch(21, 22), _batch(99))  # the new partition's second batch is another one
    assert _names(check_grown(GROW, 3, 3, _grown(3), sink)) == ["mirror-differs", "mirror-lost"]
    del sink[key]
    assert _names(check_grown(GROW, 3, 3, _grown(3), sink)) == ["mirror-incomplete"]


B1, B2, B3, B4 = _batch(1, 2, 3), _batch(4, 5), _batch(6, 7), _batch(8, 9, 10)
# The source's retention deleted offsets 0..4: its log holds 5..9.
SOURCE = _log(B3, B4, start=5)


def test_a_resynced_mirror_identical_from_the_source_start_passes() -> None:
    assert check_resynced(TRUNC, SOURCE, _log(B3, B4, start=5), "running", None) == []


def test_what_the_mirror_holds_below_the_source_start_is_not_judged() -> None:
    # The new incarnation started at 3 (the lowest replica's log start then), the source's
    # retention deleted 3..4 since: the sink's B2 is no longer the source's, and not judged.
    sink = _log(B2, B3, B4, start=3)
    assert check_resynced(TRUNC, SOURCE, sink, "running", None) == []
    trimmed = from_offset(sink, 5)
    assert (trimmed.log_start, [b for b, _ in trimmed.batches]) == (5, [5, 7])
    assert from_offset(SOURCE, 0) is SOURCE


def test_a_mirror_stuck_in_source_truncated_is_caught() -> None:
    # Goal: the link never resynced: the partition still reports source_truncated and the
    # sink holds only what it copied before the pause (0..2), all below the source's start.
    found = check_resynced(TRUNC, SOURCE, _log(B1), "source_truncated", "deleted offsets 3..4", waited_s=60)
    assert _names(found) == ["mirror-incomplete", "mirror-resync-stuck", "mirror-resync-stuck"]
    texts = " | ".join(a.explanation for a in found)
    assert "reports the partition source_truncated, not running, after 60 s" in texts
    assert "ends at 3, below the source's log start 5" in texts
    # Ending right at the source's start is no truncation past it (the pull copies on from there).
    assert _names(check_resynced(TRUNC, SOURCE, _log(B1, B2), "running", None)) == ["mirror-incomplete"]
    found = check_resynced(TRUNC, _log(B4, start=7), _log(B1, B2), "running", None)
    assert "mirror-resync-stuck" in _names(found) and "never resynced" in " ".join(a.explanation for a in found)


def test_a_resync_that_started_late_or_copied_other_bytes_is_caught() -> None:
    late = _log(B4, start=7)  # the new incarnation began past the source's log start: 5..6 lost
    found = check_resynced(TRUNC, SOURCE, late, "running", None)
    assert _names(found) == ["mirror-lost"] and "2 records" in found[0].explanation
    other = _log(B3, _batch(8, 9, 10, stamp=7), start=5)
    assert _names(check_resynced(TRUNC, SOURCE, other, "running", None)) == ["mirror-differs"]
    twice = _log(B3, B4, B4, start=5)
    assert "mirror-duplicate" in _names(check_resynced(TRUNC, SOURCE, twice, "running", None))
    assert _names(check_resynced(TRUNC, SOURCE, None, "running", None)) == ["mirror-incomplete"]


def test_growths_and_resyncs_are_counted_from_the_sink_logs() -> None:
    lines = [{"event": "mirror_topic_grown", "topic": GROW}, {"event": "mirror_topic_grown", "topic": "chaos-a"},
             {"event": "mirror_source_truncated_resync", "topic": "trunc-a"},
             {"event": "mirror_source_truncated_resync_changed_nothing", "topic": "trunc-a"}, {"event": "other"}]
    assert count_events(lines, (GROW, "trunc-a")) == {"grown": 1, "resynced": 1}


def _follow(grows: int, resynced: int) -> dict:
    return {"grow_topic": GROW, "grow_from": 1, "grows": grows, "source_partitions": 1 + 2 * grows,
            "sink_partitions": 1 + 2 * grows, "events": {"grown": grows, "resynced": resynced},
            "resync_identical": 2, "resync_compared": 2, "truncations": 1, "settled": 1}


def test_the_summary_part_says_loudly_when_a_run_did_not_exercise_them() -> None:
    assert summary_part(_follow(2, 2)) == (
        "follow: chaos-grow 1 -> 5 partitions in 2 grows (sink: 5, 2 growths logged), 2/2 truncated partitions "
        "identical from the source's log start, 1 truncations (1 settled), 2 resyncs logged")
    assert summary_part(_follow(0, 2)).startswith("follow: NOT EXERCISED (no grow)")
    assert summary_part(_follow(2, 0)).startswith("follow: NOT EXERCISED (no resync)")


def test_owed_slots_come_first_and_limits_hold() -> None:
    # Goal: every mirror run grows and truncates (owed slots), and never more than the limits.
    nemesis = Nemesis(None, [], random.Random(1), ["kill", "source-grow", "source-truncate"],  # type: ignore[arg-type]
                      due=[(0.0, "source-truncate"), (0.0, "source-grow"), (3600.0, "source-grow")],
                      limits={"source-grow": 1, "source-truncate": 1})
    assert nemesis._owed() == "source-grow" and nemesis._owed() == "source-truncate"
    assert nemesis._owed() is None and nemesis.due == [(3600.0, "source-grow")]  # not yet due
    nemesis.counts["source-grow"] += 1
    nemesis.counts["source-truncate"] += 1
    assert {nemesis._draw() for _ in range(50)} == {"kill"}
    nemesis.due = [(0.0, "source-grow")]
    assert nemesis._owed() is None, "an owed kind past its limit is dropped"
    plain = Nemesis(None, [], random.Random(5), ["kill", "pause"])  # type: ignore[arg-type]
    assert [plain._draw() for _ in range(8)] == _draws(5, ["kill", "pause"], 8), "the same draws without limits"


def _draws(seed: int, kinds: list[str], count: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(kinds) for _ in range(count)]


def test_a_run_with_a_mirror_not_grown_or_a_resync_stuck_fails() -> None:
    from chaos.checker import CheckResult
    from chaos.runner import RunConfig, _summary

    config = RunConfig(out=Path("unused"), seed=1, mirror=True)
    base = {"fault_counts": {}, "replicas": {"compared": 9, "identical": 9},
            "mirror": {"summary": "mirror: 8/8 partitions identical", "promote": "ok", "follow": {}}}
    line, ok = _summary(config, base, CheckResult(anomalies=(), unchecked=(), stats={}))
    assert ok, line
    for name in ("mirror-not-grown", "mirror-resync-stuck"):
        found = CheckResult(anomalies=(anomaly(name, TRUNC, "x", ()),), unchecked=(), stats={})
        line, ok = _summary(config, base, found)
        assert not ok and f"{name}=1" in line, line
    unread = base | {"mirror": base["mirror"] | {"follow": {"source_unread": ["trunc-a/1"]}}}
    line, ok = _summary(config, unread, CheckResult(anomalies=(), unchecked=(), stats={}))
    assert not ok and "grown or truncated source partitions not read" in line, line
