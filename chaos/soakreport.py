"""The soak's aggregate report: totals over every run so far, rewritten after each run.

`RunRecord.of` reduces one run's `RunResult.details` (chaos/runner.py) to what the
soak adds up; `SoakTotals` sums them; `write_report` writes, under the soak's
directory, `report.json` (everything, the per-run records included),
`report.html` (the tables), `hours.png` (acknowledged values and anomalies per run
against the hours since the soak began, failed runs marked) and `recovery.png`
(the histogram of the recovery times after the final heal, one per run). Each file
is written beside and renamed into place, so a soak killed mid-write leaves the
previous report whole.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import ANOMALY_CLASSES

# Minimum faults of each kind over a release-gate pass (../shared/CHAOS.md 5.5); kills: kill + power.
FAULT_MINIMA = {"kills": 200, "partition": 100, "pause": 100, "loss": 60, "clock": 60, "corrupt": 60,
                "disk-full": 20}
# (what, tally key, minimum), the same section. A None key: the gate asks for it, this runner
# cannot inject it.
GATE: tuple[tuple[str, str | None, int], ...] = (
    ("kills (kill + power)", "kills", FAULT_MINIMA["kills"]),
    ("kills losing unsynced data", "kills-lose-unsynced", 80),
    ("whole-cluster power failures", "power", 10),
    ("partitions", "partition", FAULT_MINIMA["partition"]),
    ("one-way partitions", "partition-one-way", 20),
    ("metadata-leader isolations", "partition-isolate-leader", 20),
    ("pauses", "pause", FAULT_MINIMA["pause"]),
    ("loss windows", "loss", FAULT_MINIMA["loss"]),
    ("delay windows", None, 60),
    ("clock bumps", "clock", FAULT_MINIMA["clock"]),
    ("corruptions that damaged something", "corrupt-damaged", FAULT_MINIMA["corrupt"]),
    ("disk-full windows", "disk-full", FAULT_MINIMA["disk-full"]),
    ("acknowledged values", "values-acknowledged", 1_000_000),
)
FAULT_KINDS = ("kill", "power", "pause", "partition", "loss", "clock", "disk-full", "corrupt")
DERIVED = ("kills", "kills-lose-unsynced", "partition-one-way", "partition-isolate-leader", "corrupt-damaged")
# Histogram bucket edges, seconds. The gate's liveness bound is 3 x election timeout + 5 s
# (6.5 s with the chaos cluster's 500 ms timeout): the 6.5 edge shows who is past it.
RECOVERY_EDGES_S = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.5, 10.0, 15.0, 30.0, 60.0)
OUTCOMES = ("pass", "fail", "error", "interrupted")
FINDINGS = ("replicas-differ", "replicas-stuck", "two-leaders-in-a-term", "node-exited",
            "not-healthy-after-heal", "not-recovered", "unchecked", "run-error")


@dataclass
class RunRecord:
    """One run as the soak counts it. `outcome`: pass, fail (the run's verdict), error (the
    run raised) or interrupted (stopped by a signal: no verdict, nothing counted)."""

    index: int
    seed: int
    nodes: int
    faults: tuple[str, ...]
    duration_s: float
    started_s: float  # since the soak began
    elapsed_s: float  # the whole run: start, main phase, heal, final reads, checks
    outcome: str
    summary: str
    kept: str | None = None  # the run's directory, when it was kept
    tallies: dict[str, int] = field(default_factory=dict)  # faults by kind, and DERIVED
    values_acknowledged: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)  # checker classes
    findings: dict[str, int] = field(default_factory=dict)  # server-side and run-level failures
    replicas_identical: int = 0
    replicas_compared: int = 0
    recovery_s: float | None = None  # worst partition after the final heal; None: not measured
    faults_skipped: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, details: dict[str, Any], ok: bool, summary: str, lose_unsynced: bool = True,
           **run: Any) -> RunRecord:
        """From the runner's `RunResult` (`details`, `ok`, `summary`); `run` names the rest."""
        findings = _findings(details)
        recovery = details.get("recovery_s")
        return cls(**run, outcome="pass" if ok else "fail", summary=summary,
                   tallies=_tallies(details, lose_unsynced),
                   values_acknowledged=int(details.get("stats", {}).get("values-acknowledged", 0)),
                   anomalies=dict(details.get("anomalies", {})), findings=findings,
                   replicas_identical=int(details.get("replicas", {}).get("identical", 0)),
                   replicas_compared=int(details.get("replicas", {}).get("compared", 0)),
                   recovery_s=None if recovery is None or math.isinf(recovery) else float(recovery),
                   faults_skipped=tuple(details.get("faults_skipped", ())))

    @property
    def failed(self) -> bool:
        return self.outcome in ("fail", "error")

    @property
    def problems(self) -> int:
        return sum(self.anomalies.values()) + sum(self.findings.values())


