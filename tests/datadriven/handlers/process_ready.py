"""`process-ready ID ...`: handle one Ready of each node, printing it.

The driver's order (`ready.py`): queue `messages`, persist snapshot, entries
and hard state (sync when `must_sync`), queue `persisted_messages`, apply
`committed_entries`, `advance`.

    process-ready 1
    ----
    Ready must_sync=true:
      hard_state: term=2 vote=1 commit=3
      messages:
        1->2 VOTE term=2 log_term=1 index=3
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import node_ids
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    ids = node_ids(command)
    if len(ids) == 1:
        env.process_ready(ids[0])
        return
    for node_id in ids:
        env.print(f"> {node_id} handling Ready")
        with env.indented():
            env.process_ready(node_id)
