"""Decommissioning in the pure layers (issue 25).

Goal: the mark encodes, validates and applies deterministically, survives
re-registration and a snapshot; a decommission that would leave a partition nowhere
to go is refused with a clear error; a decommissioning node leads nothing and takes
no new replica; the metadata group's next step keeps three voters (a caught-up
learner is promoted first), never removes its own leader, removes a learner at
once, and says why it waits; the progress walks moving -> leaving -> done.
"""

from __future__ import annotations

import pytest

from multiraft.errors import ClusterTooSmall, InvalidReplicaAssignment, InvalidRequest, UnknownNode
from multiraft.metadata import (
    Catalog,
    NodeStatus,
    ReplaceReplica,
    ReplicaLeft,
    SetNodeDecommissioning,
    SetNodeStatus,
    decode_command,
    encode_command,
)
from multiraft.node import decommission
from multiraft.node.decommission import Stage
from raftlog.messages import ConfChange, ConfChangeOp, Membership
from raftlog.types import NodeId
from tests.unit.test_catalog import Applier, create, node


def _catalog(nodes: int = 4) -> Applier:
    apply = Applier()
    for n in range(1, nodes + 1):
        assert apply(node(n)).ok
    return apply


def _membership(voters: set[int], learners: set[int] = frozenset()) -> Membership:  # type: ignore[assignment]
    return Membership(voters=frozenset(NodeId(v) for v in voters), learners=frozenset(NodeId(n) for n in learners))


@pytest.mark.parametrize("command", [SetNodeDecommissioning(node_id=2, decommissioning=True),
                                     SetNodeDecommissioning(node_id=2, decommissioning=False)])
def test_the_mark_round_trips(command) -> None:  # type: ignore[no-untyped-def]
    assert decode_command(encode_command(command)) == command


def test_the_mark_is_typed() -> None:
    with pytest.raises(InvalidRequest):
        SetNodeDecommissioning(node_id=2, decommissioning="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        SetNodeDecommissioning(node_id=0, decommissioning=True)


def test_the_mark_survives_reregistration_and_snapshots_and_stops_placement() -> None:
    apply = _catalog()
    assert isinstance(apply(SetNodeDecommissioning(node_id=9, decommissioning=True)).error, UnknownNode)
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=True)).ok
    assert apply(SetNodeStatus(node_id=2, status=NodeStatus.DEAD)).ok
    assert apply(node(2)).ok  # restarts: still leaving
    info = apply.catalog.nodes[NodeId(2)]
    assert info.decommissioning and info.status is NodeStatus.ALIVE and not info.drained
    assert info.leads_nothing and apply.catalog.drained_nodes() == {2}
    assert [n.node_id for n in apply.catalog.placeable_nodes()] == [1, 3, 4]
    restored = Catalog.restore(apply.catalog.snapshot())
    assert restored.nodes == apply.catalog.nodes
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=False)).ok  # recommission
    assert not apply.catalog.nodes[NodeId(2)].decommissioning
    assert [n.node_id for n in apply.catalog.placeable_nodes()] == [1, 2, 3, 4]


def test_a_decommission_needs_somewhere_for_every_replica() -> None:
    apply = _catalog(3)
    assert apply(create("t", ((1, 2, 3),))).ok
    refused = apply(SetNodeDecommissioning(node_id=2, decommissioning=True))
    assert isinstance(refused.error, ClusterTooSmall) and "replication factor" in str(refused.error)
    assert not apply.catalog.nodes[NodeId(2)].decommissioning
    assert apply(node(4)).ok
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=True)).ok
    # Now only 1, 3, 4 stay: a second decommission would leave two nodes for RF 3.
    assert isinstance(apply(SetNodeDecommissioning(node_id=3, decommissioning=True)).error, ClusterTooSmall)


def test_no_replica_moves_onto_a_decommissioning_node() -> None:
    apply = _catalog()
    assert apply(create("t", ((1, 2), (2, 3)))).ok
    assert apply(SetNodeDecommissioning(node_id=4, decommissioning=True)).ok
    refused = apply(ReplaceReplica(topic="t", partition=0, old=2, new=4))
    assert isinstance(refused.error, InvalidReplicaAssignment)


def test_progress_walks_moving_then_leaving_then_done() -> None:
    apply = _catalog()
    assert apply(create("t", ((1, 2, 3), (2, 3, 4)))).ok
    catalog = apply.catalog
    members = _membership({1, 2, 3}, {4})
    assert decommission.progress(catalog, members, NodeId(2)).stage is None
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=True)).ok
    progress = decommission.progress(catalog, members, NodeId(2), "why")
    assert (progress.stage, progress.replicas, progress.metadata_member, progress.waiting_for) == (
        Stage.MOVING_REPLICAS, 2, "voter", "why")
    assert decommission.moves_waiting(catalog, {NodeId(2)}, 8, 0).startswith("no live node can take")
    assert decommission.moves_waiting(catalog, {NodeId(2)}, 0, 0).startswith("0 partitions are moving")
    assert decommission.moves_waiting(catalog, {NodeId(2)}, 8, 1) == ""
    assert apply(ReplaceReplica(topic="t", partition=0, old=2, new=4)).ok
    assert decommission.moves_in_flight(catalog) == 1 and decommission.moves_allowed(catalog) == 7
    assert decommission.replicas_held(catalog, NodeId(2)) == 2  # still keeps the leaving copy
    assert apply(ReplicaLeft(topic="t", partition=0, node=2)).ok
    assert apply(ReplaceReplica(topic="t", partition=1, old=2, new=1)).ok
    assert apply(ReplicaLeft(topic="t", partition=1, node=2)).ok
    progress = decommission.progress(catalog, members, NodeId(2), "why")
    assert (progress.stage, progress.replicas, progress.waiting_for) == (Stage.LEAVING_METADATA, 0, "why")
    assert decommission.progress(catalog, _membership({1, 3, 4}), NodeId(2)).stage is Stage.DONE


