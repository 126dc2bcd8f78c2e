"""`crash ID`, `restart ID` and `damage ID N`: a power failure, a reboot, a damaged log.

`crash` loses what the node's storage had not synced (`MemoryStorage.crash`),
its core and its in-memory state machine; messages to it are lost while it is
down. `restart` builds a new core over what survived, with `applied` at the
snapshot (the state machine restarts from the snapshot and re-applies); its
first Ready re-delivers the committed entries after that point.

    restart 1
    ----
    DEBUG 1 became_follower term=2 leader=0
    1: follower term=2 vote=1 leader=0 commit=4 applied=0 last=4 voters=()

`damage ID N` stops a node and restarts it as recovery leaves a log it found
damaged: its last N durable entries cut away, its commit index clamped to what
is left, and marked for repair (`MemoryStorage.lose_tail`), so the new core
neither votes nor leads and asks for the rest.

    damage 3 3
    ----
    DEBUG 3 became_follower term=2 leader=0
    3: follower term=2 vote=1 leader=0 commit=4 applied=0 last=4 voters=() repair
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers.status import summary
from tests.datadriven.runner import Command, ScriptError


def handle_crash(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    env.crash(command.int_at(0))


def handle_restart(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    node = env.node(node_id)
    if node.up:
        raise ScriptError(f"node {node_id} is up")
    env.start(node)
    env.print(summary(env, node_id))


def handle_damage(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id, count = command.int_at(0), command.int_at(1)
    node = env.node(node_id)
    if node.up:
        env.crash(node_id)
    node.storage.lose_tail(count)
    env.start(node)
    env.print(summary(env, node_id) + " repair")
