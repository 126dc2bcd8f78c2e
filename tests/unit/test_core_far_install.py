"""The core's side of far-horizon catch-up: hold a follower for a file install, keep the
hold alive while the transfer moves, and probe it at once when the install ends."""

from __future__ import annotations

import random

from raftlog.core.config import Config
from raftlog.core.progress import ProgressState
from raftlog.core.raft import RaftCore
from raftlog.messages import ConfChange, ConfChangeOp, MessageType, Role
from raftlog.types import Index, NodeId
from storage.memory import MemoryStorage
from tests.unit.test_core_api import Cluster


def _leader_with_lagging_follower() -> tuple[Cluster, object]:
    cluster = Cluster()
    leader = cluster.elect(1)
    for i in range(20):
        leader.propose([b"r%d" % i])
        cluster.stabilize(down=frozenset({3}))
    progress = leader.progress(NodeId(3))
    assert progress.state is ProgressState.REPLICATE and progress.match < leader.commit_index
    return cluster, leader


def test_hold_pauses_appends_until_the_install_ends_then_probes_past_it() -> None:
    cluster, leader = _leader_with_lagging_follower()
    committed = leader.commit_index
    assert leader.hold_for_install(NodeId(3), committed)
    progress = leader.progress(NodeId(3))
    assert progress.state is ProgressState.INSTALL and progress.install_index == committed
    leader.propose([b"during"])
    cluster.stabilize(down=frozenset({3}))
    ready = leader.ready() if leader.has_ready() else None
    assert ready is None or not any(m.target == 3 and m.type is MessageType.APPEND for m in ready.messages)
    if ready is not None:
        leader.advance(ready)
    # The install "failed": probing starts again from the old match, and node 3 catches up
    # entry by entry.
    leader.finish_install(NodeId(3), success=False)
    assert leader.progress(NodeId(3)).state is ProgressState.PROBE
    cluster.stabilize()
    assert cluster.applied[3] == cluster.applied[1]
    assert leader.progress(NodeId(3)).state is ProgressState.REPLICATE


def test_a_success_the_follower_cannot_back_is_refused_and_probing_finds_its_end() -> None:
    cluster, leader = _leader_with_lagging_follower()
    assert leader.hold_for_install(NodeId(3), leader.commit_index)
    leader.finish_install(NodeId(3), success=True)  # node 3 never got the files
    progress = leader.progress(NodeId(3))
    assert progress.state is ProgressState.PROBE and progress.next == leader.commit_index + 1
    cluster.stabilize()
    assert cluster.applied[3] == cluster.applied[1]


def test_hold_is_refused_unless_leading_replicating_and_committed() -> None:
    cluster, leader = _leader_with_lagging_follower()
    follower = cluster.cores[2]
    assert not follower.hold_for_install(NodeId(3), Index(2))  # not the leader
    assert not leader.hold_for_install(NodeId(1), leader.commit_index)  # itself
    assert not leader.hold_for_install(NodeId(3), Index(leader.commit_index + 1))  # not committed
    match = leader.progress(NodeId(3)).match
    assert not leader.hold_for_install(NodeId(3), match)  # nothing beyond its match
    assert not leader.hold_for_install(NodeId(9), leader.commit_index)  # not a member
    leader.report_unreachable(NodeId(3))  # probing: its match is a guess
    assert not leader.hold_for_install(NodeId(3), leader.commit_index)
    assert leader.role is Role.LEADER


def test_progress_defers_the_install_timeout() -> None:
    cluster, leader = _leader_with_lagging_follower()
    assert leader.hold_for_install(NodeId(3), leader.commit_index)
    timeout = leader.config.snapshot_timeout_ticks
    for _ in range(3):
        for _ in range(timeout - 1):
            leader.tick()
            cluster.stabilize(down=frozenset({3}))  # node 2 answers: the leader keeps its quorum
        leader.install_progressing(NodeId(3))
        assert leader.progress(NodeId(3)).state is ProgressState.INSTALL
    for _ in range(timeout):
        leader.tick()
        cluster.stabilize(down=frozenset({3}))
    assert leader.progress(NodeId(3)).state is not ProgressState.INSTALL  # timed out: probing again


