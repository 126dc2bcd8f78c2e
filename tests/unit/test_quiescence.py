"""The quiescence decision: a leader quiesces only an idle, fully replicated group."""

from __future__ import annotations

import random

from multiraft.runtime.quiescence import (
    absent_members,
    follower_may_quiesce,
    quiesce_refusal,
    ticks_until_isr_drops,
    woken_by,
)
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Message, MessageType, Role
from raftlog.types import NodeId
from storage.memory import MemoryStorage
from tests.unit.driver import handle_ready
from tests.unit.test_core_api import Cluster


def test_idle_replicated_group_may_quiesce_and_a_write_prevents_it() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    cluster.stabilize()
    assert quiesce_refusal(leader) is None
    follower = cluster.cores[2]
    assert follower_may_quiesce(follower, 1, leader.term, leader.log.last_index())
    assert not follower_may_quiesce(follower, 3, leader.term, leader.log.last_index()), "wrong leader"
    leader.propose([b"x"])
    assert quiesce_refusal(leader) == "uncommitted_entries"
    cluster.stabilize()
    assert quiesce_refusal(leader) is None
    assert quiesce_refusal(follower) == "not_leader"


def test_lagging_follower_or_pending_read_refuses() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    leader.propose([b"y"])
    cluster.stabilize(down=frozenset({3}))
    assert quiesce_refusal(leader) == "follower_3_behind"
    cluster.stabilize()
    leader.read_index(b"ctx")
    assert quiesce_refusal(leader) == "pending_reads"
    assert leader.role is Role.LEADER


def _heartbeat(leader: RaftCore, follower: RaftCore) -> Message:
    return Message(type=MessageType.HEARTBEAT, source=leader.id, target=follower.id, term=leader.term,
                   commit=leader.commit_index)


def _damaged(cluster: Cluster, node: int, lost: int) -> RaftCore:
    """Restart `node` as recovery leaves a replica whose log was cut at damage: its last
    `lost` entries gone, its commit clamped to what is left, marked for repair."""
    storage = cluster.cores[node].log.storage
    assert isinstance(storage, MemoryStorage)
    storage.lose_tail(lost)
    cluster.cores[node] = core = RaftCore(Config(node_id=NodeId(node)), storage, random.Random(node))
    cluster.applied[node] = []
    assert core.needs_repair
    return core


def test_a_replica_in_repair_does_not_quiesce() -> None:
    # Goal: a replica whose damaged log was cut refuses to go quiet even when it agrees
    # with the leader on everything: its clock is what makes it ask for the rest.
    cluster = Cluster()
    leader = cluster.elect(1)
    cluster.stabilize()
    follower = _damaged(cluster, 3, lost=0)
    cluster.stabilize()
    last = leader.log.last_index()
    assert follower.log.last_index() == last
    follower.step(_heartbeat(leader, follower))
    cluster.stabilize()
    assert follower.leader == 1 and follower.commit_index == last
    assert not follower_may_quiesce(follower, 1, leader.term, last), "in repair: keeps ticking"
    follower.mark_repaired()
    assert follower_may_quiesce(follower, 1, leader.term, last)


def test_a_short_replica_of_a_quiet_group_is_refilled_without_a_leader_tick() -> None:
    # Goal (issue 27): the leader quiesced crediting a follower with the whole log; the
    # follower came back short and in repair. The leader never ticks again and nothing
    # is written, yet within two election timeouts of the follower's own clock it is
    # refilled, and the leader reports it out of the ISR from the moment it learns it
    # is short until it has caught up. Before the fix, a replica in repair (which may not
    # campaign) sent nothing, so nothing happened at all.
    cluster = Cluster()
    leader = cluster.elect(1)
    for number in range(6):
        leader.propose([b"v%d" % number])
        cluster.stabilize()
    assert quiesce_refusal(leader) is None, "the leader may quiesce: it ticks no more"
    last = leader.log.last_index()
    short = _damaged(cluster, 3, lost=5)
    cluster.stabilize()  # its first Ready: it re-applies what it kept; nothing is sent
    assert leader.in_sync_replicas() == {1, 2, 3}, "the leader does not know yet"

    notices = []
    for _ in range(2 * short.config.election_timeout_ticks):
        short.tick()
        while short.has_ready():
            notices += [m for m in handle_ready(short, lambda entry: None)]
        if notices:
            break
    assert notices, "it asked for repair within two election timeouts"
    assert {m.target for m in notices} == {1, 2}, "it knows no leader: every voter hears it"
    assert all(m.type is MessageType.APPEND_RESPONSE and m.reject and m.index == 0 for m in notices)
    assert {m.reject_hint for m in notices} == {last - 5}
    for message in notices:
        cluster.cores[message.target].step(message)
    assert leader.progress(NodeId(3)).match == 0, "the leader forgot what it had credited"
    assert leader.in_sync_replicas() == {1, 2}, "short: out of the ISR"
    assert quiesce_refusal(leader) == "follower_3_behind"

    cluster.stabilize()
    assert short.log.last_index() == last == leader.log.last_index(), "refilled, nothing written"
    assert short.commit_index == leader.commit_index
    assert cluster.applied[3] == cluster.applied[1]
    assert leader.in_sync_replicas() == {1, 2, 3}, "caught up: back in"
    assert quiesce_refusal(leader) is None


