"""Which entries a store's cache may drop after a group's round (`cache_release_index`,
multiraft/runtime/group_host.py): a leader keeps what a replicating follower lacks or
it has not applied; a follower what it has not applied; a follower being installed
does not pin anything."""

from __future__ import annotations

from multiraft.runtime.group_host import cache_release_index
from raftlog.core.progress import ProgressState
from raftlog.types import NodeId
from tests.unit.test_core_api import Cluster, handle_ready


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


def test_a_follower_keeps_what_it_appended_until_it_applies_it() -> None:
    # Goal: a follower that appended an entry but has not learned its commit keeps it
    # (its apply reads it next); once applied, everything may go. (The runtime's call
    # after each round is tested on real nodes: tests/node/test_entry_cache_release.py.)
    cluster = Cluster()
    leader = cluster.elect(1)
    follower = cluster.cores[2]
    assert cache_release_index(follower) == follower.log.last_index(), "all applied"
    leader.propose([b"a"])
    for message in handle_ready(leader, lambda entry: None):
        if message.target == 2:
            follower.step(message)
    handle_ready(follower, lambda entry: None)  # appended; its answer is not delivered
    assert follower.applied_index < follower.log.last_index()
    assert cache_release_index(follower) == follower.applied_index < follower.log.last_index()
    for _ in range(10 * leader.config.heartbeat_interval_ticks):  # a heartbeat carries the commit
        if follower.applied_index == follower.log.last_index():
            break
        leader.tick()
        cluster.stabilize()
    assert follower.applied_index == follower.log.last_index() == cache_release_index(follower)
