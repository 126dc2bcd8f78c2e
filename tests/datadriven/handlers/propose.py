"""`propose ID payload`: a client appends one DATA entry through node ID.

Prints the entry's `term/index`, or the refusal (NOT_LEADER with a hint,
LEADERSHIP_TRANSFER_IN_PROGRESS, PROPOSAL_DROPPED).

    propose 1 x
    ----
    proposed 2/5
"""

from __future__ import annotations

from tests.datadriven.env import InteractionEnv
from tests.datadriven.handlers._common import client_call
from tests.datadriven.runner import Command, ScriptError


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    if len(command.positional) != 2:
        raise ScriptError(f"line {command.line}: propose ID payload")
    core = env.core(command.int_at(0))
    payload = command.positional[1].encode()
    result = client_call(env, lambda: core.propose([payload]))
    if result is not None:
        term, index = result
        env.print(f"proposed {term}/{index}")
