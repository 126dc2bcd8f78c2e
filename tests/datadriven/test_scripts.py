"""Run every interaction script in `testdata/` (one test id per file).

`REWRITE=1 pytest tests/datadriven` regenerates the expected outputs in place;
read the diff before committing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers import execute
from tests.datadriven.runner import run_script

TESTDATA = Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script(path: Path) -> None:
    env = InteractionEnv(seed=0)
    run_script(path, lambda command: execute(env, command))


def test_every_script_states_its_goal() -> None:
    assert SCRIPTS, "no scripts found"
    for path in SCRIPTS:
        assert path.read_text().startswith("#"), (
            f"{path.name} must open with a # comment stating its goal"
        )
