"""`raftlog cluster features [finalize [--level N]]` (multiraft/cli/feature_commands.py): the
client options (`--server`, `--ca`, `--token-file`) reach the command whether they come
before `finalize` or after it (a finalize cannot be undone: one sent to the default server
instead of the one named would finalize the wrong cluster), and absent, they are absent; the
listing says a decommissioned node is that (not asked), a silent one "no answer"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multiraft.cli.feature_commands import features_finalize, features_show
from multiraft.cli.main import build_parser

OPTIONS = ["--server", "10.0.0.7:8080", "--ca", "ca.pem", "--token-file", "token"]


@pytest.mark.parametrize(("argv", "func", "level"), [
    (["features", *OPTIONS, "finalize"], features_finalize, None),
    (["features", "finalize", *OPTIONS], features_finalize, None),
    (["features", *OPTIONS[:2], "finalize", *OPTIONS[2:], "--level", "2"], features_finalize, 2),
    (["features", *OPTIONS], features_show, None),
])
def test_the_client_options_reach_the_command_before_or_after_finalize(argv: list[str], func: object,
                                                                         level: int | None) -> None:
    args = build_parser().parse_args(["cluster", *argv])
    assert (args.server, args.ca, args.token_file) == ("10.0.0.7:8080", Path("ca.pem"), Path("token"))
    assert args.func is func and args.client and getattr(args, "level", None) == level


@pytest.mark.parametrize("argv", [["features"], ["features", "finalize"]])
def test_absent_client_options_are_none(argv: list[str]) -> None:
    args = build_parser().parse_args(["cluster", *argv])
    assert (args.server, args.ca, args.token_file) == (None, None, None)


def _node(node_id: int, supported: int | None, *, decommissioned: bool = False, error: str = "") -> dict[str, object]:
    return {"node_id": node_id, "status": "alive", "answered": supported is not None, "supported": supported,
            "finalized": 1 if supported is not None else None, "decommissioned": decommissioned, "error": error}


def test_the_listing_names_a_decommissioned_node_so_and_a_silent_one_unanswered(
        capsys: pytest.CaptureFixture[str]) -> None:
    report = {"finalized": 1, "supported_here": 1, "highest_common": None, "not_answered": [3], "levels": [],
              "nodes": [_node(1, 1), _node(2, None, decommissioned=True), _node(3, None, error="node 3 is silent")]}
    features_show(_Client(report), None)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["NODE", "STATUS", "SUPPORTS", "SEES", "NOTE"]
    assert [re.split(r"\s{2,}", line) for line in lines[1:4]] == [
        ["1", "alive", "1", "1"],
        ["2", "alive", "decommissioned", "-", "not asked"],
        ["3", "alive", "no answer", "-", "node 3 is silent"]]


class _Client:
    def __init__(self, report: dict[str, object]) -> None:
        self.report = report

    def features(self) -> dict[str, object]:
        return self.report
