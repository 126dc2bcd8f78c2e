"""The soak (chaos/soak.py, chaos/soakreport.py) without a cluster: the schedule's
rotation and its expected fault counts against the release gate, the totals from
synthetic run results, the loop's keep-on-failure and delete-on-pass, a report
after every run, and interruption, all through a fake run function and clock."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
from pathlib import Path
from typing import Any

import pytest

from chaos import soak
from chaos.__main__ import ALL_FAULTS, _parser
from chaos.checker import ANOMALY_CLASSES
from chaos.runner import RunResult
from chaos.soakreport import FAULT_MINIMA, RunRecord, SoakTotals, histogram, quantile, write_report

THREE_HOURS = 3.0


def _details(*, kill: int = 0, power: int = 0, partition_details: tuple[str, ...] = (),
             corrupt_details: tuple[str, ...] = (), values: int = 1000, anomalies: dict | None = None,
             recovery: float | None = 1.5, identical: int = 9, compared: int = 9, **extra: Any) -> dict:
    """A run's `RunResult.details` as chaos/runner.py writes it, cut down to what the soak reads."""
    windows = [{"kind": "kill", "detail": "one: [1]"}] * kill + [{"kind": "power", "detail": "all: [1, 2, 3]"}] * power
    windows += [{"kind": "partition", "detail": detail} for detail in partition_details]
    windows += [{"kind": "corrupt", "detail": detail} for detail in corrupt_details]
    counts: dict[str, int] = {}
    for window in windows:
        counts[window["kind"]] = counts.get(window["kind"], 0) + 1
    details = {"fault_counts": counts, "windows": windows, "stats": {"values-acknowledged": values},
               "anomalies": anomalies or {}, "replicas": {"identical": identical, "compared": compared,
                                                          "mismatched": [], "stuck": []},
               "leaders_per_term": {"violations": []}, "crashed": {}, "unchecked": [], "faults_skipped": []}
    if recovery is not None:
        details["recovery_s"] = recovery
    return details | extra


def _record(index: int = 0, *, ok: bool = True, **details: Any) -> RunRecord:
    return RunRecord.of(details=_details(**details), ok=ok, summary=f"chaos: run {index}", index=index,
                        seed=100 + index, nodes=3, faults=("kill",), duration_s=60.0, started_s=index * 90.0,
                        elapsed_s=80.0)


# -- the schedule ------------------------------------------------------------------


def test_schedule_is_pure_and_rotates_nodes_mixes_and_durations() -> None:
    # Goal: one seed always gives the same soak; seeds S + i; nodes 3 and 5 in turn; every
    # round of len(MIXES) runs deals each mix once; durations stay within the bounds.
    rounds = 3
    runs = list(itertools_take(soak.schedule(40, 60, 900), rounds * len(soak.MIXES)))
    assert runs == list(itertools_take(soak.schedule(40, 60, 900), len(runs)))
    assert runs != list(itertools_take(soak.schedule(41, 60, 900), len(runs)))
    assert [run.seed for run in runs] == [40 + i for i in range(len(runs))]
    assert [run.nodes for run in runs[:4]] == [3, 5, 3, 5]
    assert {run.nodes for run in runs} == {3, 5}
    for number in range(rounds):
        dealt = [run.faults for run in runs[number * len(soak.MIXES):(number + 1) * len(soak.MIXES)]]
        assert sorted(dealt) == sorted(soak.MIXES)
    assert all(60 <= run.duration_s <= 900 for run in runs)
    assert min(run.duration_s for run in runs) < 150 and max(run.duration_s for run in runs) > 500
    assert soak.plan_run(40, 17, 60, 900) == runs[17]
    assert set(soak.ALL) == set(ALL_FAULTS), "the soak rotates every kind the runner has"
    assert {kind for mix in soak.MIXES for kind in mix} == set(ALL_FAULTS)


def itertools_take(iterator: Any, count: int) -> list:
    return [next(iterator) for _ in range(count)]


