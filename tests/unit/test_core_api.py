"""The core's public inputs and their errors, driven by a minimal synchronous driver."""

from __future__ import annotations

import random

import pytest

from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.errors import (
    InvalidMembershipChange,
    LeadershipTransferInProgress,
    MembershipChangeInProgress,
    NotEnoughReplicas,
    NotLeader,
    ProposalDropped,
)
from raftlog.messages import ConfChange, ConfChangeOp, EntryKind, Role
from raftlog.types import NodeId
from storage.memory import MemoryStorage
from tests.unit.driver import bootstrapped_core, handle_ready


class Cluster:
    """Nodes 1..n, messages delivered synchronously (no faults): just enough to test the API."""

    def __init__(self, n: int = 3, **config: object) -> None:
        self.cores = {node: bootstrapped_core(node, n, **config) for node in range(1, n + 1)}
        self.applied: dict[int, list[bytes]] = {node: [] for node in self.cores}

    def stabilize(self, rounds_max: int = 200, down: frozenset[int] = frozenset()) -> None:
        for _ in range(rounds_max):
            moved = False
            for node, core in self.cores.items():
                if node in down:
                    continue
                while core.has_ready():
                    moved = True
                    applied = self.applied[node]
                    messages = handle_ready(
                        core, lambda e, out=applied: out.append(e.payload) if e.kind is EntryKind.DATA else None
                    )
                    for message in messages:
                        if message.target not in down:
                            self.cores[message.target].step(message)
            if not moved:
                return
        raise AssertionError("did not stabilize")

    def elect(self, node: int) -> RaftCore:
        core = self.cores[node]
        self.stabilize()  # apply the bootstrap entries: a node learns its membership from the log
        for _ in range(3 * core.config.election_timeout_ticks):
            core.tick()
            if core.role is not Role.FOLLOWER:
                break
        self.stabilize()
        assert core.role is Role.LEADER
        return core


def test_propose_commits_and_applies_everywhere() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    term, first = leader.propose([b"a", b"b"])
    assert (term, first) == (leader.term, leader.commit_index + 1)
    cluster.stabilize()
    assert all(applied == [b"a", b"b"] for applied in cluster.applied.values())


def test_follower_refuses_with_a_leader_hint() -> None:
    cluster = Cluster()
    cluster.elect(1)
    with pytest.raises(NotLeader) as raised:
        cluster.cores[2].propose([b"x"])
    assert raised.value.leader_hint == 1
    assert raised.value.retriable


def test_uncommitted_bytes_limit_drops_proposals() -> None:
    cluster = Cluster(uncommitted_bytes_max=1000)
    leader = cluster.elect(1)
    leader.propose([b"x" * 900])
    with pytest.raises(ProposalDropped):
        leader.propose([b"y" * 200])


def test_transfer_refuses_proposals_until_done() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    assert leader.transfer_leadership() in (2, 3)
    with pytest.raises(LeadershipTransferInProgress):
        leader.propose([b"x"])
    cluster.stabilize()
    assert leader.role is Role.FOLLOWER
    assert sum(core.role is Role.LEADER for core in cluster.cores.values()) == 1


def test_membership_changes_one_at_a_time_and_validated() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    with pytest.raises(InvalidMembershipChange):
        leader.propose_membership(ConfChange(ConfChangeOp.ADD_VOTER, NodeId(2)))
    with pytest.raises(InvalidMembershipChange):
        leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(1)))
    leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(3)))
    with pytest.raises(MembershipChangeInProgress):
        leader.propose_membership(ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(4)))
    cluster.stabilize()
    assert leader.membership.voters == {1, 2}


def test_min_insync_replicas() -> None:
    # Goal: a silent follower leaves the ISR after the lag time and fails the min ISR check.
    cluster = Cluster(replica_lag_time_max_ticks=5)
    leader = cluster.elect(1)
    leader.check_min_insync(3)
    assert leader.in_sync_replicas() == {1, 2, 3}
    for _ in range(8):  # node 3 goes silent while the leader keeps appending
        leader.tick()
        leader.propose([b"z"])
        cluster.stabilize(down=frozenset({3}))
    assert 3 in leader.out_of_sync_replicas()
    with pytest.raises(NotEnoughReplicas):
        leader.check_min_insync(3)


