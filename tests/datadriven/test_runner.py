"""The script format itself: parsing, rewriting and mismatch reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven.runner import Command, ScriptError, parse_script, render_script, run_script

SCRIPT = "# goal\necho a b\n----\na b\n\n# more\necho\n----\nok\n"


def _echo(command: Command) -> list[str]:
    return [" ".join(command.positional)] if command.positional else []


def test_render_round_trips_a_passing_script() -> None:
    items = parse_script(SCRIPT)
    for item in items:
        if not isinstance(item, str):
            item.actual = list(item.expected)
    assert render_script(items) == SCRIPT


def test_options_are_split_from_positional_arguments() -> None:
    command = Command.parse("add-nodes 3 voters=1,2,3 pre-vote=false", 1)
    assert command.positional == ("3",)
    assert command.ids_option("voters") == [1, 2, 3]
    assert command.bool_option("pre-vote", True) is False
    with pytest.raises(ScriptError):
        command.check_known("voters")


def test_mismatch_is_reported_and_rewrite_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.txt"
    path.write_text(SCRIPT.replace("a b\n\n", "wrong\n\n"))
    monkeypatch.delenv("REWRITE", raising=False)
    with pytest.raises(AssertionError, match="expected:\n  wrong"):
        run_script(path, _echo)
    monkeypatch.setenv("REWRITE", "1")
    run_script(path, _echo)
    assert path.read_text() == SCRIPT


def test_a_command_without_separator_is_rejected() -> None:
    with pytest.raises(ScriptError):
        parse_script("echo\nok\n")
