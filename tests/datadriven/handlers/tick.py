"""`tick ID N`, `tick-election ID`, `tick-heartbeat ID`: move a node's logical clock.

`tick-election` ticks the configured election timeout (the base, not the
randomized one: a leader's CheckQuorum round and lease use the base), and
`tick-heartbeat` one heartbeat interval.

    tick-heartbeat 1
    ----
    ok
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command


def handle_tick(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    _tick(env, command.int_at(0), command.int_at(1))


def handle_election(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    _tick(env, node_id, env.core(node_id).config.election_timeout_ticks)


def handle_heartbeat(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    _tick(env, node_id, env.core(node_id).config.heartbeat_interval_ticks)


def _tick(env: InteractionEnv, node_id: int, count: int) -> None:
    core = env.core(node_id)
    for _ in range(count):
        core.tick()
