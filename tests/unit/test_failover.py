"""The succession after a leader's node is gone (multiraft/runtime/failover.py).

Goal: exactly one survivor campaigns for each group (the lowest-numbered live voter),
the others wait for it; and a node runs a bounded number of those campaigns at once,
the next as each ends or times out, in order, each group once.
"""

from __future__ import annotations

import asyncio

import pytest

from multiraft.runtime.failover import CampaignPacer, Succession, forget_dead_leader
from multiraft.runtime.pacing import campaign_backoff_skips
from raftlog.types import NO_NODE
from tests.unit.test_core_api import Cluster


def test_the_lowest_live_voter_succeeds_and_the_others_wait() -> None:
    cluster = Cluster()
    cluster.elect(3)
    cluster.stabilize()
    one, two = cluster.cores[1], cluster.cores[2]
    assert forget_dead_leader(one, 3, lambda node: node != 3) is Succession.SUCCESSOR
    assert one.leader == NO_NODE, "the dead leader's lease is no longer honoured"
    assert forget_dead_leader(two, 3, lambda node: node != 3) is Succession.OTHER
    assert forget_dead_leader(two, 3, lambda node: True) is Succession.NONE, "already forgotten"
    cluster2 = Cluster()
    cluster2.elect(3)
    cluster2.stabilize()
    lone = cluster2.cores[2]
    assert forget_dead_leader(lone, 3, lambda node: node == 2) is Succession.SUCCESSOR, "node 1 unheard"
    assert forget_dead_leader(cluster2.cores[1], 2, lambda node: True) is Succession.NONE, "not its leader"


@pytest.mark.asyncio
async def test_the_pacer_bounds_campaigns_in_flight_and_starts_each_group_once() -> None:
    pacer = CampaignPacer(in_flight_max=2, slot_timeout_s=60)
    started: list[int] = []
    for group in (1, 2, 3, 4, 5):
        pacer.request(group, lambda g=group: started.append(g))
    pacer.request(4, lambda: started.append(-4))  # asked again while waiting: nothing changes
    pacer.request(1, lambda: started.append(-1))  # and while in flight
    assert started == [1, 2] and pacer.in_flight == 2 and pacer.waiting == 3
    pacer.done(2)
    assert started == [1, 2, 3]
    pacer.done(2)  # done twice: no second slot
    pacer.done(99)  # never started: nothing
    assert started == [1, 2, 3] and pacer.in_flight == 2
    pacer.done(1)
    pacer.done(3)
    assert started == [1, 2, 3, 4, 5] and pacer.waiting == 0
    assert pacer.campaigns_started == 5


@pytest.mark.asyncio
async def test_a_slot_is_freed_when_its_campaign_times_out() -> None:
    pacer = CampaignPacer(in_flight_max=1, slot_timeout_s=0.05)
    started: list[int] = []
    pacer.request(1, lambda: started.append(1))
    pacer.request(2, lambda: started.append(2))
    assert started == [1]
    async with asyncio.timeout(10):  # generous: the box may be busy
        while started != [1, 2]:
            await asyncio.sleep(0.01)
    assert pacer.slots_timed_out == 1
    pacer.done(1)  # late: its slot is already gone
    assert pacer.in_flight == 1


def test_campaign_backoff_slows_the_clock_after_failed_campaigns() -> None:
    def kept(failed_campaigns: int) -> int:
        return sum(not campaign_backoff_skips(failed_campaigns, n) for n in range(1, 65))

    assert kept(0) == kept(1) == 64, "the first campaign costs no tick"
    assert kept(2) == 32
    assert kept(3) == 16
    assert kept(4) == kept(10) == 8, "an eighth at most"


@pytest.mark.asyncio
async def test_a_group_asked_with_attempts_goes_back_in_line_after_each_timeout() -> None:
    # A reopened preferred replica whose peers have not reopened the group yet: its vote
    # requests are dropped there, so it asks again after each slot's timeout, behind the
    # groups already waiting, until its attempts are spent (or `done`).
    pacer = CampaignPacer(in_flight_max=1, slot_timeout_s=0.02)
    started: list[int] = []
    pacer.request(1, lambda: started.append(1), attempts=3)
    pacer.request(2, lambda: started.append(2))
    async with asyncio.timeout(10):
        while len(started) < 4:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert started == [1, 2, 1, 1], "group 1 three times, group 2 once, in line"
    assert pacer.in_flight == 0 and pacer.waiting == 0
