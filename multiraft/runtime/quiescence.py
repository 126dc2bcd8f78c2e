"""Quiescence: idle, fully replicated groups stop ticking, so a node can host thousands.

A ticking group costs a heartbeat per follower per interval even when nothing
happens. A leader whose group has been idle for a while (every member holds the
whole log, everything is committed and applied, no read or transfer pending)
tells its followers to go quiet and stops ticking itself; they stop ticking too.
A quiet group wakes on any message, proposal or read, and a quiet follower wakes
when the leader's *node* stops answering (node-level pings), so a dead leader is
still replaced; a quiet leader wakes when too few of its voters' nodes answer to make
a quorum, so CheckQuorum steps a cut-off leader down.

A leader may go quiet past members whose nodes are down (CockroachDB quiesces a
range past followers on non-live nodes, and wakes it when one is live again): the
others hold the whole log, and the live voters with it make a quorum. Otherwise a
node that lost a peer keeps every group it shares with that peer ticking, sending
heartbeats nobody answers: at 10,000 partitions on three nodes, that load slowed
the elections after a kill to a minute (docs/scale.md). The node wakes such a
leader when an absent member's node is heard again (to catch it up) and when an
absent member would leave the ISR (its time passes while quiet:
`RaftCore.pass_quiet_time`). A replica in repair (its damaged log was cut at restart) never goes
quiet: its clock is what makes it tell a quiet leader, which still credits it with
the whole log, that it came back short. Quiescence only withholds ticks, and ticks only drive liveness:
the simulator's tick-freeze fault (`FaultMix.quiesce`) checks safety is untouched.

The decision is a pure function over a narrow view of the core, and says why it
refuses, as CockroachDB's `shouldReplicaQuiesce` does.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.core.quorum import has_quorum
from raftlog.core.raft import RaftCore
from raftlog.messages import RESPONSE_TYPES, Message, MessageType, Role
from raftlog.types import NodeId


def absent_members(core: RaftCore, is_live: Callable[[int], bool]) -> frozenset[NodeId]:
    """The members other than this replica whose nodes are not live."""
    return frozenset(n for n in core.membership.members if n != core.id and not is_live(n))


def quiesce_refusal(core: RaftCore, absent: frozenset[NodeId] = frozenset()) -> str | None:
    """None if this leader may quiesce its group now, else the reason it may not.
    Members in `absent` (their nodes are down) may lack entries, as long as the
    voters left make a quorum."""
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
    if absent and not has_quorum(core.membership.voters, core.membership.voters - absent):
        return "no_live_quorum"
    for node in sorted(core.membership.members):
        if node == core.id or node in absent:
            continue
        progress = core.progress(node)
        if progress is None or progress.match != last:
            return f"follower_{node}_behind"
    return None


def ticks_until_isr_drops(core: RaftCore, absent: frozenset[NodeId]) -> int | None:
    """Ticks until the first `absent` member still in this leader's ISR leaves it (the
    tick its lag passes the lag time), or None if none is in the ISR."""
    lag_ticks_max = core.config.replica_lag_time_max_ticks
    in_sync = core.in_sync_replicas() & absent
    if not in_sync:
        return None
    lags = core.follower_lag_ticks()
    return max(1, min(lag_ticks_max - lags.get(node, 0) + 1 for node in in_sync))


# A held replica (a new group's other voter, a survivor waiting for a dead leader's
# successor, a reopened replica waiting for the preferred one: `GroupRuntime.hold_for_first_voter`)
# answers these and stays held: the campaign it waits for is the one asking, and a
# replica that started ticking here would time out and campaign against it whenever
# the candidate's next round is slower than an election timeout (a loaded node, a full
# restart at 10,000 partitions: 18,000 split candidate rounds a node). The winner's
# first append or heartbeat wakes it; the hold's timer, if no winner comes.
VOTE_REQUESTS = frozenset({MessageType.PRE_VOTE, MessageType.VOTE})


def stays_held(core: RaftCore, message: Message) -> bool:
    """Does a held replica answer `message` and stay held? Only a vote request of a
    candidate whose log is at least as up to date as its own: the campaign it waits for.
    A candidate behind it (its log lost unsynced entries in a power failure, say) cannot
    win its vote, so waiting on would leave the group leaderless for the whole hold (up
    to 60 election timeouts after a restart: 20-30 s in chaos runs); it ticks instead,
    and the replicas with the longer log elect one of themselves."""
    return message.type in VOTE_REQUESTS and core.log.is_up_to_date(message.index, message.log_term)


def woken_by(core: RaftCore, message: Message, idle_ticks: int) -> tuple[int, int]:
    """A quiet replica wakes for `message`: its idle count from now on, and the leader to
    tell it woke (0: none).

    A quiet leader woken by anything but an answer counts its idle time anew: someone
    did not hear it for an election timeout. A quiet follower woken by anyone but its
    leader (a restarted replica's vote request, say) starts ticking while its leader,
    still quiet, sends nothing: it would time out and campaign against a working
    leader. So it tells the leader it woke (`RaftCore.announce`), which wakes it: the
    leader heartbeats, or goes quiet again and tells its followers so (CockroachDB's
    follower "unquiesce and wake leader")."""
    if message.type not in RESPONSE_TYPES:
        idle_ticks = 0
    leader = core.leader
    tell = leader if core.role is Role.FOLLOWER and leader and message.source != leader else 0
    return idle_ticks, tell


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
