"""How a group runtime paces its ticks (issue 26, multiraft/runtime/pacing.py): no task
wakeup for a tick that fires no timer, messages stepped before the ticks that could time
out, no burst of timers after a late turn, and CheckQuorum credit for live nodes."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.runtime.group import GroupRuntime
from multiraft.runtime.pacing import PENDING_TICKS_MAX
from raftlog.messages import Message, MessageType, Role
from raftlog.types import GroupId, NodeId
from tests.node.test_group_runtime import Cluster


class MutedCluster(Cluster):
    """Messages to the nodes in `deaf` are lost while their nodes stay live (a replica
    that cannot answer in time on a node that still pings)."""

    def __init__(self, **config: int) -> None:
        self.deaf: set[int] = set()
        super().__init__(**config)

    def route(self, group: GroupId, message: Message) -> None:
        if message.target not in self.deaf:
            super().route(group, message)


async def _elect(cluster: Cluster) -> GroupRuntime:
    """Tick every replica by hand until one leads and every follower knows it."""
    while (leader := next((r for r in cluster.runtimes.values() if r.core.role is Role.LEADER), None)) is None:
        for runtime in cluster.runtimes.values():
            runtime.tick()
        await asyncio.sleep(0.002)
    await leader.propose([b"a"])
    while any(r.core.leader != leader.core.id or r.core.applied_index < leader.core.commit_index
              for r in cluster.runtimes.values()):
        await asyncio.sleep(0.002)
    return leader


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_tick_wakes_the_task_only_when_a_timer_can_fire() -> None:
    # Goal: a follower's ticks are only counted until one would run its election timer
    # out; a wakeup for any other reason applies them, in order, all of them. A leader
    # wakes for its heartbeat ticks only (every 2nd tick here), not for the others.
    cluster = Cluster(heartbeat_interval_ticks=2)
    async with cluster.running(ticking=False):
        leader = await _elect(cluster)
        follower = next(r for r in cluster.runtimes.values() if r is not leader)
        await _settle()
        elapsed = follower.core.election_elapsed
        quiet = follower.core.ticks_before_timer()
        assert quiet >= 3
        for _ in range(quiet):
            follower.tick()
            assert not follower._wakeup.is_set(), "no timer can fire: no wakeup"
        assert follower.core.election_elapsed == elapsed, "counted, not applied yet"
        follower.request_transfer(3)  # any input wakes it (a follower ignores this one)
        await _settle()
        assert follower.core.election_elapsed == elapsed + quiet and follower._pending_ticks == 0
        assert follower.core.role is Role.FOLLOWER

        await _settle()
        wakeups = 0
        for _ in range(20):
            leader.tick()
            wakeups += leader._wakeup.is_set()
            await _settle()
        assert wakeups == 10, "a leader wakes for its heartbeat ticks"
        assert leader.core.role is Role.LEADER


@pytest.mark.asyncio
async def test_a_late_follower_steps_the_queued_heartbeat_before_its_timer() -> None:
    # Goal: a follower whose task was late, with enough ticks held to time out and its
    # leader's heartbeat already queued, reads the heartbeat first and keeps following;
    # of a long backlog of ticks only PENDING_TICKS_MAX timer-capable ones run.
    cluster = Cluster(heartbeat_interval_ticks=2)
    async with cluster.running(ticking=False):
        leader = await _elect(cluster)
        follower = next(r for r in cluster.runtimes.values() if r is not leader)
        await _settle()
        core = follower.core
        now_before, quiet = core.now_ticks, core.ticks_before_timer()
        for _ in range(quiet + 10):  # no await: the task does not run meanwhile
            follower.tick()
        follower.deliver(Message(
            type=MessageType.HEARTBEAT, source=leader.core.id, target=NodeId(core.id), term=leader.core.term,
            commit=leader.core.commit_index,
        ))
        await _settle()
        assert core.role is Role.FOLLOWER and core.leader == leader.core.id, "the heartbeat came first"
        assert core.now_ticks - now_before == quiet + PENDING_TICKS_MAX, "no burst of timers"
        assert core.election_elapsed == PENDING_TICKS_MAX


@pytest.mark.asyncio
async def test_checkquorum_counts_replicas_whose_node_is_live() -> None:
    # Goal: a leader whose followers' replicas do not answer (their nodes still live)
    # keeps leading through CheckQuorum; once their nodes are silent too it steps down.
    cluster = MutedCluster(heartbeat_interval_ticks=2)
    async with cluster.running(ticking=False):
        leader = await _elect(cluster)
        cluster.deaf.add(leader.core.id)  # no answer reaches the leader
        for _ in range(4 * leader.core.config.election_timeout_ticks):
            leader.tick()
            await _settle()
        assert leader.core.role is Role.LEADER, "its members' nodes are live"
        cluster.isolated.update(n for n in cluster.runtimes if n != leader.core.id)
        for _ in range(2 * leader.core.config.election_timeout_ticks):
            leader.tick()
            await _settle()
        assert leader.core.role is Role.FOLLOWER, "cut off from a majority of nodes: it steps down"


class RecordingCluster(Cluster):
    def __init__(self, **config: int) -> None:
        self.sent: list[Message] = []
        super().__init__(**config)

    def route(self, group: GroupId, message: Message) -> None:
        self.sent.append(message)
        super().route(group, message)


@pytest.mark.asyncio
async def test_a_quiet_leader_woken_by_a_vote_request_is_heard_before_it_quiets_again() -> None:
    # Goal: a quiet leader that a member's vote request wakes (a restarted replica that
    # never heard it) stays awake an election timeout and heartbeats, rather than going
    # quiet again at once: a leader quiesces without a heartbeat in that turn (its
    # answers would wake it), so going back at once would leave the member unheard.
    cluster = RecordingCluster(heartbeat_interval_ticks=2)
    for node, runtime in cluster.runtimes.items():
        runtime.on_quiesce = lambda group, term, index, node=node: [
            r.request_quiesce(node, term, index) for n, r in cluster.runtimes.items() if n != node]
    async with cluster.running(ticking=False):
        leader = await _elect(cluster)
        while not all(r.quiesced for r in cluster.runtimes.values()):
            for runtime in cluster.runtimes.values():
                runtime.tick()
            await _settle()
        core = leader.core
        voter = next(n for n in cluster.runtimes if n != core.id)
        cluster.sent.clear()
        leader.deliver(Message(
            type=MessageType.PRE_VOTE, source=NodeId(voter), target=core.id, term=core.term + 1,
            index=core.log.last_index(), log_term=core.log.last_term(),
        ))
        for _ in range(4):
            leader.tick()
            await _settle()
        assert not leader.quiesced and core.role is Role.LEADER
        assert any(m.type is MessageType.HEARTBEAT and m.target == voter for m in cluster.sent)
