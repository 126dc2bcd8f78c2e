"""`status ID`: a node's role and indexes; for a leader, each follower's progress and the ISR.

status 1
----
1: leader term=2 vote=1 leader=1 commit=4 applied=4 last=4 voters=(1,2,3)
  2: match=4 next=5 replicate active
  3: match=4 next=5 replicate active
  isr=(1,2,3)
"""

from __future__ import annotations

from raftlog.messages import Role
from raftlog.types import NodeId
from tests.datadriven import render
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known()
    node_id = command.int_at(0)
    env.print(summary(env, node_id))
    core = env.node(node_id).core
    if core is None or core.role is not Role.LEADER:
        return
    for peer in sorted(core.membership.members | {core.id}):
        progress = core.progress(NodeId(peer))
        if peer == node_id or progress is None:
            continue
        parts = [f"{peer}: match={progress.match} next={progress.next} {progress.state.value}"]
        if progress.is_learner:
            parts.append("learner")
        if len(progress.inflights):
            parts.append(f"inflight={len(progress.inflights)}")
        if progress.is_paused():
            parts.append("paused")
        if progress.recent_active:
            parts.append("active")
        env.print("  " + " ".join(parts))
    if core.lead_transferee:
        env.print(f"  transferring_to={core.lead_transferee}")
    env.print(f"  isr={render.ids(set(core.in_sync_replicas()))}")


def summary(env: InteractionEnv, node_id: int) -> str:
    """One line: role, term, vote, leader, commit, applied, last index, membership."""
    core = env.node(node_id).core
    if core is None:
        return f"{node_id}: down"
    return (
        f"{node_id}: {core.role.value} term={core.term} vote={core.vote} leader={core.leader} "
        f"commit={core.commit_index} applied={core.applied_index} last={core.log.last_index()} "
        f"{render.membership(core.membership)}"
    )
