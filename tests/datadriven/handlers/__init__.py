"""One small module per script command; `HANDLERS` maps command names to them.

Every handler has the same shape, `handle(env, command) -> None`, and prints
through `env.print`. Like etcd's `interaction_env_handler_<cmd>.go`, each module
documents its command by example.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers import (
    add_nodes,
    campaign,
    check,
    compact,
    crash,
    deliver_msgs,
    log_level,
    partition,
    process_ready,
    propose,
    propose_membership,
    raft_log,
    read_index,
    stabilize,
    status,
    tick,
    transfer_leadership,
)
from tests.datadriven.runner import Command, ScriptError

Handler = Callable[[InteractionEnv, Command], None]

HANDLERS: dict[str, Handler] = {
    "add-nodes": add_nodes.handle,
    "campaign": campaign.handle,
    "check": check.handle,
    "compact": compact.handle,
    "crash": crash.handle_crash,
    "damage": crash.handle_damage,
    "restart": crash.handle_restart,
    "deliver-msgs": deliver_msgs.handle,
    "log-level": log_level.handle,
    "partition": partition.handle_partition,
    "heal": partition.handle_heal,
    "process-ready": process_ready.handle,
    "propose": propose.handle,
    "propose-membership": propose_membership.handle,
    "raft-log": raft_log.handle,
    "read-index": read_index.handle,
    "stabilize": stabilize.handle,
    "status": status.handle,
    "tick": tick.handle_tick,
    "tick-election": tick.handle_election,
    "tick-heartbeat": tick.handle_heartbeat,
    "transfer-leadership": transfer_leadership.handle,
}


def execute(env: InteractionEnv, command: Command) -> list[str]:
    """Run one command against `env` and return what it printed."""
    handler = HANDLERS.get(command.name)
    if handler is None:
        raise ScriptError(f"line {command.line}: unknown command {command.name!r}")
    handler(env, command)
    return env.take_output()
