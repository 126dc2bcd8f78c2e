"""`python -m chaos run ...`: one chaos run (or several), printing `chaos:` summary lines.

    python -m chaos run --nodes 3 --duration 60 --faults kill,pause,partition --seed 7 --out DIR [--groups]
                        [--far-catchup]   # far-horizon catch-up driven hard (chaos/farcatchup.py)
                        [--mirror]        # a second cluster mirrors the topics, faults on it too (chaos/mirror.py)
    python -m chaos suite NAME --out DIR         # the Makefile's standard sets: smoke, standard, controls
    python -m chaos soak --hours 3 --seed S      # runs back to back, one aggregate report (chaos/soak.py)

The runner enters fresh network and mount namespaces first (so partition rules
and tmpfs mounts can never touch the host, and vanish with the run); every
server listens on 127.0.0.N inside them. Exit code: 0 when every run passed
(for `controls`: when every unsafe switch was caught), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ALL_FAULTS = ("kill", "power", "pause", "partition", "loss", "clock", "disk-full", "corrupt")
# Kinds that need a cluster shape, not a capability: `move` (chaos/moves.py) needs more nodes
# than the replication factor. Not in ALL_FAULTS, the mix of the 3-node "all" runs and of
# the soak's deck (whose proportions are the release gate's); runs name it explicitly.
SHAPE_FAULTS = ("move",)
KNOWN_FAULTS = ALL_FAULTS + SHAPE_FAULTS
# (faults, duration factor) per run of each suite; seeds come from the suite's seed.
SUITES: dict[str, list[tuple[str, ...]]] = {
    "smoke": [("kill", "pause", "partition", "corrupt")],
    "standard": [("kill", "power"), ("pause", "clock"), ("partition", "loss"), ("corrupt", "kill"),
                 ("disk-full", "kill"), ALL_FAULTS],
}
# Runs on five nodes, after the suite's three-node ones: a move (decommission) needs a node
# beyond the replication factor to move replicas to.
FIVE_NODE_RUNS: dict[str, list[tuple[str, ...]]] = {
    "standard": [("move", "kill", "pause", "partition")],
}
# Runs with the consumer-group workload too (chaos/group_workload.py), after the suite's others.
GROUP_RUNS: dict[str, list[tuple[str, ...]]] = {
    "standard": [("kill", "pause", "partition")],
}
# Runs with far-horizon catch-up driven hard (--far-catchup, chaos/farcatchup.py), after the
# suite's others. A node restarted after a kill is what opens its window (docs/chaos.md), so
# kills get half the faults; power failures strike installs under way.
FAR_CATCHUP_RUNS: dict[str, list[tuple[str, ...]]] = {
    "standard": [("kill", "power")],
}
# Runs with a mirror (--mirror, chaos/mirror.py): a sink cluster of three more nodes
# copies the topics; its own kinds (sink-kill, sink-pause, link-cut, link-pause, source-grow, source-truncate) join these.
MIRROR_RUNS: dict[str, list[tuple[str, ...]]] = {
    "standard": [("kill", "pause", "partition")],
    "mirror": [("kill", "pause", "partition")],
}
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one run")
    one.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    one.add_argument("--duration", type=float, default=60.0, help="seconds of the main phase")
    one.add_argument("--faults", default="kill,pause", help=f"comma list of {','.join(KNOWN_FAULTS)}")
    one.add_argument("--seed", type=int, default=None)
    one.add_argument("--out", type=Path, default=Path("chaos-runs"))
    one.add_argument("--unsafe", default="", help="server negative-control switches (testing the tests)")
    one.add_argument("--groups", action="store_true", help="run the consumer-group workload too")
    one.add_argument("--far-catchup", action="store_true",
                     help="small far-horizon thresholds and small segments, so lagging followers get whole "
                          "segment files (chaos/farcatchup.py); the summary counts the installs")
    one.add_argument("--mirror", action="store_true",
                     help="a sink cluster (127.0.0.11-13) mirrors the topics under sink and link faults of its "
                          "own; the mirror's logs are checked against the source's (chaos/mirror.py)")
    suite = commands.add_parser("suite", help="a standard set of runs")
    suite.add_argument("name", choices=(*SUITES, "mirror", "controls"))
    suite.add_argument("--duration", type=float, default=60.0)
    suite.add_argument("--seed", type=int, default=None)
    suite.add_argument("--out", type=Path, default=Path("chaos-runs"))
    from chaos.soak import add_arguments

    add_arguments(commands.add_parser("soak", help="runs back to back for hours, one aggregate report"))
    return parser


async def _one(out: Path, seed: int, nodes: int, duration: float, faults: list[str], unsafe: list[str],
               groups: bool = False, far_catchup: bool = False, mirror: bool = False) -> bool:
    return (await _one_run(out, seed, nodes, duration, faults, unsafe, groups, far_catchup, mirror)).ok


async def _one_run(out: Path, seed: int, nodes: int, duration: float, faults: list[str], unsafe: list[str],
                   groups: bool = False, far_catchup: bool = False, mirror: bool = False) -> Any:
    """One run, printed; its RunResult (`ok`, `details`)."""
    from chaos.farcatchup import never_taken
    from chaos.runner import RunConfig, run

    unknown = sorted(set(faults) - set(KNOWN_FAULTS))
    if unknown:
        raise SystemExit(f"unknown fault kinds: {', '.join(unknown)} (known: {', '.join(KNOWN_FAULTS)})")
    provider = None
    try:
        from chaos.injectors import SEED_XOR, Injectors
    except ImportError:
        Injectors = None  # type: ignore[assignment,misc]
    if Injectors is not None and (mirror or set(faults) - {"kill", "power", "pause", "move"}):
        provider = Injectors.detect(out, random.Random(seed ^ SEED_XOR))
    print(f"chaos: run seed {seed}, faults {','.join(faults)}, {duration:.0f} s"
          f"{', consumer groups' if groups else ''}{', far catch-up' if far_catchup else ''}"
          f"{', mirror' if mirror else ''}, out {out}", flush=True)
    result = await run(RunConfig(out=out, seed=seed, nodes=nodes, duration_s=duration, faults=faults,
                                 unsafe=unsafe, groups=groups, far_catchup=far_catchup, mirror=mirror), provider)
    print(result.summary, flush=True)
    if far_catchup and never_taken(result.details["far_catchup"]):
        print(f"chaos: WARNING: seed {seed}: --far-catchup run, but no far-horizon install happened: "
              f"this run did not test that path", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from chaos.faults import enter_namespaces
    except ImportError:
        enter_namespaces = None  # type: ignore[assignment]
    if enter_namespaces is not None and os.environ.get("RAFTLOG_CHAOS_NO_NS") != "1":
        enter_namespaces(["-m", "chaos", *(argv if argv is not None else sys.argv[1:])])
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.command == "soak":
        from chaos.soak import main as soak

        return soak(args, seed, stamp)
    if args.command == "run":
        out = args.out / f"{stamp}-seed{seed}"
        unsafe = [s for s in args.unsafe.split(",") if s]
        ok = asyncio.run(_one(out, seed, args.nodes, args.duration, args.faults.split(","), unsafe, args.groups,
                              args.far_catchup, args.mirror))
        return 0 if ok else 1
    if args.name == "controls":
        return _controls(args.out, stamp, seed, args.duration)
    results = []
    runs = [(faults, 3, False, False, False) for faults in SUITES.get(args.name, [])]
    runs += [(faults, 5, False, False, False) for faults in FIVE_NODE_RUNS.get(args.name, [])]
    runs += [(faults, 3, True, False, False) for faults in GROUP_RUNS.get(args.name, [])]
    runs += [(faults, 3, False, True, False) for faults in FAR_CATCHUP_RUNS.get(args.name, [])]
    runs += [(faults, 3, False, False, True) for faults in MIRROR_RUNS.get(args.name, [])]
    for number, (faults, nodes, groups, far, mirror) in enumerate(runs):
        suffix = ("-groups" if groups else "") + ("-far" if far else "") + ("-mirror" if mirror else "")
        out = args.out / f"{stamp}-{args.name}{number}{suffix}-seed{seed + number}"
        results.append(asyncio.run(_one(out, seed + number, nodes, args.duration, list(faults), [], groups, far,
                                        mirror)))
    print(f"chaos: suite {args.name}: {sum(results)}/{len(results)} runs passed", flush=True)
    return 0 if all(results) else 1


def _controls(out: Path, stamp: str, seed: int, duration: float) -> int:
    """Every control, each in its own run; one that raises is reported and the next runs."""
    from chaos.controls import CONTROLS, verdict

    caught = 0
    for number, (switch, control) in enumerate(CONTROLS.items()):
        directory = out / f"{stamp}-control-{switch}"
        try:
            result = asyncio.run(_one_run(directory, seed + number, 3, duration, list(control.faults), [switch],
                                          control.groups, mirror=control.mirror))
            judged = verdict(switch, result.ok, result.details)
        except Exception as error:  # a harness failure proves nothing: not caught, and the next control runs
            judged = verdict(switch, None, None, repr(error))
        print(judged.line(), flush=True)
        caught += judged.caught
    print(f"chaos-controls: {caught}/{len(CONTROLS)} unsafe switches caught", flush=True)
    return 0 if caught == len(CONTROLS) else 1


if __name__ == "__main__":
    sys.exit(main())