def _tallies(details: dict[str, Any], lose_unsynced: bool) -> dict[str, int]:
    counts = Counter({kind: int(count) for kind, count in details.get("fault_counts", {}).items()})
    counts["kills"] = counts["kill"] + counts["power"]
    counts["kills-lose-unsynced"] = counts["kills"] if lose_unsynced else 0
    for window in details.get("windows", []):
        kind, detail = window["kind"], window["detail"]
        if kind == "partition" and detail.startswith("one-way"):
            counts["partition-one-way"] += 1
        if kind == "partition" and detail.startswith("isolate-leader"):
            counts["partition-isolate-leader"] += 1
        if kind == "corrupt" and "nothing to corrupt" not in detail:  # chaos/injectors.py _corrupt
            counts["corrupt-damaged"] += 1
    return {kind: count for kind, count in counts.items() if count}


def _findings(details: dict[str, Any]) -> dict[str, int]:
    """What failed a run besides the history checker's classes (chaos/runner.py `_summary`)."""
    replicas = details.get("replicas", {})
    found = {
        "replicas-differ": len(replicas.get("mismatched", ())),
        "replicas-stuck": len(replicas.get("stuck", ())),
        "two-leaders-in-a-term": len(details.get("leaders_per_term", {}).get("violations", ())),
        "node-exited": len(details.get("crashed", {})),
        "not-healthy-after-heal": int(bool(details.get("not_healthy"))),
        "not-recovered": int(details.get("recovery_s") == math.inf),
        "unchecked": len(details.get("unchecked", ())),
    }
    return {name: count for name, count in found.items() if count}


def quantile(values: list[float], share: float) -> float:
    """Nearest rank: the smallest value with at least `share` of the values at or below it."""
    assert values and 0.0 < share <= 1.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def histogram(values: list[float], edges: tuple[float, ...] = RECOVERY_EDGES_S) -> list[tuple[str, int]]:
    """(bucket label, count) over `edges`, with an open last bucket."""
    labels = [f"{low:g}-{high:g} s" for low, high in itertools.pairwise(edges)] + [f">= {edges[-1]:g} s"]
    counts = [0] * len(labels)
    for value in values:
        bucket = sum(1 for edge in edges[1:] if value >= edge)
        counts[bucket] += 1
    return list(zip(labels, counts, strict=True))


