"""`partition A,B C ...` and `heal`: cut the network into groups, or restore it.

Each argument is one group of comma-separated ids; unlisted nodes form one more
group together. Messages between groups are lost at delivery time (a partition
also loses what was in flight across it). `partition 1` isolates node 1.

    partition 1
    ----
    ok
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command, ScriptError


def handle_partition(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    if not command.positional:
        raise ScriptError(f"line {command.line}: partition wants at least one group")
    groups = [[int(part) for part in arg.split(",")] for arg in command.positional]
    env.partition(groups)


def handle_heal(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    env.heal()