@pytest.mark.parametrize(
    "bad",
    [
        {"node_id": 0},
        {"node_id": 1, "election_timeout_ticks": 1, "heartbeat_interval_ticks": 1},
        {"node_id": 1, "inflight_messages_max": 0},
    ],
)
def test_config_is_validated(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Config(**bad)  # type: ignore[arg-type]


def _core_in_repair() -> RaftCore:
    """Node 1 of three, opened from storage that reported damage (in repair)."""
    from raftlog.storage import InitialState

    class SuspectStorage(MemoryStorage):
        def initial_state(self) -> InitialState:
            state = super().initial_state()
            return InitialState(state.hard_state, state.membership, needs_repair=True)

    entries, hard_state = bootstrap_entries([NodeId(1), NodeId(2), NodeId(3)])
    storage = SuspectStorage()
    storage.append(entries)
    storage.set_hard_state(hard_state)
    storage.sync()
    core = RaftCore(Config(node_id=NodeId(1)), storage, random.Random(1))
    core.advance(core.ready())
    return core


def test_replica_needing_repair_neither_votes_nor_campaigns() -> None:
    # Goal: a replica whose storage reported corruption never acts on its suspect log.
    from raftlog.messages import Message, MessageType

    core = _core_in_repair()
    for _ in range(100):
        core.tick()
    assert core.role is Role.FOLLOWER, "it never campaigns"
    core.step(Message(type=MessageType.VOTE, source=NodeId(2), target=NodeId(1), term=5, index=9, log_term=4))
    answer = core.ready()
    assert [m.reject for m in answer.messages if m.type is MessageType.VOTE_RESPONSE] == [True]
    core.advance(answer)
    core.mark_repaired()
    assert not core.needs_repair


def test_a_replica_opened_in_repair_says_so_at_its_first_tick_then_every_timeout() -> None:
    # Goal: a node back with a lost log (a replaced disk, a cut at damage) is heard by its
    # quiet leader at once, not after an election timeout: its first tick says where its
    # log ends (a rejection of index 0) to every voter, as it does every timeout after.
    from raftlog.messages import MessageType

    core = _core_in_repair()
    asked_at = []
    for tick in range(1, 3 * core.config.election_timeout_ticks):
        core.tick()
        ready = core.ready()
        said = sorted(m.target for m in ready.messages
                      if m.type is MessageType.APPEND_RESPONSE and m.reject and m.index == 0)
        if said:
            assert said == [2, 3]
            asked_at.append(tick)
        core.advance(ready)
    assert asked_at[0] == 1, asked_at
    assert len(asked_at) >= 2, "and again while no leader talks to it"


@pytest.mark.parametrize("writes_after", [0, 3])
def test_a_follower_that_lost_acknowledged_entries_gets_them_back(writes_after: int) -> None:
    # Goal: a replica whose storage lost entries it had acknowledged (recovery put it in
    # repair) gets them back from the same leader, idle or not. The leader never probes
    # below what a follower acknowledged, and an idle group sends no appends at all: the
    # follower's answer to a heartbeat that credits it with more than it holds says so.
    # (Found by the chaos runner: a metadata replica with a damaged tail stayed short.)
    from raftlog.messages import HardState
    from raftlog.storage import InitialState
    from raftlog.types import Index

    class RepairingStorage(MemoryStorage):
        def initial_state(self) -> InitialState:
            state = super().initial_state()
            return InitialState(state.hard_state, state.membership, needs_repair=True)

    cluster = Cluster()
    leader = cluster.elect(1)
    for number in range(6):
        leader.propose([b"v%d" % number])
        cluster.stabilize()
    damaged = cluster.cores[3]
    assert damaged.log.last_index() == leader.log.last_index()
    kept = Index(damaged.log.last_index() - 4)
    storage = RepairingStorage()
    storage.append(damaged.log.storage.entries(Index(1), Index(kept + 1), 1 << 30))
    old = damaged.log.storage.initial_state().hard_state
    storage.set_hard_state(HardState(term=old.term, vote=old.vote, commit=kept))  # recovery clamps it
    storage.sync()
    cluster.cores[3] = restarted = RaftCore(Config(node_id=NodeId(3)), storage, random.Random(3))
    cluster.applied[3] = []
    assert restarted.needs_repair

    for number in range(writes_after):
        leader.propose([b"after%d" % number])
        cluster.stabilize()
    for _ in range(4 * leader.config.heartbeat_interval_ticks):
        leader.tick()
        cluster.stabilize()
    assert leader.role is Role.LEADER
    assert restarted.log.last_index() == leader.log.last_index(), "it got its entries back"
    assert restarted.commit_index == leader.commit_index
    assert cluster.applied[3] == cluster.applied[1]


def test_idle_followers_stay_in_sync() -> None:
    # Goal: with no writes at all, followers that answer heartbeats stay in the ISR.
    cluster = Cluster(replica_lag_time_max_ticks=5)
    leader = cluster.elect(1)
    for _ in range(30):
        leader.tick()
        cluster.stabilize()
    assert leader.in_sync_replicas() == {1, 2, 3}


def test_a_follower_that_forgot_its_dead_leader_elects_another_without_a_timeout() -> None:
    # Goal: forget_leader (the driver learned the leader's node is gone) lets a survivor's
    # campaign succeed at once: without it, the other follower honours the dead leader's
    # lease and ignores the pre-vote, so only election timeouts could elect anyone.
    for forget in (False, True):
        cluster = Cluster(3, pre_vote=True, check_quorum=True)
        cluster.elect(2)
        down = frozenset({2})
        one, three = cluster.cores[1], cluster.cores[3]
        if forget:
            one.forget_leader(NodeId(2))
            three.forget_leader(NodeId(2))
            assert (one.leader, three.leader) == (0, 0)
        one.campaign()
        cluster.stabilize(down=down)
        assert (one.role is Role.LEADER) is forget, "elected only if the lease was given up"
        assert three.role is Role.FOLLOWER


def test_forget_leader_ignores_any_other_node_and_a_leader() -> None:
    cluster = Cluster(3)
    leader = cluster.elect(1)
    follower = cluster.cores[2]
    follower.forget_leader(NodeId(3))
    assert follower.leader == 1, "only the named leader is forgotten"
    leader.forget_leader(NodeId(1))
    assert leader.role is Role.LEADER and leader.leader == 1
    follower.forget_leader(NodeId(1))
    assert follower.leader == 0
    leader.propose([b"x"])
    cluster.stabilize()
    assert follower.leader == 1, "a live leader is followed again at its next message"
