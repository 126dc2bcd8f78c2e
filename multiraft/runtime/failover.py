"""Failover without waiting out an election timeout, when a leader's process is gone.

A kill -9 closes the dead node's sockets, so its peers' redials are refused at once;
a live node never refuses a connection. The node then tells every group that node
led (`GroupRuntime.leader_gone`), and each follower here stops honouring the dead
leader's lease. Only the lowest-numbered voter left that this node hears campaigns
at once: two campaigning together would split the vote and both wait out a timeout.
If the others have not learned of the death yet they ignore its round (the lease),
so it asks again a few times, a little later (`LEADER_GONE_RETRY_S`); if it is still
not heard, the timers elect someone as before.

Paced (`CampaignPacer`): a node that lost a peer leading thousands of groups must
not start thousands of elections at once. At 10,000 partitions, 3,333 campaigns
started together made every vote round longer than the election timeout on the two
loaded loops: rounds timed out and started again, the other survivor's timers
fired into them, and the last partition was led a minute after the kill. So the
successor runs a bounded number of campaigns at a time, the next as each ends
(a leader is known) or times out, and holds the others quiet meanwhile; the other
survivors hold their replicas of those groups too (`OTHERS_HOLD_TIMEOUTS`
election timeouts at most), so that their timers do not campaign against it: the
successor's vote request wakes each one when its turn comes. Holding is as safe
as quiescence: it only withholds ticks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any

from raftlog.core.raft import RaftCore
from raftlog.messages import Role
from raftlog.types import NO_NODE, NodeId

# After a leader's node is gone its successor asks again this often, this many times,
# in case the others learned of it after its first round.
LEADER_GONE_RETRY_S = 0.05
LEADER_GONE_RETRIES = 4
# Successor campaigns in flight on one node; each needs a pre-vote and a vote round
# trip and a synced vote on both sides, and a round must end well inside an election
# timeout on a loaded loop.
CAMPAIGNS_IN_FLIGHT_MAX = 128
# A campaign's slot is freed after this many election timeouts even if no leader is
# known by then (its timers take over, backing off).
SLOT_TIMEOUTS = 4
# How long the other survivors hold a dead leader's groups for the successor, at most.
OTHERS_HOLD_TIMEOUTS = 20


class Succession(Enum):
    NONE = "none"  # not a follower of the dead leader: nothing to do
    SUCCESSOR = "successor"  # this replica campaigns
    OTHER = "other"  # another live voter campaigns: wait for it


def forget_dead_leader(core: RaftCore, leader: int, is_live: Callable[[int], bool]) -> Succession:
    """`leader`'s node is gone: forget it, and say whether this replica is its successor
    (the lowest-numbered voter left that this node hears)."""
    if core.role is not Role.FOLLOWER or core.leader != leader:
        return Succession.NONE
    core.forget_leader(NodeId(leader))
    left = [v for v in core.membership.voters if v != leader and (v == core.id or is_live(v))]
    if not left:
        return Succession.NONE
    return Succession.SUCCESSOR if min(left) == core.id else Succession.OTHER


class CampaignPacer:
    """At most `in_flight_max` campaigns at once on a node; the rest wait in order. A
    slot is held from `start` until `done` (a leader is known, or the group closed) or
    `slot_timeout_s`, whichever comes first; a group asked with `attempts` > 1 goes
    back to the end of the line when its slot times out, that many times in all (its
    `start` decides whether to campaign again)."""

    def __init__(self, in_flight_max: int = CAMPAIGNS_IN_FLIGHT_MAX, slot_timeout_s: float = 2.0,
                 others_hold_s: float = 10.0) -> None:
        assert in_flight_max >= 1 and slot_timeout_s > 0 and others_hold_s >= 0
        self.in_flight_max = in_flight_max
        self.slot_timeout_s = slot_timeout_s
        self.others_hold_s = others_hold_s  # how long a non-successor holds (see the module docstring)
        self._waiting: deque[tuple[int, Callable[[], None], int]] = deque()  # group, start, attempts
        self._waiting_ids: set[int] = set()
        self._in_flight: dict[int, tuple[asyncio.TimerHandle, Callable[[], None], int]] = {}
        self.campaigns_started = 0
        self.slots_timed_out = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(self, group_id: int, start: Callable[[], None], attempts: int = 1) -> None:
        """Call `start` once a slot is free (now, if one is). A group asks once per
        succession; asking again while waiting or in flight changes nothing."""
        assert attempts >= 1
        if group_id in self._in_flight or group_id in self._waiting_ids:
            return
        self._waiting.append((group_id, start, attempts))
        self._waiting_ids.add(group_id)
        self._start_some()

    def done(self, group_id: int) -> None:
        slot = self._in_flight.pop(group_id, None)
        if slot is not None:
            slot[0].cancel()
            self._start_some()

    def _timed_out(self, group_id: int) -> None:
        slot = self._in_flight.pop(group_id, None)
        if slot is not None:
            self.slots_timed_out += 1
            _, start, attempts = slot
            if attempts > 1:
                self._waiting.append((group_id, start, attempts - 1))
                self._waiting_ids.add(group_id)
            self._start_some()

    def _start_some(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and len(self._in_flight) < self.in_flight_max:
            group_id, start, attempts = self._waiting.popleft()
            self._waiting_ids.discard(group_id)
            timer = loop.call_later(self.slot_timeout_s, self._timed_out, group_id)
            self._in_flight[group_id] = (timer, start, attempts)
            self.campaigns_started += 1
            start()


def campaign_now(core: RaftCore, leader: int, logger: Any) -> bool:
    """The successor's turn came: campaign, unless a leader is known meanwhile (another
    campaign won, or the leader was only slow) or an election of ours is under way."""
    if core.leader != NO_NODE or core.role is not Role.FOLLOWER:
        return False
    logger.info("campaign_leader_gone", leader=leader)
    core.campaign()
    return True


def campaign_again(core: RaftCore) -> None:
    """A retry of the successor's campaign, while still no leader is known and no real
    election of ours is under way (a new term for nothing would only disturb)."""
    if core.leader == NO_NODE and core.role in (Role.FOLLOWER, Role.PRE_CANDIDATE):
        core.campaign()


# A reopened preferred replica's campaigns: its peers may not have reopened the group
# yet (a whole cluster restarting opens thousands of groups per node, each at its own
# pace), and a vote request to a group not open there is dropped.
RESTART_CAMPAIGN_ATTEMPTS = 8
# How long (election timeouts) a reopened replica that is not the preferred one waits,
# at most, for the preferred replica's vote request, while that one's node is live: a
# whole cluster restarting opens groups for tens of seconds, and a replica that ticks
# meanwhile campaigns against the paced preferred ones (split votes, 30,000 rounds).
RESTART_HOLD_TIMEOUTS = 60


def campaign_paced(pacer: CampaignPacer, runtime: Any) -> None:
    """A reopened group's preferred replica campaigns (after a restart, when no leader
    is known) when the pacer gives it a slot, and again after each slot's timeout,
    until a leader is known: a whole cluster restarted reopens thousands of groups per
    node, and their campaigns all at once are the storm this module is about."""

    def start() -> None:
        if runtime.core.leader or runtime.core.role is Role.LEADER:
            pacer.done(runtime.group_id)
        else:
            runtime.request_campaign()

    pacer.request(runtime.group_id, start, RESTART_CAMPAIGN_ATTEMPTS)
