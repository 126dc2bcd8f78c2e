"""`log-level none|info|debug`: how much of the cores' logging goes into the output."""

from __future__ import annotations

from tests.datadriven.env import LOG_LEVELS, InteractionEnv
from tests.datadriven.runner import Command, ScriptError


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    level = command.positional[0] if command.positional else ""
    if level not in LOG_LEVELS:
        raise ScriptError(f"line {command.line}: log-level {'|'.join(LOG_LEVELS)}")
    env.log_level = LOG_LEVELS[level]
