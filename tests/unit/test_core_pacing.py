"""The core inputs behind the runtime's pacing (issue 26): `note_active` (CheckQuorum
credits a member whose node is live) and `ticks_before_timer` (how many ticks only
count time), and the pure rules of multiraft/runtime/pacing.py built on them."""

from __future__ import annotations

import random

import pytest

from multiraft.runtime.pacing import (
    PENDING_TICKS_MAX,
    credit_live_members,
    run_ticks,
    split_ticks,
    tick_due,
)
from raftlog.core.raft import RaftCore
from raftlog.messages import Role
from raftlog.types import NodeId
from tests.unit.driver import handle_ready
from tests.unit.test_core_api import Cluster


def _leader_alone() -> RaftCore:
    """Node 1 of 3 voters, elected, that hears nothing from its followers after."""
    return Cluster(3, pre_vote=True, check_quorum=True, heartbeat_interval_ticks=2).elect(1)


def _drain(core: RaftCore) -> list:
    messages = []
    while core.has_ready():
        messages += handle_ready(core, lambda entry: None)
    return messages


def test_a_leader_credited_with_live_nodes_keeps_leading_through_checkquorum() -> None:
    # Goal: with no answer from any replica, a leader stays if it is told the nodes are
    # live before each CheckQuorum, and steps down (as ever) when it is not told so.
    credited = _leader_alone()
    for _ in range(5 * credited.config.election_timeout_ticks):
        credit_live_members(credited, lambda node: True)
        credited.tick()
        _drain(credited)
    assert credited.role is Role.LEADER

    cut_off = _leader_alone()
    for _ in range(2 * cut_off.config.election_timeout_ticks):
        credit_live_members(cut_off, lambda node: False)  # its node hears neither follower's
        cut_off.tick()
        _drain(cut_off)
    assert cut_off.role is Role.FOLLOWER, "a leader cut off from a majority of nodes still steps down"


def test_note_active_is_a_no_op_off_a_leader_and_for_a_non_member() -> None:
    # Goal: the credit touches nothing but a leader's progress of a member.
    cluster = Cluster(3, pre_vote=True, check_quorum=True)
    cluster.stabilize()
    follower = cluster.cores[2]
    follower.note_active(NodeId(1))
    assert follower.progress(NodeId(1)) is None and follower.role is Role.FOLLOWER
    leader = cluster.elect(1)
    leader.note_active(NodeId(9))
    assert leader.progress(NodeId(9)) is None


def test_a_read_index_still_needs_a_heartbeat_round_whatever_the_credit() -> None:
    # Goal: no read relies on a lease: a credited leader with silent followers serves
    # no linearizable read (it waits for a quorum's heartbeat answers).
    leader = _leader_alone()
    credit_live_members(leader, lambda node: True)
    leader.read_index(b"r1")
    _drain(leader)
    assert leader.pending_read_count == 1
    for _ in range(3):
        credit_live_members(leader, lambda node: True)
        leader.tick()
        assert not [r for r in _ready_reads(leader)], "no read without a quorum's answers"


def _ready_reads(core: RaftCore) -> list:
    reads = []
    while core.has_ready():
        ready = core.ready()
        reads += ready.read_states
        core.advance(ready)
    return reads


def _observable(core: RaftCore) -> tuple:
    return (core.role, core.term, core.leader, core.vote)


@pytest.mark.parametrize("seed", range(40))
def test_ticks_before_timer_is_exact(seed: int) -> None:
    # Goal: in states reached by random elections, ticks and drops, `ticks_before_timer`
    # ticks send nothing and change no role or term; for a replica that may campaign or
    # a leader, the next tick fires a timer (sends something or campaigns).
    rng = random.Random(seed)
    cluster = Cluster(3, pre_vote=rng.random() < 0.5, check_quorum=True,
                      heartbeat_interval_ticks=rng.choice([1, 2, 3]))
    cluster.stabilize()
    for _ in range(rng.randrange(0, 60)):
        node = rng.choice([1, 2, 3])
        core = cluster.cores[node]
        core.tick()
        for message in _drain(core):
            if rng.random() < 0.7:
                cluster.cores[message.target].step(message)
    for core in cluster.cores.values():
        _drain(core)
        quiet = core.ticks_before_timer()
        before = _observable(core)
        for _ in range(quiet):
            core.tick()
            assert not _drain(core), "a quiet tick sends nothing"
            assert _observable(core) == before
        if core.role is Role.LEADER or core._promotable():
            elapsed = core.election_elapsed
            core.tick()
            fired = _drain(core) or _observable(core) != before or core.election_elapsed < elapsed
            assert fired, f"node {core.id} ({core.role}): tick {quiet + 1} fires a timer"


def test_split_ticks_applies_quiet_ticks_first_and_caps_the_burst() -> None:
    # Goal: ticks that fire nothing all apply (before the inbox); the rest are capped.
    cluster = Cluster(3, pre_vote=True, check_quorum=True)
    cluster.stabilize()
    follower = cluster.cores[2]
    quiet = follower.ticks_before_timer()
    assert quiet == follower.randomized_election_timeout - follower.election_elapsed - 1
    assert split_ticks(follower, 3) == (3, 0) and not tick_due(follower, quiet)
    assert tick_due(follower, quiet + 1)
    assert split_ticks(follower, quiet + 50) == (quiet, PENDING_TICKS_MAX)


def test_run_ticks_counts_the_campaigns_a_timer_started() -> None:
    # Goal: run_ticks reports the election timeouts of a campaigning replica (the
    # runtime's backoff counts them) and not those of a follower's first campaign.
    cluster = Cluster(3, pre_vote=True, check_quorum=True)
    cluster.stabilize()
    lonely = cluster.cores[1]
    timeout = lonely.config.election_timeout_ticks
    assert run_ticks(lonely, 2 * timeout, lambda node: True) == 1  # follower -> pre-candidate
    assert lonely.role is Role.PRE_CANDIDATE
    assert run_ticks(lonely, 4 * timeout, lambda node: True) >= 2  # pre-vote rounds timing out
