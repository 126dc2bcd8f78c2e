"""The Raft core stays sans-I/O: no clocks, sockets, files, threads or global randomness.

Goal: walk the AST of every module under `raftlog/core` (and the modules it
imports from `raftlog/`) and fail on any forbidden import or a call to the
module-level `random` functions. Time must enter as ticks, randomness as an
injected `random.Random`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_FILES = sorted((ROOT / "raftlog" / "core").glob("*.py")) + [
    ROOT / "raftlog" / name for name in ("messages.py", "errors.py", "storage.py", "types.py", "bootstrap.py")
]
FORBIDDEN = {
    "asyncio", "socket", "time", "threading", "os", "selectors", "subprocess", "multiprocessing",
    "datetime", "io", "pathlib", "shutil", "tempfile", "signal", "concurrent", "storage", "multiraft",
}


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [name for name in imported_modules(tree) if name.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path.name} imports {bad}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            raise AssertionError(f"{path.name} imports names from random; inject random.Random")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "random"
            and node.func.attr != "Random"
        ):
            raise AssertionError(f"{path.name} calls random.{node.func.attr}; use the injected rng")


def test_the_walker_catches_a_violation() -> None:
    # Goal: the check above can fail (a test that cannot fail is a defect).
    tree = ast.parse("import time\nfrom asyncio import sleep\n")
    assert [n for n in imported_modules(tree) if n.split(".")[0] in FORBIDDEN] == ["time", "asyncio"]
