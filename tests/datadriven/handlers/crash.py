"""`crash ID` and `restart ID`: a power failure and a reboot.

`crash` loses what the node's storage had not synced (`MemoryStorage.crash`),
its core and its in-memory state machine; messages to it are lost while it is
down. `restart` builds a new core over what survived, with `applied` at the
snapshot (the state machine restarts from the snapshot and re-applies); its
first Ready re-delivers the committed entries after that point.

    restart 1
    ----
    DEBUG 1 became_follower term=2 leader=0
    1: follower term=2 vote=1 leader=0 commit=4 applied=0 last=4 voters=()
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
