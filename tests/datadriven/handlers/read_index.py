"""`read-index ID ctx`: ask node ID for a linearizable read point tagged `ctx`.

The answer is a `read_states` line in a later Ready of node ID.

    read-index 2 r1
    ----
    ok
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import client_call
from tests.datadriven.runner import Command, ScriptError


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    if len(command.positional) != 2:
        raise ScriptError(f"line {command.line}: read-index ID ctx")
    core = env.core(command.int_at(0))
    context = command.positional[1].encode()
    client_call(env, lambda: core.read_index(context))
