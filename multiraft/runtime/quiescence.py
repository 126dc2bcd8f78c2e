"""Quiescence: idle, fully replicated groups stop ticking, so a node can host thousands.

A ticking group costs a heartbeat per follower per interval even when nothing
happens. A leader whose group has been idle for a while (every member holds the
whole log, everything is committed and applied, no read or transfer pending)
tells its followers to go quiet and stops ticking itself; they stop ticking too.
A quiet group wakes on any message, proposal or read, and a quiet follower wakes
when the leader's *node* stops answering (node-level pings), so a dead leader is
still replaced. A replica in repair (its damaged log was cut at restart) never goes
quiet: its clock is what makes it tell a quiet leader, which still credits it with
the whole log, that it came back short. Quiescence only withholds ticks, and ticks only drive liveness:
the simulator's tick-freeze fault (`FaultMix.quiesce`) checks safety is untouched.

The decision is a pure function over a narrow view of the core, and says why it
refuses, as CockroachDB's `shouldReplicaQuiesce` does.
"""

from __future__ import annotations

from raftlog.core.raft import RaftCore
from raftlog.messages import Role


def quiesce_refusal(core: RaftCore) -> str | None:
    """None if this leader may quiesce its group now, else the reason it may not."""
    if core.role is not Role.LEADER:
        return "not_leader"
    last = core.log.last_index()
    if core.commit_index != last:
        return "uncommitted_entries"
    if core.applied_index != core.commit_index:
        return "unapplied_entries"
    if core.lead_transferee:
        return "leadership_transfer"
    if core.pending_read_count:
        return "pending_reads"
    if core.log.unstable:
        return "unstable_entries"
    for node in sorted(core.membership.members):
        if node == core.id:
            continue
        progress = core.progress(node)
        if progress is None or progress.match != last:
            return f"follower_{node}_behind"
    return None


def follower_may_quiesce(core: RaftCore, leader: int, term: int, index: int) -> bool:
    """A follower obeys a quiesce request only if it agrees on leader, term and log end,
    and is not in repair: a replica whose log was cut at damage must keep ticking, as
    only its clock makes it tell a quiet leader what it lost (`RaftCore._ask_for_repair`)."""
    return (
        core.role is Role.FOLLOWER
        and not core.needs_repair
        and core.leader == leader
        and core.term == term
        and core.log.last_index() == index
        and core.commit_index == index
    )
