"""Goal: a LocalCluster told to run another checkout (bench/interleaved.py compares
two) starts its nodes on that checkout's code, not on the launcher's own: the
checkout comes first on the children's import path. Without it both sides of an
A/B would run the same code and every ratio would read 1.0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from multiraft.cli.launcher import _child_env

HERE = Path(__file__).resolve().parents[2]


def test_children_import_the_named_checkout_first(tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "multiraft").mkdir(parents=True)
    (other / "multiraft" / "__init__.py").write_text("WHICH = 'other checkout'\n")
    found = []
    for root in (None, other):
        env = _child_env({"PYTHONPATH": "/somewhere/else"}, root)
        answer = subprocess.run(
            [sys.executable, "-c", "import multiraft; print(getattr(multiraft, 'WHICH', multiraft.__file__))"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
        )
        found.append(answer.stdout.strip())
        assert env["PYTHONPATH"].split(":")[-1] == "/somewhere/else", "the caller's path is kept, after it"
    assert found[0] == str(HERE / "multiraft" / "__init__.py")
    assert found[1] == "other checkout"
