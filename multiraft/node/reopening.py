"""What a partition replica reopened from disk does first (a restart), at scale.

A node restarted with thousands of replicas opens them for many seconds (three
nodes restarting together, each its share of 10,000 partitions). Elections run
during that time do not finish: each node's loop is busy opening, vote rounds take
seconds, every round outlasts the election timeout, and after a full restart at
10,000 partitions 7,600-8,700 were still without a leader after 150 s. So a reopened
replica starts quiet and does nothing until the pass that opened it is over; then,
spread over a moment (`spread_s`), it looks around (`_look_around`):

- a leader its replica knows needs nothing;
- a leader the peers' pings name (a single node restarted; its peers' groups are
  quiet) is told where this log ends (`GroupRuntime.announce_to`): that wakes it,
  and its heartbeats catch this replica up, which stays quiet meanwhile (ticking,
  it would campaign against a leader that is only quiet: 38,617 pre-vote rounds on
  one node restarted at 10,000 partitions);
- with none known, the preferred replica (the catalog's first) campaigns through
  the node's `CampaignPacer`, retried if its peers had not reopened the group yet
  (failover.py), and the others wait for its vote request (any message wakes a
  quiet replica), at most `RESTART_HOLD_TIMEOUTS` election timeouts, unless the
  preferred replica's node is not live: then their timers elect, as before.

A reopened replica replays what it had committed as soon as it starts, held or not
(`GroupRuntime.start`): left for its first wakeup (the look-around), the 10,000
groups of a restarted node all replayed in the seconds after its pass, and their
first Readies came 19-48 s after the start.

Holding is as safe as quiescence: it only withholds ticks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from multiraft.runtime import failover
from raftlog.messages import Role
from raftlog.types import NodeId

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime

# Look-arounds per second after a pass, at most: the pass's reopened groups look
# around spread over len / this seconds, capped by `RESTART_SPREAD_TIMEOUTS_MAX`.
RESTART_CAMPAIGNS_PER_S = 500
RESTART_SPREAD_TIMEOUTS_MAX = 3


class Reopening:
    """The reopened replicas of the current open pass, held until it is over."""

    def __init__(self, node_id: NodeId, registry: GroupRegistry, leader_of: Callable[[int], int],
                 is_live: Callable[[int], bool], pacer: failover.CampaignPacer, election_timeout_s: float,
                 rng: random.Random) -> None:
        self._id = node_id
        self._registry = registry
        self._leader_of = leader_of  # this node's view, or the peers' pings
        self._is_live = is_live
        self._pacer = pacer
        self._election_timeout_s = election_timeout_s
        self._rng = rng
        self._pending: list[tuple[GroupRuntime, NodeId]] = []
        self._in_pass = False

    def reopened(self, runtime: GroupRuntime, preferred: NodeId) -> None:
        """`runtime` was just reopened from disk: quiet until the pass is over (or now,
        if it was opened outside a pass: a group reopened after a storage failure)."""
        runtime.hold_for_first_voter()
        self._pending.append((runtime, preferred))
        if not self._in_pass:
            self.pass_over()

    def pass_begins(self) -> None:
        self._in_pass = True

    def pass_over(self) -> None:
        """The pass is over: each replica it reopened looks around, spread over a moment,
        and the ones still waiting give up waiting after `RESTART_HOLD_TIMEOUTS`."""
        self._in_pass = False
        pending, self._pending = self._pending, []
        if not pending:
            return
        loop = asyncio.get_running_loop()
        spread_s = min(RESTART_SPREAD_TIMEOUTS_MAX * self._election_timeout_s, len(pending) / RESTART_CAMPAIGNS_PER_S)
        hold_s = failover.RESTART_HOLD_TIMEOUTS * self._election_timeout_s
        for runtime, preferred in pending:
            loop.call_later(hold_s, runtime.release_hold)
            loop.call_later(self._rng.uniform(0, spread_s), self._look_around, runtime, preferred)

    def _look_around(self, runtime: GroupRuntime, preferred: NodeId) -> None:
        if self._registry.groups.get(runtime.group_id) is not runtime or runtime.failed:
            return  # closed (or reopened) since
        if runtime.core.leader or runtime.core.role is not Role.FOLLOWER:
            return
        if leader := self._leader_of(runtime.group_id):
            runtime.announce_to(leader)
        elif preferred == self._id:
            failover.campaign_paced(self._pacer, runtime)
        elif not self._is_live(preferred):
            runtime.release_hold()
