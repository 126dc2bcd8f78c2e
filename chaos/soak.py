"""`python -m chaos soak --hours H`: chaos runs back to back, one aggregate report.

    python -m chaos soak --hours 3 [--seed S] [--out chaos-runs] [--min-run-s 60] [--max-run-s 900]

The schedule (`schedule`) is a pure function of the base seed: run i has seed
S + i (as `suite` numbers its runs), 3 and 5 nodes in turn, a main phase drawn
log-uniformly between the shortest and the longest run (more short runs, so more
cluster starts and final heals; the long ones still reach 15 minutes), and a
fault mix from `MIXES`, dealt like a deck: each mix once per round of twelve.

Why these mixes. The nemesis (chaos/nemesis.py) starts a fault about every
6.6 s of main phase (a 1-4 s gap, a quarter of the slots quiet, a 1.5-5 s hold)
and picks its kind uniformly among the run's kinds; a `kill` picks "all" one
time in five, which counts as `power`. So a kind's share of the faults is the
sum, over the deck, of 1 / (size of each mix that holds it): kills (kill +
power) get a third, pauses and partitions a sixth each, loss, clock and
corruption a tenth each, disk-full a thirtieth, the release gate's own
proportions (../shared/CHAOS.md 5.5: 200 kills, 100 partitions, 100 pauses, 60
loss, 60 clock, 60 corruption, 20 disk-full). Durations differ, though, so the
mix dealt next is the one that, for this run's duration, keeps the kinds'
main-phase seconds closest to those proportions (`_spread`). `expected_faults`
turns a plan into counts; docs/chaos.md ("Soak") has them for 3 hours, and a
unit test holds every 3-hour plan to the gate.

The deadline. Before each run the soak fits its duration to what is left of H
hours, less the longest overhead (start, heal, final reads, checks) a run has
had so far (`fit_duration`): shortened if need be, never below the shortest run;
when not even that fits, the soak ends. A run's overhead beyond the estimate can
still carry the end past the deadline by that much.

After each run its record is added up (`chaos.soakreport`), its directory is
deleted when it passed and kept otherwise, the report is rewritten, and one
`soak:` line printed; a last `soak:` line ends the soak. SIGINT and SIGTERM
cancel the run in progress the way Ctrl-C cancels `python -m chaos run` (its
cluster stopped, its faults undone; no verdict, so its directory is kept),
then the report is written and the soak exits: 1 when any run failed, else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from chaos import nemesis
from chaos.soakreport import FAULT_KINDS, FAULT_MINIMA, RunRecord, SoakTotals, write_report

# Every fault kind of the runner (chaos/__main__.py ALL_FAULTS), in one order.
ALL = FAULT_KINDS
MIXES: tuple[tuple[str, ...], ...] = (
    ("kill",),
    ("kill", "power"),
    ("kill", "corrupt"),
    ("kill", "pause"),
    ("kill", "partition"),
    ("pause",),
    ("partition",),
    ("pause", "clock"),
    ("partition", "loss"),
    ("loss", "clock", "corrupt"),
    ("disk-full", "loss", "clock", "corrupt"),
    ALL,
)
NODE_ROTATION = (3, 5)
# Overhead assumed before any run has been measured, and in `plan_soak`: cluster start,
# topics, heal, recovery, final reads, replica comparison, the checker, the report.
OVERHEAD_ESTIMATE_S = 30.0
ERRORS_IN_A_ROW_MAX = 3  # runs that raised, one after another: something is broken, stop
PROCESS_KINDS = frozenset({"kill", "power", "pause"})  # need no injectors (chaos/__main__.py)


@dataclass(frozen=True, slots=True)
class PlannedRun:
    index: int
    seed: int
    nodes: int
    faults: tuple[str, ...]
    duration_s: float

    def replay(self) -> str:
        return (f"python -m chaos run --nodes {self.nodes} --duration {self.duration_s:g} "
                f"--faults {','.join(self.faults)} --seed {self.seed}")


def schedule(base_seed: int, min_run_s: float, max_run_s: float) -> Iterator[PlannedRun]:
    """Every run of the soak with seed `base_seed`, in order, without end: pure, the same
    every time. Each round of len(MIXES) runs deals every mix once; the next one dealt is
    the mix that, given the run's drawn duration, brings the kinds' main-phase seconds
    closest to the gate's proportions (`_spread`), ties in an order drawn from the seed.
    Dealt in the shuffled order alone, the long runs fell on mixes at random: a 3-hour
    plan could expect half the disk-full minimum (docs/chaos.md, "Soak")."""
    assert 0 < min_run_s <= max_run_s
    seconds = dict.fromkeys(FAULT_MINIMA, 0.0)  # main phase given to each gate kind so far
    index = 0
    while True:
        deck = list(MIXES)
        random.Random(f"soak-deck:{base_seed}:{index // len(MIXES)}").shuffle(deck)
        while deck:
            draw = random.Random(f"soak-duration:{base_seed}:{index}").random()
            duration = float(min(max(round(min_run_s * (max_run_s / min_run_s) ** draw), min_run_s), max_run_s))
            mix = min(deck, key=lambda m: (_spread(_given(seconds, m, duration)), deck.index(m)))
            deck.remove(mix)
            seconds = _given(seconds, mix, duration)
            yield PlannedRun(index=index, seed=base_seed + index, nodes=NODE_ROTATION[index % len(NODE_ROTATION)],
                             faults=mix, duration_s=duration)
            index += 1


def plan_run(base_seed: int, index: int, min_run_s: float, max_run_s: float) -> PlannedRun:
    """Run `index` of `schedule(base_seed, ...)`."""
    return next(itertools.islice(schedule(base_seed, min_run_s, max_run_s), index, None))


def _gate_kind(kind: str) -> str:
    return "kills" if kind in ("kill", "power") else kind


def _given(seconds: dict[str, float], mix: tuple[str, ...], duration_s: float) -> dict[str, float]:
    """Main-phase seconds per gate kind once a run of `mix` is added (the nemesis splits a
    run's faults evenly among its kinds)."""
    after = dict(seconds)
    for kind in mix:
        after[_gate_kind(kind)] += duration_s / len(mix)
    return after


def _spread(seconds: dict[str, float]) -> float:
    """How far the kinds' shares are from the gate's: the gate-weighted variance of
    seconds / minimum around the common ratio."""
    ratio = sum(seconds.values()) / sum(FAULT_MINIMA.values())
    return sum(minimum * (seconds[kind] / minimum - ratio) ** 2 for kind, minimum in FAULT_MINIMA.items())


def fit_duration(planned_s: float, remaining_s: float, overhead_s: float, min_run_s: float) -> float | None:
    """The main phase that ends the run by the deadline, `planned_s` at most; None: none fits."""
    available = math.floor(remaining_s - overhead_s)
    if available < min_run_s:
        return None
    return min(planned_s, float(available))


def plan_soak(base_seed: int, hours: float, min_run_s: float, max_run_s: float,
              overhead_s: float = OVERHEAD_ESTIMATE_S) -> list[PlannedRun]:
    """The runs a soak would make if every run took its main phase plus `overhead_s`."""
    runs: list[PlannedRun] = []
    remaining = hours * 3600
    for planned in schedule(base_seed, min_run_s, max_run_s):
        duration = fit_duration(planned.duration_s, remaining, overhead_s, min_run_s)
        if duration is None:
            return runs
        runs.append(replace(planned, duration_s=duration))
        remaining -= duration + overhead_s
    raise AssertionError("the schedule has no end")


def nemesis_faults_per_s() -> float:
    """Faults the nemesis starts per second of main phase, from its nominal timings."""
    mean_gap = sum(nemesis.GAP_S) / 2
    mean_hold = sum(nemesis.HOLD_S) / 2
    busy = 1 - nemesis.QUIET_SHARE
    return busy / (mean_gap + busy * mean_hold)


def expected_faults(runs: list[PlannedRun], faults_per_s: float | None = None) -> dict[str, float]:
    """Expected faults by kind over `runs`, plus `kills` (kill + power) as the gate counts them."""
    rate = nemesis_faults_per_s() if faults_per_s is None else faults_per_s
    all_share = nemesis.KILL_TARGETS.count("all") / len(nemesis.KILL_TARGETS)
    expected = dict.fromkeys(FAULT_KINDS, 0.0)
    for run in runs:
        each = rate * run.duration_s / len(run.faults)
        for kind in run.faults:
            if kind == "kill":
                expected["kill"] += each * (1 - all_share)
                expected["power"] += each * all_share
            else:
                expected[kind] += each
    expected["kills"] = expected["kill"] + expected["power"]
    return expected


# -- the loop -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SoakOptions:
    hours: float
    seed: int
    min_run_s: float = 60.0
    max_run_s: float = 900.0


# (the planned run, its directory) -> the runner's RunResult, or None when interrupted.
RunFunction = Callable[[PlannedRun, Path], Any]


def soak(options: SoakOptions, directory: Path, run_one: RunFunction, *,
         stopping: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic,
         say: Callable[[str], None] = print) -> SoakTotals:
    """Runs until the deadline, an interruption (`stopping`, or `run_one` returning None) or
    ERRORS_IN_A_ROW_MAX runs that raised; the report is rewritten after every run."""
    began = clock()
    deadline = began + options.hours * 3600
    totals = SoakTotals(seed=options.seed, hours=options.hours, min_run_s=options.min_run_s,
                        max_run_s=options.max_run_s, started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    overheads: list[float] = []  # beyond the main phase, of every run that reached a verdict
    errors_in_a_row = 0
    for planned in schedule(options.seed, options.min_run_s, options.max_run_s):
        if stopping():
            break
        index = planned.index
        overhead = max(overheads, default=OVERHEAD_ESTIMATE_S)
        duration = fit_duration(planned.duration_s, deadline - clock(), overhead, options.min_run_s)
        if duration is None:
            totals.state = "done"
            break
        run = replace(planned, duration_s=duration)
        run_directory = directory / f"run{index:03d}-seed{run.seed}"
        started = clock()
        record = _one_run(run, run_directory, run_one, started - began, clock)
        if record.outcome == "pass":
            shutil.rmtree(run_directory, ignore_errors=True)
        elif run_directory.exists():
            record.kept = run_directory.name
        if record.outcome in ("pass", "fail"):
            overheads.append(record.elapsed_s - run.duration_s)
        totals.add(record)
        totals.elapsed_s = clock() - began
        report = write_report(directory, totals)
        say(run_line(record, totals, report))
        errors_in_a_row = errors_in_a_row + 1 if record.outcome == "error" else 0
        if record.outcome == "interrupted":
            break
        if errors_in_a_row >= ERRORS_IN_A_ROW_MAX:
            totals.state = "stopped"
            break
    if totals.state == "running":
        totals.state = "interrupted"
    totals.elapsed_s = clock() - began
    report = write_report(directory, totals)
    say(final_line(totals, report))
    return totals


def _one_run(run: PlannedRun, directory: Path, run_one: RunFunction, started_s: float,
             clock: Callable[[], float]) -> RunRecord:
    began = clock()
    common = {"index": run.index, "seed": run.seed, "nodes": run.nodes, "faults": run.faults,
              "duration_s": run.duration_s, "started_s": started_s}
    try:
        result = run_one(run, directory)
    except Exception as error:  # a harness failure is a failed run, with the traceback kept
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "soak-error.txt").write_text(traceback.format_exc())
        return RunRecord(**common, elapsed_s=clock() - began, outcome="error",
                         summary=f"run {run.index} (seed {run.seed}) raised {error!r}; replay: {run.replay()}")
    if result is None:
        return RunRecord(**common, elapsed_s=clock() - began, outcome="interrupted",
                         summary=f"run {run.index} (seed {run.seed}) interrupted")
    return RunRecord.of(details=result.details, ok=result.ok, summary=result.summary,
                        elapsed_s=clock() - began, **common)


def _kinds(tallies: dict[str, int]) -> str:
    return ", ".join(f"{kind} {tallies[kind]}" for kind in FAULT_KINDS if tallies.get(kind)) or "none"


def _recovery(totals: SoakTotals) -> str:
    summary = totals.recovery_summary()
    if not summary["count"]:
        return "recovery after heal: none measured"
    return (f"recovery after heal: median {summary['median']:.1f} s, p90 {summary['p90']:.1f} s, "
            f"max {summary['max']:.1f} s")


def _problems(totals: SoakTotals) -> str:
    found = {name: count for name, count in (*totals.anomalies().items(), *totals.findings().items()) if count}
    return " ".join(f"{name}={count}" for name, count in found.items()) or "none"


def run_line(record: RunRecord, totals: SoakTotals, report: Path) -> str:
    verdict = {"pass": "PASS (deleted)", "fail": f"FAIL (kept {record.kept})",
               "error": f"ERROR (kept {record.kept})", "interrupted": f"INTERRUPTED (kept {record.kept})"}
    replicas = totals.to_json()["totals"]["replicas"]
    return (f"soak: run {record.index} seed {record.seed}, {record.nodes} nodes, {'+'.join(record.faults)}, "
            f"{record.duration_s:.0f} s in {record.elapsed_s:.0f} s: {verdict[record.outcome]}; "
            f"so far {len(totals.records)} runs, {totals.failed} failed, "
            f"{totals.values_acknowledged():,} values acked, faults: {_kinds(totals.tallies())}; "
            f"problems: {_problems(totals)}; replicas byte-identical: "
            f"{replicas['identical']}/{replicas['compared']}; {_recovery(totals)}; report {report}")


def final_line(totals: SoakTotals, report: Path) -> str:
    outcomes = totals.outcomes()
    replicas = totals.to_json()["totals"]["replicas"]
    tallies = totals.tallies()
    return (f"soak: {totals.state}, seed {totals.seed}, {len(totals.records)} runs in "
            f"{totals.elapsed_s / 3600:.2f} h ({outcomes['pass']} passed, {outcomes['fail']} failed, "
            f"{outcomes['error']} errors, {outcomes['interrupted']} interrupted); "
            f"faults: {_kinds(tallies)} (whole-cluster power {tallies.get('power', 0)}); "
            f"{totals.values_acknowledged():,} values acked; problems: {_problems(totals)}; "
            f"replicas byte-identical: {replicas['identical']}/{replicas['compared']}; {_recovery(totals)}; "
            f"report {report}; {'FAIL' if totals.failed else 'PASS'}")


def plan_line(options: SoakOptions) -> str:
    runs = plan_soak(options.seed, options.hours, options.min_run_s, options.max_run_s)
    expected = expected_faults(runs)
    parts = [f"{kind} {expected[kind]:.0f}" + (f" (gate {FAULT_MINIMA[kind]})" if kind in FAULT_MINIMA else "")
             for kind in ("kills", "power", "partition", "pause", "loss", "clock", "corrupt", "disk-full")]
    return (f"soak plan: seed {options.seed}, {options.hours:g} h, runs of {options.min_run_s:g}-"
            f"{options.max_run_s:g} s: about {len(runs)} runs if each takes {OVERHEAD_ESTIMATE_S:.0f} s "
            f"beyond its main phase; expected faults: {', '.join(parts)}")


# -- the real thing: signals and the runner -------------------------------------------


class Interruption:
    """SIGINT and SIGTERM: remember, and cancel the run in progress (once)."""

    def __init__(self) -> None:
        self.requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def install(self) -> None:
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self._on_signal)

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if self.requested:
            print(f"soak signal: {signal.Signals(number).name} again: already stopping", flush=True)
            return
        self.requested = True
        print(f"soak signal: {signal.Signals(number).name}: stopping after the run in progress is cleaned up", flush=True)
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)

    def attach(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()

    def detach(self) -> None:
        self._loop = self._task = None


def real_runner(capabilities: Any, interruption: Interruption) -> RunFunction:
    def run_one(run: PlannedRun, directory: Path) -> Any:
        return asyncio.run(_run(run, directory, capabilities, interruption))
    return run_one


async def _run(run: PlannedRun, directory: Path, capabilities: Any, interruption: Interruption) -> Any:
    from chaos.injectors import SEED_XOR, Injectors
    from chaos.runner import RunConfig
    from chaos.runner import run as chaos_run

    provider = None
    if capabilities is not None and set(run.faults) - PROCESS_KINDS:
        provider = Injectors(directory, random.Random(run.seed ^ SEED_XOR), capabilities)
    print(f"chaos: run seed {run.seed}, {run.nodes} nodes, faults {','.join(run.faults)}, "
          f"{run.duration_s:.0f} s, out {directory} (replay: {run.replay()})", flush=True)
    interruption.attach()
    try:
        if interruption.requested:
            return None  # the signal came after the soak's last look and before attach()
        result = await chaos_run(RunConfig(out=directory, seed=run.seed, nodes=run.nodes,
                                           duration_s=run.duration_s, faults=list(run.faults)), provider)
    except asyncio.CancelledError:
        if interruption.requested:
            return None
        raise
    finally:
        interruption.detach()
    print(result.summary, flush=True)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hours", type=float, required=True, help="the soak's length (runs are fitted to it)")
    parser.add_argument("--seed", type=int, default=None, help="base seed; run i has seed S + i")
    parser.add_argument("--out", type=Path, default=Path("chaos-runs"))
    parser.add_argument("--min-run-s", type=float, default=60.0, help="shortest main phase")
    parser.add_argument("--max-run-s", type=float, default=900.0, help="longest main phase")


def main(args: argparse.Namespace, seed: int, stamp: str) -> int:
    if not 0 < args.min_run_s <= args.max_run_s:
        raise SystemExit("soak: need 0 < --min-run-s <= --max-run-s")
    if args.hours * 3600 < args.min_run_s + OVERHEAD_ESTIMATE_S:
        raise SystemExit(f"soak: {args.hours:g} h holds no run of {args.min_run_s:g} s "
                         f"(plus about {OVERHEAD_ESTIMATE_S:.0f} s around it)")
    from chaos import faults

    options = SoakOptions(hours=args.hours, seed=seed, min_run_s=args.min_run_s, max_run_s=args.max_run_s)
    interruption = Interruption()
    interruption.install()
    directory = args.out / f"soak-{stamp}"
    directory.mkdir(parents=True, exist_ok=True)
    # This process runs inside the namespaces, under `unshare`, which blocks SIGINT and SIGTERM
    # in itself (util-linux 2.38 has no --forward-signals): a stop from elsewhere must name
    # this PID. Ctrl-C in the terminal reaches it directly (the whole process group).
    pid_file = directory / "soak.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    print(plan_line(options), flush=True)
    print(f"soak plan: report under {directory} (rewritten after every run); stop it with Ctrl-C "
          f"or kill -TERM {os.getpid()} (also in {pid_file})", flush=True)
    try:
        capabilities = faults.Capabilities.detect()
        totals = soak(options, directory, real_runner(capabilities, interruption),
                      stopping=lambda: interruption.requested, say=lambda line: print(line, flush=True))
    finally:
        pid_file.unlink(missing_ok=True)
    return 1 if totals.failed else 0