def _far_follower_found(**config: object) -> tuple[Cluster, object]:
    """Node 3 misses 20 entries, then answers a probe: appends carry one entry each."""
    cluster = Cluster(message_bytes_max=1, **config)
    leader = cluster.elect(1)
    for i in range(20):
        leader.propose([b"r%d" % i])
        cluster.stabilize(down=frozenset({3}))
    leader.report_unreachable(NodeId(3))  # probe it again, with the next proposal
    leader.propose([b"next"])
    cluster.stabilize()
    return cluster, leader


def test_a_far_follower_waits_for_the_driver_then_replays() -> None:
    cluster, leader = _far_follower_found(far_wait_lag_entries=5, far_wait_ticks=3)
    progress = leader.progress(NodeId(3))
    assert progress.state is ProgressState.REPLICATE and progress.far_wait == 3
    assert len(cluster.applied[3]) < len(cluster.applied[1])  # no appends stream meanwhile
    assert leader.ticks_before_timer() == 0
    for _ in range(3):
        leader.tick()
        cluster.stabilize()
    assert cluster.applied[3] == cluster.applied[1], "no install came: replay"


def test_the_driver_may_hold_a_waiting_follower_and_no_wait_without_the_setting() -> None:
    _, leader = _far_follower_found(far_wait_lag_entries=5, far_wait_ticks=3)
    assert leader.hold_for_install(NodeId(3), leader.commit_index)
    assert leader.progress(NodeId(3)).far_wait == 0
    cluster, _ = _far_follower_found()
    assert cluster.applied[3] == cluster.applied[1]


def _learner_added(**config: object) -> tuple[Cluster, object]:
    """Three voters hold 10 entries; node 4 (empty, a copy being made) is added as a learner.
    Appends carry one entry each, so the probe that finds its log's end does not carry all."""
    config = {"message_bytes_max": 1, **config}
    cluster = Cluster(**config)
    cluster.cores[4] = RaftCore(Config(node_id=NodeId(4), **config), MemoryStorage(), random.Random(4))  # type: ignore[arg-type]
    cluster.applied[4] = []
    leader = cluster.elect(1)
    for i in range(10):
        leader.propose([b"r%d" % i])
    cluster.stabilize()
    leader.propose_membership(ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(4)))
    cluster.stabilize()
    return cluster, leader


def test_a_learner_behind_at_all_waits_for_the_driver_which_may_end_the_wait() -> None:
    # Goal: with far_wait_learners, a new copy gets no appends once its probe succeeds (the
    # driver decides by bytes whether files will make it, and appends sent first are thrown
    # away by the install); the driver ends the wait when it will not hold it, and the
    # learner replays at once. Voters keep the entries rule only.
    cluster, leader = _learner_added(far_wait_learners=True, far_wait_ticks=3)
    progress = leader.progress(NodeId(4))
    assert progress.state is ProgressState.REPLICATE and progress.far_wait == 3
    assert cluster.applied[4] == [], "no appends stream to it meanwhile"
    leader.end_far_wait(NodeId(4))
    cluster.stabilize()
    assert leader.progress(NodeId(4)).far_wait == 0
    assert cluster.applied[4] == cluster.applied[1], "replayed at once"
    cluster, leader = _learner_added(far_wait_learners=True, far_wait_ticks=3)
    assert leader.hold_for_install(NodeId(4), leader.commit_index), "or the driver holds it"


def test_without_the_setting_a_learner_replays_at_once() -> None:
    cluster, leader = _learner_added()
    assert leader.progress(NodeId(4)).far_wait == 0
    assert cluster.applied[4] == cluster.applied[1]