def test_three_hour_plans_expect_the_release_gate_counts() -> None:
    # Goal: a 3-hour soak meets the gate's fault minima on average with room to spare
    # (1.5x: a nemesis slower than nominal, a kind skipped here), and no seed's plan falls
    # below them; whole-cluster power failures (power, and kill's "all") reach 10.
    ratios: dict[str, list[float]] = {kind: [] for kind in FAULT_MINIMA}
    for seed in range(30):
        runs = soak.plan_soak(seed, THREE_HOURS, 60, 900)
        assert sum(run.duration_s for run in runs) + len(runs) * soak.OVERHEAD_ESTIMATE_S <= THREE_HOURS * 3600
        expected = soak.expected_faults(runs)
        assert expected["power"] >= 10
        for kind, minimum in FAULT_MINIMA.items():
            ratios[kind].append(expected[kind] / minimum)
            assert expected[kind] >= minimum, (seed, kind, expected[kind])
    for kind, values in ratios.items():
        assert statistics.mean(values) >= 1.5, (kind, statistics.mean(values))


def test_expected_faults_split_a_run_evenly_and_kill_all_is_power() -> None:
    # Goal: the arithmetic the gate comparison rests on, on a hand-made plan.
    rate = soak.nemesis_faults_per_s()
    assert 0.14 < rate < 0.16  # nominal: 0.75 faults per (2.5 s gap + 0.75 x 3.25 s hold)
    runs = [soak.PlannedRun(0, 1, 3, ("kill", "pause"), 100.0), soak.PlannedRun(1, 2, 5, ("power",), 50.0)]
    expected = soak.expected_faults(runs, faults_per_s=0.2)
    assert expected["pause"] == pytest.approx(10.0)
    assert expected["kill"] == pytest.approx(8.0)  # 10 kills, one in five of them "all"
    assert expected["power"] == pytest.approx(2.0 + 10.0)
    assert expected["kills"] == pytest.approx(20.0)


def test_fit_duration_shortens_to_the_deadline_never_below_the_minimum() -> None:
    assert soak.fit_duration(600, remaining_s=3600, overhead_s=30, min_run_s=60) == 600
    assert soak.fit_duration(600, remaining_s=400.5, overhead_s=30, min_run_s=60) == 370
    assert soak.fit_duration(600, remaining_s=90, overhead_s=30, min_run_s=60) == 60
    assert soak.fit_duration(600, remaining_s=89, overhead_s=30, min_run_s=60) is None
    assert soak.fit_duration(600, remaining_s=-5, overhead_s=30, min_run_s=60) is None


def test_the_command_line_has_soak() -> None:
    args = _parser().parse_args(["soak", "--hours", "0.5", "--seed", "7", "--max-run-s", "120"])
    assert (args.command, args.hours, args.seed, args.min_run_s, args.max_run_s) == ("soak", 0.5, 7, 60.0, 120.0)
    assert str(args.out) == "chaos-runs"


# -- totals -------------------------------------------------------------------------


