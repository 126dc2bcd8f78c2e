"""`propose-membership ID add-voter|add-learner|remove N`: a single-server change.

propose-membership 1 add-learner 4
----
proposed 2/5 add_learner 4
"""

from __future__ import annotations

from raftlog.messages import ConfChange, ConfChangeOp
from raftlog.types import NodeId
from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import client_call
from tests.datadriven.runner import Command, ScriptError

OPS = {
    "add-voter": ConfChangeOp.ADD_VOTER,
    "add-learner": ConfChangeOp.ADD_LEARNER,
    "remove": ConfChangeOp.REMOVE,
}


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    if len(command.positional) != 3 or command.positional[1] not in OPS:
        raise ScriptError(f"line {command.line}: propose-membership ID {'|'.join(OPS)} N")
    core = env.core(command.int_at(0))
    change = ConfChange(OPS[command.positional[1]], NodeId(command.int_at(2)))
    result = client_call(env, lambda: core.propose_membership(change))
    if result is not None:
        term, index = result
        env.print(f"proposed {term}/{index} {change.op.name.lower()} {change.node_id}")
