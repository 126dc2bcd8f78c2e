"""The quiescence decision: a leader quiesces only an idle, fully replicated group."""

from __future__ import annotations

import random

from multiraft.runtime.quiescence import follower_may_quiesce, quiesce_refusal
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