def test_totals_add_up_synthetic_runs() -> None:
    # Goal: faults by kind (and the derived kinds the gate names), values, anomalies by
    # class, replicas, findings and the recovery distribution, from the runner's details.
    totals = SoakTotals(seed=1, hours=1.0, min_run_s=60, max_run_s=900, started_at="now")
    totals.add(_record(0, kill=3, power=1, partition_details=("one-way n1 -> n2 dropped", "isolate n1"),
                       corrupt_details=("n1 bitflip: seg 3", "n2 truncate-tail: nothing to corrupt yet"),
                       values=1000, recovery=1.0))
    totals.add(_record(1, ok=False, kill=1, values=500, anomalies={"lost-write": 2, "unseen": 1}, recovery=4.0,
                       identical=8, compared=9, replicas={"identical": 8, "compared": 9,
                                                          "mismatched": ["group 3"], "stuck": []}))
    totals.add(_record(2, ok=False, values=0, recovery=math.inf, crashed={"2": -11}))
    totals.add(_record(3, ok=False, values=0, recovery=None, not_healthy="node 2 did not become healthy"))
    tallies = totals.tallies()
    assert tallies["kill"] == 4 and tallies["power"] == 1 and tallies["kills"] == 5
    assert tallies["kills-lose-unsynced"] == 5
    assert tallies["partition"] == 2 and tallies["partition-one-way"] == 1
    assert tallies["corrupt"] == 2 and tallies["corrupt-damaged"] == 1
    assert totals.values_acknowledged() == 1500
    anomalies = totals.anomalies()
    assert list(anomalies) == list(ANOMALY_CLASSES)
    assert anomalies["lost-write"] == 2 and anomalies["unseen"] == 1 and anomalies["duplicate"] == 0
    findings = totals.findings()
    assert findings["replicas-differ"] == 1 and findings["node-exited"] == 1
    assert findings["not-recovered"] == 1 and findings["not-healthy-after-heal"] == 1
    assert totals.outcomes() == {"pass": 1, "fail": 3, "error": 0, "interrupted": 0}
    assert totals.failed == 3
    assert totals.main_phase_s() == 240 and totals.faults_per_s() == pytest.approx(9 / 240)
    assert totals.recoveries() == [1.0, 4.0]  # inf: not recovered; absent: not measured
    summary = totals.recovery_summary()
    assert (summary["count"], summary["min"], summary["median"], summary["max"]) == (2, 1.0, 2.5, 4.0)
    data = totals.to_json()
    assert data["totals"]["replicas"] == {"identical": 35, "compared": 36}
    gate = {row["what"]: row for row in data["gate"]}
    assert gate["kills (kill + power)"] == {"what": "kills (kill + power)", "count": 5, "minimum": 200, "met": False}
    assert gate["delay windows"]["met"] is None
    assert gate["acknowledged values"]["count"] == 1500
    json.dumps(data, allow_nan=False)  # strict JSON: no Infinity


def test_quantiles_and_histogram() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50 and quantile(values, 0.9) == 90 and quantile(values, 0.99) == 99
    assert quantile([3.0], 0.99) == 3.0
    buckets = dict(histogram([0.5, 1.0, 6.4, 6.5, 100.0]))
    assert buckets["0-1 s"] == 1 and buckets["1-2 s"] == 1 and buckets["5-6.5 s"] == 1
    assert buckets["6.5-10 s"] == 1 and buckets[">= 60 s"] == 1
    assert sum(buckets.values()) == 5


# -- the loop -------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeRuns:
    """Stands in for the runner: writes a run directory, moves the clock by the run's main
    phase plus `overhead_s`, and fails the runs named in `failing`."""

    def __init__(self, clock: FakeClock, directory: Path, failing: set[int] = frozenset(),
                 overhead_s: float = 20.0) -> None:
        self.clock, self.directory, self.failing, self.overhead_s = clock, directory, failing, overhead_s
        self.runs: list[soak.PlannedRun] = []
        self.reports_seen: list[int] = []

    def __call__(self, run: soak.PlannedRun, directory: Path) -> Any:
        report = self.directory / "report.json"
        self.reports_seen.append(len(json.loads(report.read_text())["runs"]) if report.exists() else 0)
        self.runs.append(run)
        directory.mkdir(parents=True)
        (directory / "history.jsonl").write_text("{}\n")
        self.clock.now += run.duration_s + self.overhead_s
        failed = run.index in self.failing
        anomalies = {"duplicate": 1} if failed else {}
        summary = f"chaos: seed {run.seed}; {'FAIL' if failed else 'PASS'}"
        return RunResult(summary, not failed, _details(kill=2, values=100 * (run.index + 1), anomalies=anomalies))