@dataclass
class SoakTotals:
    seed: int
    hours: float
    min_run_s: float
    max_run_s: float
    started_at: str  # wall clock, ISO 8601
    state: str = "running"  # running, done, interrupted, stopped (too many errors)
    elapsed_s: float = 0.0
    records: list[RunRecord] = field(default_factory=list)

    def add(self, record: RunRecord) -> None:
        self.records.append(record)

    def outcomes(self) -> dict[str, int]:
        counts = Counter(record.outcome for record in self.records)
        return {outcome: counts[outcome] for outcome in OUTCOMES}

    @property
    def failed(self) -> int:
        return sum(record.failed for record in self.records)

    def tallies(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for record in self.records:
            total.update(record.tallies)
        return dict(total)

    def values_acknowledged(self) -> int:
        return sum(record.values_acknowledged for record in self.records)

    def anomalies(self) -> dict[str, int]:
        """Every checker class (zeros included: a soak report shows what was looked for)."""
        total: Counter[str] = Counter()
        for record in self.records:
            total.update(record.anomalies)
        return {name: total[name] for name in ANOMALY_CLASSES}

    def findings(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for record in self.records:
            total.update(record.findings)
        total["run-error"] = sum(record.outcome == "error" for record in self.records)
        return {name: total[name] for name in FINDINGS}

    def main_phase_s(self) -> float:
        return sum(record.duration_s for record in self.records if record.outcome in ("pass", "fail"))

    def faults_per_s(self) -> float | None:
        """Faults started per second of main phase, to hold against the nemesis's nominal rate."""
        seconds = self.main_phase_s()
        counts = sum(record.tallies.get(kind, 0) for record in self.records for kind in FAULT_KINDS)
        return counts / seconds if seconds else None

    def recoveries(self) -> list[float]:
        return [record.recovery_s for record in self.records if record.recovery_s is not None]

    def recovery_summary(self) -> dict[str, Any]:
        values = self.recoveries()
        if not values:
            return {"count": 0}
        return {"count": len(values), "min": min(values), "median": statistics.median(values),
                "p90": quantile(values, 0.9), "p99": quantile(values, 0.99), "max": max(values),
                "histogram": histogram(values)}

    def gate(self) -> list[dict[str, Any]]:
        tallies = self.tallies() | {"values-acknowledged": self.values_acknowledged()}
        return [{"what": what, "count": tallies.get(key, 0) if key else None, "minimum": minimum,
                 "met": tallies.get(key, 0) >= minimum if key else None} for what, key, minimum in GATE]

    def skipped(self) -> dict[str, int]:
        """Fault kinds the runner could not inject here -> runs that asked for them."""
        counts = Counter(kind for record in self.records for kind in record.faults_skipped)
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "soak": {"seed": self.seed, "hours": self.hours, "min_run_s": self.min_run_s,
                     "max_run_s": self.max_run_s, "started_at": self.started_at, "state": self.state,
                     "elapsed_s": round(self.elapsed_s, 1)},
            "totals": {"runs": len(self.records), "outcomes": self.outcomes(),
                       "main_phase_s": self.main_phase_s(), "faults_per_s": self.faults_per_s(),
                       "faults": self.tallies(), "values_acknowledged": self.values_acknowledged(),
                       "anomalies": self.anomalies(), "findings": self.findings(),
                       "replicas": {"identical": sum(r.replicas_identical for r in self.records),
                                    "compared": sum(r.replicas_compared for r in self.records)},
                       "recovery_s": self.recovery_summary(), "faults_skipped": self.skipped(),
                       "kept": [r.kept for r in self.records if r.kept]},
            "gate": self.gate(),
            "runs": [asdict(record) for record in self.records],
        }


def write_report(directory: Path, totals: SoakTotals) -> Path:
    """report.json, report.html and the plots under `directory`; the HTML page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    data = totals.to_json()
    _replace(directory / "report.json", json.dumps(data, indent=1))
    images = _plots(directory, totals)
    return _replace(directory / "report.html", _page(data, images))


def _replace(path: Path, text: str) -> Path:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
    return path


def _plots(directory: Path, totals: SoakTotals) -> list[tuple[str, str]]:
    """(file name, alt text) of the plots drawn; none without matplotlib or runs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    records = [r for r in totals.records if r.outcome != "interrupted"]
    if not records:
        return []
    images = [("hours.png", "acknowledged values and anomalies per run over the hours, failed runs in red")]
    hours = [(r.started_s + r.elapsed_s) / 3600 for r in records]
    colours = ["#c62828" if r.failed else "#1565c0" for r in records]
    figure, (values, problems) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    values.scatter(hours, [r.values_acknowledged for r in records], c=colours, s=18)
    values.set_ylabel("values acked per run (dots)")
    rate = values.twinx()  # throughput that sinks over the hours is what a soak is for
    rate.plot(hours, [r.values_acknowledged / r.duration_s for r in records], color="#9e9e9e", linewidth=1)
    rate.set_ylabel("per second of main phase (line)")
    rate.set_ylim(bottom=0)
    problems.scatter(hours, [r.problems for r in records], c=colours, s=18)
    problems.set_ylabel("anomalies + findings per run")
    problems.set_xlabel("hours since the soak began (each run at its end)")
    figure.tight_layout()
    _save(figure, directory / images[0][0])
    plt.close(figure)
    recoveries = totals.recoveries()
    if recoveries:
        buckets = histogram(recoveries)
        figure, axis = plt.subplots(figsize=(11, 3.5))
        axis.bar(range(len(buckets)), [count for _, count in buckets], color="#1565c0")
        axis.set_xticks(range(len(buckets)), [label for label, _ in buckets], fontsize=8)
        axis.set_ylabel("runs")
        axis.set_xlabel("recovery after the final heal (worst partition)")
        figure.tight_layout()
        _save(figure, directory / "recovery.png")
        plt.close(figure)
        images.append(("recovery.png", "histogram of recovery times after heal"))
    return images


def _save(figure: Any, path: Path) -> None:
    partial = path.with_name(path.stem + ".partial" + path.suffix)
    figure.savefig(partial, dpi=90)
    os.replace(partial, path)


def _rows(cells: list[list[Any]]) -> str:
    return "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>"
                   for row in cells)


