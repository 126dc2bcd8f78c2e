"""`campaign ID`: tick a non-leader until its election timer fires.

The core has no "campaign now" input on purpose (an election starts only when
time says so, or on TimeoutNow), so this ticks until the timer fires (the core
resets `election_elapsed` when it starts a round). The randomized timeout comes
from the node's seeded RNG, so the number of ticks is the same on every run.
With PreVote on, the node becomes a pre-candidate first; a (pre-)candidate
whose round stalled starts a new one.

    campaign 1
    ----
    DEBUG 1 became_pre_candidate term=1
"""

from __future__ import annotations

from raftlog.messages import Role
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command, ScriptError


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    core = env.core(node_id)
    if core.role is Role.LEADER:
        raise ScriptError(f"node {node_id} is the leader; a leader does not campaign")
    for _ in range(4 * core.config.election_timeout_ticks):
        core.tick()
        if core.election_elapsed == 0:
            return
    raise ScriptError(f"node {node_id} did not campaign (is it a voter?)")