def test_soak_keeps_failed_runs_deletes_passed_ones_and_reports_after_each(tmp_path: Path) -> None:
    # Goal: the loop runs until the deadline, rewrites the report after every run (so a
    # killed soak leaves one), keeps only the failed run's directory, and ends by the deadline.
    clock = FakeClock()
    runs = FakeRuns(clock, tmp_path, failing={1})
    lines: list[str] = []
    options = soak.SoakOptions(hours=0.1, seed=5, min_run_s=60, max_run_s=90)
    totals = soak.soak(options, tmp_path, runs, clock=clock, say=lines.append)
    count = len(runs.runs)
    assert count >= 3
    assert runs.reports_seen == list(range(count)), "a report after every run, before the next"
    assert clock.now - 1000.0 <= 0.1 * 3600
    kept = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert kept == [f"run001-seed{runs.runs[1].seed}"]
    assert totals.state == "done" and totals.failed == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["soak"]["state"] == "done"
    assert report["totals"]["outcomes"]["fail"] == 1
    assert report["totals"]["kept"] == kept
    assert report["totals"]["faults"]["kill"] == 2 * count
    assert report["totals"]["values_acknowledged"] == sum(100 * (i + 1) for i in range(count))
    assert report["totals"]["anomalies"]["duplicate"] == 1
    assert (tmp_path / "report.html").exists() and (tmp_path / "hours.png").exists()
    assert (tmp_path / "recovery.png").exists()
    assert [line.startswith("soak: run ") for line in lines] == [True] * count + [False]
    assert "FAIL (kept run001" in lines[1] and "PASS (deleted)" in lines[0]
    assert lines[-1].startswith("soak: done, seed 5,") and lines[-1].endswith("FAIL")


def test_the_last_run_is_shortened_to_the_deadline_by_the_measured_overhead(tmp_path: Path) -> None:
    # Goal: durations shrink to fit what is left (less the longest overhead seen), never below
    # the minimum; a soak with no failure ends PASS.
    clock = FakeClock()
    runs = FakeRuns(clock, tmp_path, overhead_s=45.0)
    lines: list[str] = []
    totals = soak.soak(soak.SoakOptions(hours=0.1, seed=9, min_run_s=60, max_run_s=300), tmp_path, runs,
                       clock=clock, say=lines.append)
    planned = [soak.plan_run(9, run.index, 60, 300).duration_s for run in runs.runs]
    assert [run.duration_s for run in runs.runs][:-1] == planned[:-1]
    assert 60 <= runs.runs[-1].duration_s <= planned[-1]
    assert clock.now - 1000.0 <= 0.1 * 3600
    assert 0.1 * 3600 - (clock.now - 1000.0) < 60 + 45, "no room was left for one more run"
    assert totals.failed == 0 and lines[-1].endswith("PASS")
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_an_interrupted_run_ends_the_soak_and_is_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeRuns(clock, tmp_path)

    def run_one(run: soak.PlannedRun, directory: Path) -> Any:
        if run.index == 1:
            directory.mkdir()
            return None  # what the real run function returns after SIGINT/SIGTERM
        return fake(run, directory)

    lines: list[str] = []
    totals = soak.soak(soak.SoakOptions(hours=1.0, seed=3), tmp_path, run_one, clock=clock, say=lines.append)
    assert [r.outcome for r in totals.records] == ["pass", "interrupted"]
    assert totals.state == "interrupted" and totals.failed == 0
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["run001-seed4"]
    assert "INTERRUPTED (kept run001-seed4)" in lines[1]
    assert json.loads((tmp_path / "report.json").read_text())["soak"]["state"] == "interrupted"


def test_stopping_before_a_run_starts_none(tmp_path: Path) -> None:
    clock = FakeClock()
    runs = FakeRuns(clock, tmp_path)
    requested = iter([False, True])
    totals = soak.soak(soak.SoakOptions(hours=1.0, seed=3), tmp_path, runs, clock=clock,
                       stopping=lambda: next(requested), say=lambda line: None)
    assert len(runs.runs) == 1 and totals.state == "interrupted"