def _rate(value: float | None) -> str:
    return "none yet" if value is None else f"{value:.3f}"


def _seconds(value: Any) -> str:
    return "" if value is None else f"{value:.1f}"


def _page(data: dict[str, Any], images: list[tuple[str, str]]) -> str:
    soak, totals = data["soak"], data["totals"]
    faults = totals["faults"]
    fault_rows = [[kind, faults.get(kind, 0)] for kind in (*FAULT_KINDS, *DERIVED)]
    gate_rows = [[row["what"], "not injectable here" if row["count"] is None else f"{row['count']:,}",
                  f"{row['minimum']:,}", {True: "yes", False: "NO", None: "n/a"}[row["met"]]]
                 for row in data["gate"]]
    recovery = totals["recovery_s"]
    quantiles = [[name, _seconds(recovery.get(name))] for name in ("min", "median", "p90", "p99", "max")]
    run_rows = [[r["index"], r["seed"], r["nodes"], "+".join(r["faults"]), f"{r['duration_s']:.0f}",
                 f"{r['elapsed_s']:.0f}", r["outcome"], f"{r['values_acknowledged']:,}",
                 sum(r["anomalies"].values()) + sum(r["findings"].values()), _seconds(r["recovery_s"]),
                 r["kept"] or ""] for r in data["runs"]]
    summaries = "\n".join(r["summary"] for r in data["runs"] if r["outcome"] != "pass")
    replicas = totals["replicas"]
    kept = " ".join(f'<a href="{html.escape(name)}/">{html.escape(name)}</a>' for name in totals["kept"])
    return f"""<!doctype html><meta charset="utf-8"><title>raftlog soak, seed {soak['seed']}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 8px;text-align:left}}
table{{margin-bottom:1em}} pre{{background:#f5f5f5;padding:1em;white-space:pre-wrap}}</style>
<h1>raftlog soak, seed {soak['seed']}: {html.escape(soak['state'])}</h1>
<p>Began {html.escape(soak['started_at'])}, {soak['elapsed_s'] / 3600:.2f} h of {soak['hours']:g} h;
runs of {soak['min_run_s']:g}-{soak['max_run_s']:g} s. Runs: {totals['runs']}
({', '.join(f'{k} {v}' for k, v in totals['outcomes'].items())}), main phases {totals['main_phase_s'] / 3600:.2f} h,
faults started per second of main phase: {_rate(totals['faults_per_s'])}.
Values acknowledged: {totals['values_acknowledged']:,}. Replicas byte-identical:
{replicas['identical']}/{replicas['compared']} groups.</p>
{''.join(f'<p><img src="{name}" alt="{html.escape(alt)}"></p>' for name, alt in images)}
<h2>Faults by kind</h2><table><tr><th>kind</th><th>count</th></tr>{_rows(fault_rows)}</table>
<h2>Against the release gate (../shared/CHAOS.md 5.5, cumulative)</h2>
<table><tr><th>what</th><th>count</th><th>minimum</th><th>met</th></tr>{_rows(gate_rows)}</table>
<h2>Anomalies by class</h2><table><tr><th>class</th><th>count</th></tr>
{_rows([[k, v] for k, v in totals['anomalies'].items()])}</table>
<h2>Other findings</h2><table><tr><th>finding</th><th>count</th></tr>
{_rows([[k, v] for k, v in totals['findings'].items()])}</table>
<h2>Recovery after the final heal (one per run, worst partition)</h2>
<table><tr><th></th><th>s</th></tr>{_rows([['runs', recovery['count']], *quantiles])}</table>
<table><tr><th>bucket</th><th>runs</th></tr>{_rows([list(b) for b in recovery.get('histogram', [])])}</table>
<h2>Runs</h2><table><tr><th>#</th><th>seed</th><th>nodes</th><th>faults</th><th>s</th><th>wall s</th>
<th>outcome</th><th>values acked</th><th>problems</th><th>recovery s</th><th>kept</th></tr>{_rows(run_rows)}</table>
<h2>Runs that did not pass</h2><p>Kept: {kept or 'none'}</p><pre>{html.escape(summaries or 'none')}</pre>
<p>Skipped fault kinds (runs): {html.escape(str(totals['faults_skipped']) or 'none')}.
<a href="report.json">report.json</a></p>
"""
