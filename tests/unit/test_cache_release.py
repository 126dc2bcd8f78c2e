"""Which entries a store's cache may drop after a group's round (`cache_release_index`,
multiraft/runtime/group_host.py): a leader keeps what a replicating follower lacks or
it has not applied; a follower what it has not applied; a follower being installed
does not pin anything."""

from __future__ import annotations

from multiraft.runtime.group_host import cache_release_index
from raftlog.core.progress import ProgressState
from raftlog.types import NodeId
from tests.unit.test_core_api import Cluster


def test_a_leader_releases_what_every_follower_holds_and_it_applied() -> None:
    # Goal: with all followers caught up, everything applied may go (an idle, fully
    # replicated group keeps nothing); a lagging follower holds the release back.
    cluster = Cluster()
    leader = cluster.elect(1)
    leader.propose([b"a"])
    cluster.stabilize()
    assert cache_release_index(leader) == leader.applied_index == leader.log.last_index()
    leader.propose([b"b"])
    cluster.stabilize(down=frozenset({3}))
    lagging = leader.progress(NodeId(3))
    assert lagging.match < leader.applied_index
    assert cache_release_index(leader) == lagging.match


def test_a_follower_being_installed_does_not_pin_the_cache() -> None:
    # Goal: a follower held for a file install reads no appends: it is left out.
    cluster = Cluster()
    leader = cluster.elect(1)
    for i in range(5):
        leader.propose([b"r%d" % i])
        cluster.stabilize(down=frozenset({3}))
    assert leader.hold_for_install(NodeId(3), leader.commit_index)
    assert leader.progress(NodeId(3)).state is ProgressState.INSTALL
    assert cache_release_index(leader) == min(leader.applied_index, leader.progress(NodeId(2)).match)
    assert cache_release_index(leader) > leader.progress(NodeId(3)).match


def test_a_follower_releases_what_it_applied() -> None:
    # Goal: a follower keeps entries only until it applies them.
    cluster = Cluster()
    cluster.elect(1)
    follower = cluster.cores[2]
    assert cache_release_index(follower) == follower.applied_index
