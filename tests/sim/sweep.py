"""Run many simulation seeds: `python -m tests.sim.sweep --seeds 5000 --start 0`.

Prints progress, a summary of what the seeds exercised, and for a failure the
seed, the broken invariant and the command that replays it with a trace.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter

from tests.sim.simulator import SimOptions, run_seed


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m tests.sim.sweep --seeds 1 --start {seed} --verbose"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="trace every event of each seed")
    parser.add_argument("--keep-going", action="store_true", help="continue after a failure")
    args = parser.parse_args(argv)
    failures: list[int] = []
    totals: Counter[str] = Counter()
    began = time.monotonic()
    for seed in range(args.start, args.start + args.seeds):
        options = None
        if args.verbose:
            options = SimOptions(trace=print)
            import random

            options.nodes = random.Random(seed ^ 0x5EED).choice([3, 3, 5])
        try:
            result = run_seed(seed, options)
        except AssertionError as error:
            failures.append(seed)
            print(f"\nFAILED seed {seed}: {error}", file=sys.stderr)
            traceback.print_exc()
            print(f"replay: {replay_command(seed)}", file=sys.stderr)
            if not args.keep_going:
                break
            continue
        totals["events"] += result.events
        totals["acked"] += result.acked
        totals["crashes"] += result.crashes
        totals["reads"] += result.reads_checked
        totals["leaders"] += result.leaders_elected
        totals["worst_heal_to_commit_ticks"] = max(totals["worst_heal_to_commit_ticks"], result.heal_to_commit_ticks)
        done = seed - args.start + 1
        if done % 100 == 0 or done == args.seeds:
            rate = totals["events"] / max(time.monotonic() - began, 1e-9)
            print(f"seeds {done}/{args.seeds} ok, {rate:,.0f} events/s", file=sys.stderr)
    elapsed = time.monotonic() - began
    print(
        f"sim: {args.seeds} seeds from {args.start}, {len(failures)} failed {failures[:10]}; "
        f"{totals['events']:,} events, {totals['acked']:,} proposals acknowledged, "
        f"{totals['leaders']:,} leaders elected, {totals['crashes']:,} crashes, "
        f"{totals['reads']:,} linearizable reads checked; worst heal-to-commit "
        f"{totals['worst_heal_to_commit_ticks']} ticks; {elapsed:.1f} s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
