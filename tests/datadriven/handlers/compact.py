"""`compact ID index`: discard the log through `index`, keeping a snapshot there.

As the simulator's compaction fault does: `storage.compact(index)`, then
`set_snapshot` with the state machine's data and membership at that point, so a
leader can still bring a follower that is further behind up to date.

    compact 1 5
    ----
    snapshot: index=5 term=2 voters=(1,2,3)
"""

from __future__ import annotations

from tests.datadriven import render
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    env.compact(node_id, command.int_at(1))
    env.print(f"snapshot: {render.snapshot(env.node(node_id).storage.snapshot())}")