def test_runs_that_raise_are_failures_and_three_in_a_row_stop_the_soak(tmp_path: Path) -> None:
    def run_one(run: soak.PlannedRun, directory: Path) -> Any:
        raise OSError("no namespace")

    lines: list[str] = []
    totals = soak.soak(soak.SoakOptions(hours=1.0, seed=3), tmp_path, run_one, clock=FakeClock(),
                       say=lines.append)
    assert [r.outcome for r in totals.records] == ["error"] * soak.ERRORS_IN_A_ROW_MAX
    assert totals.state == "stopped" and totals.failed == soak.ERRORS_IN_A_ROW_MAX
    assert "no namespace" in (tmp_path / "run000-seed3" / "soak-error.txt").read_text()
    assert lines[-1].endswith("FAIL")


def test_a_report_with_no_runs_is_still_written(tmp_path: Path) -> None:
    totals = SoakTotals(seed=1, hours=1.0, min_run_s=60, max_run_s=900, started_at="now")
    page = write_report(tmp_path, totals)
    assert "seed 1" in page.read_text()
    assert json.loads((tmp_path / "report.json").read_text())["totals"]["runs"] == 0
    assert not list(tmp_path.glob("*.partial*"))


# -- the real run function's interruption, with the runner stubbed ----------------------


def test_a_signal_cancels_the_run_in_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Goal: SIGINT/SIGTERM (here the handler called directly) cancels the runner's coroutine,
    # which gets to clean up, and the run function answers None (interrupted).
    cleaned: list[bool] = []

    async def endless_run(config: Any, provider: Any) -> Any:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(True)

    monkeypatch.setattr("chaos.runner.run", endless_run)
    interruption = soak.Interruption()
    run_one = soak.real_runner(None, interruption)

    async def signal_soon() -> None:
        async with asyncio.timeout(10):
            while interruption._task is None:  # the run has started (attached)
                await asyncio.sleep(0.01)
        interruption._on_signal(signal.SIGTERM, None)

    def run_and_signal(run: soak.PlannedRun, directory: Path) -> Any:
        return asyncio.run(_together(run_one, run, directory, signal_soon))

    result = run_and_signal(soak.PlannedRun(0, 1, 3, ("kill",), 60.0), tmp_path / "run")
    assert result is None and cleaned == [True] and interruption.requested


async def _together(run_one: Any, run: soak.PlannedRun, directory: Path, signal_soon: Any) -> Any:
    """The run function calls asyncio.run itself: run it in a thread, signal from here."""
    signalling = asyncio.create_task(signal_soon())
    try:
        return await asyncio.wait_for(asyncio.to_thread(run_one, run, directory), 10)
    finally:
        await signalling


def test_main_writes_the_pid_file_while_running_and_exits_one_on_a_failure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Goal: the command's wiring: the PID to stop it by is printed and in soak.pid while it
    # runs (and gone after), the report lands in <out>/soak-<stamp>, a failed run means exit 1.
    directory = tmp_path / "soak-stamp"
    fake = FakeRuns(FakeClock(), directory, failing={0})
    pids: list[str] = []

    def real_runner(capabilities: Any, interruption: soak.Interruption) -> Any:
        def run_one(run: soak.PlannedRun, run_directory: Path) -> Any:
            pids.append((directory / "soak.pid").read_text().strip())
            interruption.requested = True  # as after SIGTERM: this run is the last
            return fake(run, run_directory)
        return run_one

    monkeypatch.setattr(soak, "real_runner", real_runner)
    monkeypatch.setattr("chaos.faults.Capabilities.detect", lambda: None)
    monkeypatch.setattr(soak.Interruption, "install", lambda self: None)
    args = _parser().parse_args(["soak", "--hours", "0.1", "--out", str(tmp_path)])
    assert soak.main(args, seed=11, stamp="stamp") == 1
    assert pids == [str(os.getpid())]
    assert not (directory / "soak.pid").exists()
    assert (directory / "report.json").exists()
    printed = capsys.readouterr().out
    assert f"kill -TERM {pids[0]}" in printed and printed.rstrip().endswith("FAIL")
