"""The mirror checks of `--mirror` runs (chaos/mirror_checks.py) on hand-built logs and
position samples: each anomaly class caught where it should be, nothing flagged where
the mirror is right, and the cases a comparison of ends (the status's lag, high
watermarks) would pass."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

from chaos.anomalies import ANOMALY_CLASSES
from chaos.history import PartitionKey
from chaos.mirror_checks import (
    LogCopy,
    PositionSample,
    check_mirror,
    compare_logs,
    positions_backwards,
    summary_part,
)
from chaos.mirror_reads import parse_frames, parse_skipped
from storage.batch import decode_columns
from tests.chaos.mirror_logs import batch_of as _batch
from tests.chaos.mirror_logs import log_of as _log

KEY = PartitionKey("chaos-a", 0)


def _values(data: bytes) -> list[bytes | None]:
    return decode_columns(data).values


B1, B2, B3, B4 = _batch(1, 2, 3), _batch(4, 5), _batch(6, 7), _batch(8, 9, 10)
SOURCE = _log(B1, B2, B3, B4)


def _names(found: list) -> list[str]:
    return sorted(a.name for a in found)


def test_the_classes_are_known() -> None:
    for name in ("mirror-lost", "mirror-differs", "mirror-duplicate", "mirror-position-backwards",
                 "mirror-incomplete"):
        assert name in ANOMALY_CLASSES


def test_an_identical_copy_passes() -> None:
    verdicts = check_mirror({KEY: SOURCE}, {KEY: _log(B1, B2, B3, B4)})
    assert verdicts.anomalies == [] and (verdicts.compared, verdicts.identical, verdicts.records) == (1, 1, 10)


def test_batches_the_source_skips_and_the_sink_serves_differ() -> None:
    # Goal: a source batch skipped on reads (a producer's retried duplicate) must be skipped
    # on the sink too; the same offsets and bytes on both sides with the skip lost (a skips
    # entry that never made it) passed every other check, as every value shows as often.
    dup = _log(B1, B2, B1)
    source = LogCopy(dup.log_start, dup.high_watermark, dup.batches, ((5, 3),))
    assert compare_logs(KEY, source, LogCopy(dup.log_start, dup.high_watermark, dup.batches, ((5, 3),))) == []
    found = compare_logs(KEY, source, dup)
    assert _names(found) == ["mirror-differs"] and "the source skips 5" in found[0].explanation
    found = compare_logs(KEY, dup, source)
    assert _names(found) == ["mirror-differs"] and "the sink skips 5" in found[0].explanation
    assert _names(compare_logs(KEY, source, LogCopy(0, 5, dup.batches[:2]))) == ["mirror-incomplete"], \
        "a skip past the sink's end is not judged"
    assert parse_skipped("") == [] and parse_skipped("5:3,12:1") == [(5, 3), (12, 1)]


def test_a_skipped_batch_and_a_double_append_with_equal_ends_are_caught() -> None:
    # The sink skipped B2 and appended B3 twice (B2 and B3 hold two records each): its high
    # watermark equals the source's, so lag 0 and equal ends (all a status shows) pass.
    sink = _log(B1, B3, B3, B4)
    assert sink.high_watermark == SOURCE.high_watermark
    found = compare_logs(KEY, SOURCE, sink)
    assert _names(found) == ["mirror-differs", "mirror-duplicate", "mirror-lost"]
    lost = next(a for a in found if a.name == "mirror-lost")
    assert "2 records" in lost.explanation and "source offsets 3-4" in lost.explanation


def test_a_skipped_batch_leaves_records_lost_and_offsets_shifted() -> None:
    sink = _log(B1, B3, B4)  # caught up as far as it goes, three offsets short
    found = compare_logs(KEY, SOURCE, sink)
    assert _names(found) == ["mirror-differs", "mirror-differs", "mirror-incomplete", "mirror-lost"]


def test_a_batch_appended_twice_is_a_duplicate_and_offsets_past_the_source() -> None:
    sink = _log(B1, B2, B2, B3, B4)
    found = compare_logs(KEY, SOURCE, sink)
    assert "mirror-duplicate" in _names(found) and "mirror-lost" not in _names(found)
    assert any("past the source's end" in a.explanation for a in found)


def test_other_bytes_at_the_same_offsets_differ_even_with_the_same_values() -> None:
    sink = _log(B1, _batch(4, 5, stamp=99), B3, B4)  # same values, another timestamp
    found = compare_logs(KEY, SOURCE, sink)
    assert _names(found) == ["mirror-differs"] and "other bytes at base offsets 3" in found[0].explanation


def test_a_sink_behind_is_incomplete_never_lost() -> None:
    sink = _log(B1, B2)
    found = compare_logs(KEY, SOURCE, sink, waited_s=60)
    assert _names(found) == ["mirror-incomplete"]
    assert "reached 5 of the source's 10 in 60 s" in found[0].explanation
    assert _names(check_mirror({KEY: SOURCE}, {KEY: None}).anomalies) == ["mirror-incomplete"]


def test_a_sink_log_starting_late_lost_the_records_before() -> None:
    sink = LogCopy(3, 10, tuple((base, data) for base, data in SOURCE.batches if base >= 3))
    found = compare_logs(KEY, SOURCE, sink)
    assert _names(found) == ["mirror-lost"] and "3 records" in found[0].explanation


def _sample(at: float, node: str, position: int, state: str = "running") -> PositionSample:
    return PositionSample(at, node, KEY, state, position)


def test_positions_going_back_within_one_incarnation_are_caught() -> None:
    found = positions_backwards([_sample(1, "s1#1", 5), _sample(2, "s1#1", 7), _sample(3, "s1#1", 6)], {})
    assert _names(found) == ["mirror-position-backwards"]
    assert "s1#1 reported position 7 at 2.0 s (running), then 6 at 3.0 s" in found[0].explanation


def test_positions_of_other_nodes_incarnations_and_unsettled_states_are_not_compared() -> None:
    samples = [_sample(1, "s1#1", 9), _sample(2, "s2#1", 4),  # a deposed leader's view, then the new one's
               _sample(3, "s1#2", 3),  # restarted: a new incarnation
               _sample(4, "s2#1", 0, "starting"), _sample(5, "s2#1", 0, "resyncing"), _sample(6, "s2#1", 0, "paused"),
               _sample(7, "s2#1", 4, "backing_off"), _sample(8, "s2#1", 10)]
    assert positions_backwards(samples, {KEY: 10}) == []


def test_a_position_past_the_caught_up_sink_end_is_caught_but_not_past_an_incomplete_one() -> None:
    samples = [_sample(1, "s1#1", 12)]
    assert _names(positions_backwards(samples, {KEY: 10})) == ["mirror-position-backwards"]
    assert _names(check_mirror({KEY: SOURCE}, {KEY: _log(B1, B2, B3, B4)}, samples).anomalies) == \
        ["mirror-position-backwards"]
    # The sink did not catch up: its end is no bound for what was reported (only incomplete).
    assert _names(check_mirror({KEY: SOURCE}, {KEY: _log(B1)}, samples).anomalies) == ["mirror-incomplete"]


def test_a_diverged_pull_differs() -> None:
    verdicts = check_mirror({KEY: SOURCE}, {KEY: _log(B1, B2, B3, B4)}, diverged=[(KEY, "not the log")])
    assert _names(verdicts.anomalies) == ["mirror-differs"] and verdicts.identical == 1


def test_frames_of_the_log_route_parse() -> None:
    body = b"".join(struct.pack(">qI", base, len(data)) + data for base, data in SOURCE.batches)
    assert parse_frames(body) == list(SOURCE.batches)


def test_the_summary_part() -> None:
    verdicts = check_mirror({KEY: SOURCE}, {KEY: _log(B1, B2, B3, B4)})
    assert summary_part(verdicts, "ok", [_sample(1, "s1#1", 5)]) == \
        "mirror: 1/1 partitions identical (10 records), 1 positions sampled, promote: ok"


def test_the_mirror_suite_and_the_control_run_with_a_mirror(tmp_path, monkeypatch) -> None:
    # Goal: `make chaos-mirror` (`suite mirror`) is one mirror run; the mirror-skip-batch
    # control runs with a mirror, the others without.
    import chaos.__main__ as entry

    calls = []

    async def one(out, seed, nodes, duration, faults, unsafe, groups=False, far_catchup=False, mirror=False):
        calls.append((seed, tuple(faults), tuple(unsafe), mirror))
        caught = {"anomalies": {"duplicate": 1}, "summary": "FAIL"}  # every control caught
        return SimpleNamespace(ok=not unsafe, details=caught if unsafe else {})

    monkeypatch.setenv("RAFTLOG_CHAOS_NO_NS", "1")
    monkeypatch.setattr(entry, "_one_run", one)
    assert entry.main(["suite", "mirror", "--seed", "7", "--out", str(tmp_path)]) == 0
    assert calls == [(7, ("kill", "pause", "partition"), (), True)]
    calls.clear()
    assert entry.main(["suite", "controls", "--seed", "7", "--out", str(tmp_path)]) == 0
    assert [call[2:] for call in calls if call[3]] == [(("mirror-skip-batch",), True)]


def test_a_mirror_run_judges_the_sink_replicas_and_terms_as_the_source() -> None:
    # Goal: the end read compares one sink copy per partition; a second sink copy that
    # differs, one stuck behind, or two sink leaders in one term fail the run on their own.
    from chaos.checker import CheckResult
    from chaos.runner import RunConfig, _summary

    config = RunConfig(out=Path("unused"), seed=1, mirror=True)
    clean = CheckResult(anomalies=(), unchecked=(), stats={})
    base = {"fault_counts": {}, "replicas": {"compared": 9, "identical": 9},
            "mirror": {"summary": "mirror: 8/8 partitions identical", "promote": "ok"}}
    line, ok = _summary(config, base | {"sink_replicas": {"compared": 9, "identical": 9},
                                        "sink_leaders_per_term": {"violations": []}}, clean)
    assert ok and "sink replicas byte-identical: 9/9 groups, sink leaders per term: ok;" in line
    cases = {
        "sink replicas differ in 1 groups": {"sink_replicas": {"compared": 9, "identical": 8, "mismatched": [4]}},
        "sink replicas stuck behind their group's commit: 1 (s2 of group 4)":
            {"sink_replicas": {"compared": 9, "identical": 8, "stuck": ["s2 of group 4"]}},
        "sink: two leaders in one term: 1": {"sink_replicas": {"compared": 9, "identical": 9},
                                              "sink_leaders_per_term": {"violations": [{"group": 4}]}},
        "sink replicas not compared: debug off": {"sink_replicas": {"compared": 0, "identical": 0,
                                                                    "error": "debug off"}},
    }
    for problem, extra in cases.items():
        line, ok = _summary(config, base | extra, clean)
        assert not ok and problem in line, line
