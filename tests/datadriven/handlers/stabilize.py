"""`stabilize [ID ...]`: handle Readies and deliver messages until nothing moves.

Each round handles every node's Ready (ids in order), then delivers every queued
message (targets in order). No ticks happen, so it ends once the cluster is
quiescent; a bound turns a message storm into a failure instead of a hang.
With IDs only those nodes take part; messages to others stay queued.
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import node_ids
from tests.datadriven.runner import Command, ScriptError

ROUNDS_MAX = 100


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    scope = node_ids(command) or None
    for _ in range(ROUNDS_MAX):
        progressed = False
        for node_id in env.up_ids(scope):
            core = env.core(node_id)
            if core.has_ready():
                env.print(f"> {node_id} handling Ready")
                with env.indented():
                    env.process_ready(node_id)
                progressed = True
        for target in env.pending_targets(scope):
            env.print(f"> {target} receiving messages")
            with env.indented():
                env.deliver([target])
            progressed = True
        if not progressed:
            return
    raise ScriptError(f"line {command.line}: no quiescence within {ROUNDS_MAX} rounds")
