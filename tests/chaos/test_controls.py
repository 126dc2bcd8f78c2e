"""A negative control is caught only by safety evidence (chaos/controls.py).

Before: any failed run counted as caught, so a control whose run failed for another
reason (a final read that stopped short, a node that did not come back) passed, and
a harness error stopped the whole suite.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from chaos.anomalies import ANOMALY_CLASSES
from chaos.controls import CONTROLS, NOT_EVIDENCE, evidence, verdict


def test_every_class_but_the_liveness_ones_is_evidence() -> None:
    assert set(ANOMALY_CLASSES) >= NOT_EVIDENCE
    for name in ANOMALY_CLASSES:
        assert bool(evidence({"anomalies": {name: 3}})) is (name not in NOT_EVIDENCE), name


def test_differing_replicas_and_two_leaders_are_evidence_a_stuck_replica_is_not() -> None:
    assert evidence({"replicas": {"mismatched": [4, 5]}}) == ["replicas differ in 2 groups"]
    assert evidence({"sink_replicas": {"mismatched": [1]}}) == ["sink_replicas differ in 1 groups"]
    assert evidence({"leaders_per_term": {"violations": [[3, 7]]}}) == \
        ["leaders_per_term: two leaders in one term (1)"]
    assert evidence({"replicas": {"stuck": ["replica 3 of group 5 stuck at commit 120 < 131"], "mismatched": []},
                     "anomalies": {"duplicate": 0, "final-read-incomplete": 2}}) == []


def test_the_verdicts() -> None:
    caught = verdict("no-dedup", False, {"anomalies": {"duplicate": 10}})
    assert caught.caught and caught.line() == "chaos-control: no-dedup: CAUGHT (duplicate=10)"
    assert not verdict("no-dedup", True, {}).caught
    short = verdict("skip-crc", False, {"anomalies": {"final-read-incomplete": 1}, "summary": "FAIL: final read"})
    assert not short.caught and "without safety evidence: FAIL: final read" in short.why
    raised = verdict("skip-crc", None, None, "RaftlogError('TOPIC_EXISTS')")
    assert not raised.caught and "raised: RaftlogError('TOPIC_EXISTS')" in raised.line()


def test_a_control_that_raises_is_reported_and_the_others_still_run(tmp_path: Path, monkeypatch, capsys) -> None:
    import chaos.__main__ as entry

    ran = []

    async def one(out, seed, nodes, duration, faults, unsafe, groups=False, far_catchup=False, mirror=False):
        ran.append(unsafe[0])
        if unsafe == ["skip-crc"]:
            raise RuntimeError("the harness broke")
        if unsafe == ["no-dedup"]:  # failed, but only on liveness
            return SimpleNamespace(ok=False, details={"anomalies": {"final-read-incomplete": 1}, "summary": "FAIL"})
        return SimpleNamespace(ok=False, details={"anomalies": {"lost-write": 2}, "summary": "FAIL"})

    monkeypatch.setenv("RAFTLOG_CHAOS_NO_NS", "1")
    monkeypatch.setattr(entry, "_one_run", one)
    assert entry.main(["suite", "controls", "--seed", "7", "--out", str(tmp_path)]) == 1
    assert ran == list(CONTROLS)
    printed = capsys.readouterr().out
    assert "chaos-control: skip-crc: NOT CAUGHT (the run raised: RuntimeError('the harness broke'))" in printed
    assert "chaos-control: no-dedup: NOT CAUGHT (the run failed without safety evidence: FAIL)" in printed
    assert f"chaos-controls: {len(CONTROLS) - 2}/{len(CONTROLS)} unsafe switches caught" in printed
