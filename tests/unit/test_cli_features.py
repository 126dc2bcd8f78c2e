"""`raftlog cluster features [finalize [--level N]]` (multiraft/cli/feature_commands.py): the
client options (`--server`, `--ca`, `--token-file`) reach the command whether they come
before `finalize` or after it (a finalize cannot be undone: one sent to the default server
instead of the one named would finalize the wrong cluster), and absent, they are absent."""

from __future__ import annotations

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
