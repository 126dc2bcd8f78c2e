"""Where a sequential write's time goes, leg by leg, in each process: the table
`bench/sequential.py --legs` prints from the marks bench/trace_legs/ recorded.

A leg is the stretch between two marks of one process (say, from a follower's
frame arriving to its segment append). For each leg: the median wall time, and
the median CPU time of the thread in that stretch. Wall well above CPU means the
process slept (an fsync) or waited for a core; CPU near wall means its own work.
Legs are matched within one write: a sequence is dropped if a mark is missing
within LEG_WINDOW_S of its start (heartbeats and the like start no write).
"""

from __future__ import annotations

import statistics
from pathlib import Path

LEG_WINDOW_S = 0.003

# Per role, the marks of one write in order (tags of bench/trace_legs/sitecustomize.py).
SEQUENCES = {
    "leader: request to its own fsync": ["request", "handler", "propose", "send", "append", "fsync", "fsync.end",
                                         "flushed.end"],
    "leader: first answer to response": ["frame", "apply", "answer", "written"],
    "follower: append to answer": ["frame", "append", "fsync", "fsync.end", "flushed.end", "send"],
}
ROLE_OF = {name: name.split(":")[0] for name in SEQUENCES}

Mark = tuple[float, float, str]


def read_marks(path: Path) -> list[Mark]:
    marks = []
    for line in path.read_text().splitlines():
        wall, cpu, tag = line.split()
        marks.append((float(wall), float(cpu), tag))
    return marks


def legs(marks: list[Mark], sequence: list[str]) -> list[tuple[str, float, float]] | None:
    """(leg, median wall s, median CPU s) for each step of `sequence`; None: never seen whole."""
    walls: list[list[float]] = [[] for _ in sequence[1:]]
    cpus: list[list[float]] = [[] for _ in sequence[1:]]
    for start, (wall0, cpu0, tag) in enumerate(marks):
        if tag != sequence[0]:
            continue
        found, position, (wall, cpu) = [], start + 1, (wall0, cpu0)
        for wanted in sequence[1:]:
            while position < len(marks) and marks[position][2] != wanted and marks[position][0] - wall0 < LEG_WINDOW_S:
                position += 1
            if position >= len(marks) or marks[position][0] - wall0 >= LEG_WINDOW_S:
                break
            found.append((marks[position][0] - wall, marks[position][1] - cpu))
            wall, cpu = marks[position][0], marks[position][1]
        if len(found) == len(sequence) - 1:
            for step, (leg_wall, leg_cpu) in enumerate(found):
                walls[step].append(leg_wall)
                cpus[step].append(leg_cpu)
    if not walls[0]:
        return None
    return [(f"{a} -> {b}", statistics.median(w), statistics.median(c))
            for a, b, w, c in zip(sequence[:-1], sequence[1:], walls, cpus, strict=True)]


def table(directory: Path, pids: dict[int, int], leader: int) -> list[str]:
    """The printed lines: one block per sequence and process of its role."""
    lines = ["legs (median per write; wall / CPU of the thread, microseconds):"]
    for name, sequence in SEQUENCES.items():
        for node, pid in sorted(pids.items()):
            role = "leader" if node == leader else "follower"
            if ROLE_OF[name] != role:
                continue
            path = directory / f"{pid}.legs"
            found = legs(read_marks(path), sequence) if path.exists() else None
            lines.append(f"  node {node}, {name}:")
            if found is None:
                lines.append("    (no complete sequence recorded)")
                continue
            for leg, wall, cpu in found:
                lines.append(f"    {leg:28s} {wall * 1e6:7.0f} / {cpu * 1e6:5.0f}")
            lines.append(f"    {'total':28s} {sum(w for _, w, _ in found) * 1e6:7.0f} / "
                         f"{sum(c for _, _, c in found) * 1e6:5.0f}")
    return lines
