"""No project module grows past 500 lines (STYLE.md section 8, issue 22).

Goal: count the lines of every module in the project's packages (the same ones
tests/unit/test_layers.py reads; tests are not counted) and fail on any over
`LINES_MAX`, except the one that is long by design: the Raft core, whose every
transition lives in one file (STYLE.md section 1). The simulator lives in tests/sim/.

`OVER_LIMIT` holds today's other offenders, each with its line count when it was
listed: an entry may shrink but not grow, and one that is back under the limit
(or gone) fails as stale until its line is removed, so the list only shrinks.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("multiraft", "raftlog", "storage", "chaos", "spark_connector", "pyspark_raftlog", "bench")
LINES_MAX = 500
# Long by design: the file (or, ending in "/", the package) is never counted.
EXEMPT = ("raftlog/core/raft.py",)
# Modules allowed over the limit, path -> its line count when listed: none since issue
# 22's splits; an entry here may only shrink.
OVER_LIMIT: dict[str, int] = {}


def line_counts(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """Lines per module (path relative to `root`, with "/"), exempt ones left out."""
    counts = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative == item or (item.endswith("/") and relative.startswith(item)) for item in EXEMPT):
                continue
            counts[relative] = len(path.read_text().splitlines())
    return counts


def size_problems(counts: dict[str, int], over_limit: dict[str, int]) -> list[str]:
    """Modules over the limit and not listed, listed ones that grew, and stale entries."""
    problems = []
    for path, lines in sorted(counts.items()):
        if lines <= LINES_MAX:
            continue
        listed = over_limit.get(path)
        if listed is None:
            problems.append(f"{path}: {lines} lines, over {LINES_MAX} (split it by concern)")
        elif lines > listed:
            problems.append(f"{path}: {lines} lines, grew past its listed {listed}")
    for path in sorted(over_limit):
        if counts.get(path, 0) <= LINES_MAX:
            problems.append(f"{path}: no longer over {LINES_MAX}: remove it from OVER_LIMIT")
    return problems


def test_no_module_over_the_limit() -> None:
    # Goal: every counted module is at most LINES_MAX lines, but for the listed debts.
    assert size_problems(line_counts(ROOT), OVER_LIMIT) == []


def test_the_size_check_catches_long_modules(tmp_path: Path) -> None:
    # Goal: the check can fail. Plant modules in a tree of their own: one just over the
    # limit, one at it, a listed one that grew, a stale entry, and the exempt files.
    listed = {"multiraft/runtime/group.py": 908, "multiraft/node/node.py": 659}
    files = {
        "storage/long.py": LINES_MAX + 1,
        "storage/at_limit.py": LINES_MAX,
        "multiraft/runtime/group.py": 910,
        "multiraft/node/node.py": 120,
        "raftlog/core/raft.py": 2000,
    }
    for relative, lines in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x = 1\n" * lines)
    counts = line_counts(tmp_path)
    assert counts["storage/long.py"] == LINES_MAX + 1
    assert "raftlog/core/raft.py" not in counts
    assert size_problems(counts, listed) == [
        "multiraft/runtime/group.py: 910 lines, grew past its listed 908",
        f"storage/long.py: {LINES_MAX + 1} lines, over {LINES_MAX} (split it by concern)",
        f"multiraft/node/node.py: no longer over {LINES_MAX}: remove it from OVER_LIMIT",
    ]
