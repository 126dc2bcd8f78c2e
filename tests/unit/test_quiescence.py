"""The quiescence decision: a leader quiesces only an idle, fully replicated group."""

from __future__ import annotations

from multiraft.quiescence import follower_may_quiesce, quiesce_refusal
from raftlog.messages import Role
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
