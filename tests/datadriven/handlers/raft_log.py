"""`raft-log ID`: the node's log (snapshot point, then each entry; unstable ones marked).

raft-log 1
----
1/1 CONFIG add_voter 1
1/2 CONFIG add_voter 2
"""

from __future__ import annotations

from raftlog.types import Index
from tests.datadriven import render
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    core = env.core(node_id)
    log = core.log
    first, last = log.first_index(), log.last_index()
    if first > 1:
        env.print(f"snapshot: {render.snapshot(env.node(node_id).storage.snapshot())}")
    if last < first:
        env.print("no entries")
        return
    stable_last = log.stable_last_index()
    for entry in log.slice(first, Index(last + 1), 1 << 62):
        suffix = " (unstable)" if entry.index > stable_last else ""
        env.print(render.entry(entry) + suffix)
