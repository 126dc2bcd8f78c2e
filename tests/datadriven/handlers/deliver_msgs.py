"""`deliver-msgs [ID ...] [drop=ID,...] [type=APPEND,...]`: step queued messages into
their targets.

Without IDs every target with queued messages gets them (targets in id order,
each target's messages in send order). `drop` loses the messages to those
nodes instead; `type` restricts delivery to some message types (others stay
queued). Messages to down or partitioned-off nodes are lost and printed so.

    deliver-msgs 2 drop=3
    ----
    1->2 HEARTBEAT term=2 commit=3
    dropped (drop): 1->3 HEARTBEAT term=2 commit=3
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import node_ids
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known("drop", "type")
    drop = frozenset(command.ids_option("drop") or ())
    types_text = command.options.get("type")
    types = frozenset(types_text.split(",")) if types_text else None
    targets = node_ids(command) or env.pending_targets()
    if drop and command.positional:
        targets = sorted(set(targets) | drop)
    if env.deliver(targets, drop, types) == 0:
        env.print("no messages")
