"""Goal: the group commands' argument forms, parsed before any call (multiraft/cli/
group_commands.py): Kafka's `--topic T:0,2`, a reset's time as ISO 8601 or @MS, and
the flags' mutual exclusions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from multiraft.cli.group_commands import _topics, _when_ms
from multiraft.cli.main import build_parser


def test_topics_with_and_without_partitions() -> None:
    assert _topics(["a", "b:2,0,2"]) == [{"topic": "a"}, {"topic": "b", "partitions": [0, 2]}]
    with pytest.raises(ValueError, match="partitions are numbers"):
        _topics(["a:x"])


def test_times() -> None:
    assert _when_ms("@1700000000123") == 1_700_000_000_123
    assert _when_ms("2026-01-31T12:00:00Z") == int(datetime(2026, 1, 31, 12, tzinfo=UTC).timestamp() * 1000)
    assert _when_ms("2026-01-31T12:00:00.500+01:00") == int(
        datetime(2026, 1, 31, 11, 0, 0, 500_000, tzinfo=UTC).timestamp() * 1000)
    for bad in ("@soon", "yesterday", "2026-13-01"):
        with pytest.raises(ValueError, match="--to-datetime"):
            _when_ms(bad)


@pytest.mark.parametrize("argv", [
    ["group", "reset-offsets", "g", "--topic", "t"],  # no target
    ["group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"],
    ["group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--dry-run", "--execute"],
    ["group", "reset-offsets", "g", "--to-earliest"],  # no topic
    ["group", "describe"],
])
def test_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2


def test_a_reset_is_a_dry_run_unless_execute() -> None:
    args = build_parser().parse_args(["group", "reset-offsets", "g", "--topic", "t", "--shift-by", "-3"])
    assert (args.shift_by, args.execute) == (-3, False)