def _step(catalog: Catalog, membership: Membership, leader: int, leaving: set[int],
          matches: dict[int, int] | None = None) -> tuple[ConfChange | None, str]:
    matches = matches if matches is not None else {n: 100 for n in membership.members}
    return decommission.metadata_step(catalog, membership, NodeId(leader), matches, 100,
                                      {NodeId(n) for n in leaving})


def test_a_leaving_voter_gets_a_caught_up_learner_in_its_place_first() -> None:
    apply = _catalog(5)
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=True)).ok
    catalog = apply.catalog
    # Learners 4 and 5; 4 lags: 5 is promoted.
    change, why = _step(catalog, _membership({1, 2, 3}, {4, 5}), 1, {2}, {1: 100, 2: 100, 3: 100, 4: 30, 5: 100})
    assert change == ConfChange(ConfChangeOp.ADD_VOTER, NodeId(5)) and why == ""
    # Four voters now: 2 goes.
    change, _ = _step(catalog, _membership({1, 2, 3, 5}, {4}), 1, {2})
    assert change == ConfChange(ConfChangeOp.REMOVE, NodeId(2))
    # ... but never while it leads the group (its drain moves that leadership first).
    change, why = _step(catalog, _membership({1, 2, 3, 5}, {4}), 2, {2})
    assert change is None and "leads the metadata group" in why


def test_a_leaving_voter_waits_for_a_learner_that_catches_up() -> None:
    apply = _catalog(4)
    assert apply(SetNodeDecommissioning(node_id=2, decommissioning=True)).ok
    change, why = _step(apply.catalog, _membership({1, 2, 3}, {4}), 1, {2}, {1: 100, 2: 100, 3: 100, 4: 20})
    assert change is None and "no live, caught-up learner" in why
    apply(SetNodeStatus(node_id=4, status=NodeStatus.DEAD))  # a dead learner takes no vote either
    change, why = _step(apply.catalog, _membership({1, 2, 3}, {4}), 1, {2})
    assert change is None and why


def test_a_dead_voter_never_counts_and_no_removal_leaves_no_live_majority() -> None:
    # Review finding: voters {1,2,3}, node 3 dead, node 1 leaving. Counting node 3, the
    # step removed 1 and left {2,3}: no live majority, the metadata group stalled.
    apply = _catalog(4)
    assert apply(SetNodeDecommissioning(node_id=1, decommissioning=True)).ok
    assert apply(SetNodeStatus(node_id=3, status=NodeStatus.DEAD)).ok
    change, _ = _step(apply.catalog, _membership({1, 2, 3}, {4}), 2, {1})
    assert change == ConfChange(ConfChangeOp.ADD_VOTER, NodeId(4)), "the live learner is promoted first"
    change, why = _step(apply.catalog, _membership({1, 2, 3}), 2, {1})  # no learner: wait
    assert change is None and "no live" in why
    change, why = _step(apply.catalog, _membership({1, 2, 3, 4}), 2, {1})  # 2 live of 3 wanted
    assert change is None and "no live" in why
    assert apply(SetNodeStatus(node_id=3, status=NodeStatus.ALIVE)).ok
    change, why = _step(apply.catalog, _membership({1, 2, 3, 4}), 2, {1})
    assert change == ConfChange(ConfChangeOp.REMOVE, NodeId(1)), why


def test_a_small_cluster_keeps_every_staying_member_as_voter() -> None:
    apply = _catalog(3)
    assert apply(SetNodeDecommissioning(node_id=3, decommissioning=True)).ok  # no topic: nothing to place
    change, _ = _step(apply.catalog, _membership({1, 2, 3}), 1, {3})
    assert change == ConfChange(ConfChangeOp.REMOVE, NodeId(3))  # two stay, both vote


def test_a_leaving_learner_is_removed_at_once_and_non_members_are_skipped() -> None:
    apply = _catalog(5)
    assert apply(SetNodeDecommissioning(node_id=4, decommissioning=True)).ok
    assert apply(SetNodeDecommissioning(node_id=5, decommissioning=True)).ok
    change, _ = _step(apply.catalog, _membership({1, 2, 3}, {5}), 1, {4, 5})
    assert change == ConfChange(ConfChangeOp.REMOVE, NodeId(5))
    assert _step(apply.catalog, _membership({1, 2, 3}), 1, {4, 5}) == (None, "")