def test_a_replica_cut_before_its_configuration_asks_the_drivers_contacts() -> None:
    # Goal: damage in the first entries leaves a replica in repair with no log and so no
    # membership: it knows nobody to tell. The driver's repair_contacts (the catalog's
    # replicas) are told instead, and the quiet leader refills it from index 1.
    cluster = Cluster()
    leader = cluster.elect(1)
    leader.propose([b"v"])
    cluster.stabilize()
    storage = cluster.cores[3].log.storage
    assert isinstance(storage, MemoryStorage)
    storage.lose_tail(storage.last_index())
    for contacts in (frozenset(), frozenset({NodeId(1), NodeId(2), NodeId(3)})):
        config = Config(node_id=NodeId(3), repair_contacts=contacts)
        cluster.cores[3] = short = RaftCore(config, storage, random.Random(3))
        cluster.applied[3] = []
        assert short.log.last_index() == 0 and not short.membership.voters
        notices = []
        for _ in range(2 * short.config.election_timeout_ticks):
            short.tick()
            while short.has_ready():
                notices += handle_ready(short, lambda entry: None)
        assert {m.target for m in notices} == contacts - {3}, "nobody to tell without contacts"
    for message in notices:
        cluster.cores[message.target].step(message)
    cluster.stabilize()
    assert short.log.last_index() == leader.log.last_index(), "refilled from index 1"
    assert short.membership.voters == {1, 2, 3}, "its membership came back with its log"
    assert leader.in_sync_replicas() == {1, 2, 3}


def test_a_leader_may_quiesce_past_members_whose_nodes_are_down() -> None:
    # Goal: node 3 is down (a kill) and the leader's new entry never reached it. With node 3
    # absent the leader may go quiet (1 and 2 make a quorum and hold everything); without
    # that knowledge it may not; and with two of three absent there is no quorum left.
    cluster = Cluster()
    leader = cluster.elect(1)
    leader.propose([b"after the kill"])
    cluster.stabilize(down=frozenset({3}))
    assert quiesce_refusal(leader) == "follower_3_behind"
    assert quiesce_refusal(leader, frozenset({NodeId(3)})) is None
    assert quiesce_refusal(leader, frozenset({NodeId(2), NodeId(3)})) == "no_live_quorum"
    leader.propose([b"unreplicated"])
    assert quiesce_refusal(leader, frozenset({NodeId(3)})) == "uncommitted_entries"


def test_absent_members_are_those_whose_nodes_are_not_live() -> None:
    cluster = Cluster()
    leader = cluster.elect(1)
    assert absent_members(leader, lambda node: node != 3) == {3}
    assert absent_members(leader, lambda node: False) == {2, 3}, "never itself"


def test_quiet_time_passes_for_the_isr_and_the_absent_member_leaves_it() -> None:
    # Goal: a leader quiet past absent node 3 wakes after more than the lag time: node 3
    # leaves the ISR at once (its time passed while the group was quiet), node 2, present
    # and holding the whole log, stays in. Before the lag time, node 3 is still in; the
    # node's timer (`ticks_until_isr_drops`) names the tick it leaves.
    lag = 20
    cluster = Cluster(replica_lag_time_max_ticks=lag)
    leader = cluster.elect(1)
    cluster.stabilize()
    assert leader.in_sync_replicas() == {1, 2, 3}
    absent = frozenset({NodeId(3)})
    due = ticks_until_isr_drops(leader, absent)
    assert due == lag + 1
    assert ticks_until_isr_drops(leader, frozenset()) is None
    leader.pass_quiet_time(due - 1, present=[NodeId(1), NodeId(2)])
    assert leader.in_sync_replicas() == {1, 2, 3}, "not yet past the lag time"
    assert ticks_until_isr_drops(leader, absent) == 1
    leader.pass_quiet_time(1, present=[NodeId(1), NodeId(2)])
    assert leader.in_sync_replicas() == {1, 2}
    assert ticks_until_isr_drops(leader, absent) is None
    # A long quiet spell with everyone present changes nothing (the normal quiet group).
    leader.pass_quiet_time(10 * lag, present=[NodeId(1), NodeId(2), NodeId(3)])
    assert leader.in_sync_replicas() == {1, 2, 3}, "back and holding the whole log: in sync"
    follower = cluster.cores[2]
    ticks = follower.now_ticks
    follower.pass_quiet_time(5, present=[])
    assert follower.now_ticks == ticks, "a no-op on a follower"


def test_a_quiet_follower_woken_by_another_replica_tells_its_leader() -> None:
    # Goal (CockroachDB's "unquiesce and wake leader"): a quiet follower woken by a vote
    # request from a restarted replica names its leader to tell, so the quiet leader wakes
    # and heartbeats (or quiets it again) before the follower's clock runs out; a message
    # from the leader itself, or an answer to a quiet leader, tells nobody.
    cluster = Cluster()
    leader = cluster.elect(1)
    cluster.stabilize()
    follower = cluster.cores[2]
    vote = Message(type=MessageType.PRE_VOTE, source=3, target=2, term=leader.term + 1,
                   index=follower.log.last_index(), log_term=follower.log.last_term())
    assert woken_by(follower, vote, idle_ticks=7) == (0, 1)
    assert woken_by(follower, _heartbeat(leader, follower), idle_ticks=7) == (0, 0)
    answer = Message(type=MessageType.HEARTBEAT_RESPONSE, source=2, target=1, term=leader.term)
    assert woken_by(leader, answer, idle_ticks=7) == (7, 0), "an answer: the idle count stands"
    assert woken_by(leader, vote, idle_ticks=7) == (0, 0), "a leader tells nobody"
