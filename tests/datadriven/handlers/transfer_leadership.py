"""`transfer-leadership ID [to=N]`: leader ID hands over to N, or to the most caught-up
in-sync voter when no target is named.

    transfer-leadership 1 to=3
    ----
    INFO 1 leadership_transfer_started target=3 term=2
    transferring to 3
"""

from __future__ import annotations

from raftlog.types import NodeId
from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import client_call
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known("to")
    core = env.core(command.int_at(0))
    to = command.options.get("to")
    target = NodeId(int(to)) if to is not None else None
    chosen = client_call(env, lambda: core.transfer_leadership(target))
    if chosen is not None:
        env.print(f"transferring to {chosen}")
