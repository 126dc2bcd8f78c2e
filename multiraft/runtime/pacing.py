"""When a group's ticks reach its core: pure rules shared by the runtime and the simulator.

A node's ticker offers every awake group a tick 20 times a second. Three rules keep
an overloaded node from turning that into an election storm (docs/scale.md, issue 26):

- No wakeup for nothing (`tick_due`): a tick that can fire no timer only counts; the
  group's task wakes when one of its held ticks would fire one (a follower's election
  timeout, a leader's heartbeat or CheckQuorum), or for any other input. A woken task
  applies the held ticks first, in order, before the inputs that came after them.
- Messages before timers (`split_ticks`): the ticks that may fire a timer run after
  the inbox, so a late task reads the heartbeat or the vote it was waiting for before
  its election timer or its CheckQuorum can run out with the answer already queued.
- No burst (`PENDING_TICKS_MAX`): a task that fell behind fires at most this many
  timer-capable ticks at once; the others are dropped, as the ticker drops the ticks
  it could not run on time. A burst of timers is what a late loop must not do: it
  times out elections and leaderships whose messages are only queued behind it.
  (etcd buffers 128 ticks on its tick channel, for one group per process; with
  thousands of groups on one loop, lateness is the common case, not the exception.)

And one rule for a leader's CheckQuorum (`credit_live_members`): a member whose node
is live counts as active (`RaftCore.note_active`, where the safety argument is).
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.core.raft import RaftCore
from raftlog.messages import Role
from raftlog.types import NodeId

PENDING_TICKS_MAX = 2
_CAMPAIGNING = frozenset({Role.PRE_CANDIDATE, Role.CANDIDATE})


def tick_due(core: RaftCore, pending: int) -> bool:
    """Would applying `pending` held ticks fire one of the core's timers?"""
    return pending > core.ticks_before_timer()


def split_ticks(core: RaftCore, pending: int) -> tuple[int, int]:
    """(ticks to apply before the inbox, ticks to apply after it) out of `pending`: the
    first fire no timer; of the rest at most PENDING_TICKS_MAX are kept."""
    assert pending >= 0
    quiet = min(pending, core.ticks_before_timer())
    return quiet, min(pending - quiet, PENDING_TICKS_MAX)


def credit_live_members(core: RaftCore, is_live: Callable[[int], bool]) -> None:
    """A leader counts every member whose node is live as active for CheckQuorum."""
    if core.role is not Role.LEADER:
        return
    for member in sorted(core.membership.members - {core.id}):
        if is_live(member):
            core.note_active(NodeId(member))


def run_ticks(core: RaftCore, ticks: int, is_live: Callable[[int], bool]) -> int:
    """Apply `ticks` ticks (a leader first credits its live members); returns how many
    of them ran a campaigning replica's election timer out (see GroupRuntime.tick)."""
    if not ticks:
        return 0
    credit_live_members(core, is_live)
    timeouts = 0
    for _ in range(ticks):
        elapsed = core.election_elapsed
        core.tick()
        if core.election_elapsed <= elapsed and core.role in _CAMPAIGNING:
            timeouts += 1
    return timeouts


# A replica's clock slows to 1/8 at most after failed campaigns (`campaign_backoff_skips`).
CAMPAIGN_BACKOFF_SHIFT_MAX = 3


def campaign_backoff_skips(campaigns_without_leader: int, ticks_offered: int) -> bool:
    """Is this tick (the `ticks_offered`-th) withheld? Campaigns that found no leader back
    off: after each one past the first, the replica's clock runs at half the speed, down
    to an eighth, until some leader is known. When a busy node's messages take longer
    than an election timeout, every campaign times out before its votes arrive and starts
    another, whose messages slow the node further; without backing off, such an election
    storm never ends (a thousand new partitions on a slow box did just that).
    Withholding ticks is as safe as quiescence: ticks only drive liveness."""
    failed = campaigns_without_leader - 1
    if failed <= 0:
        return False
    return bool(ticks_offered % (1 << min(failed, CAMPAIGN_BACKOFF_SHIFT_MAX)))
