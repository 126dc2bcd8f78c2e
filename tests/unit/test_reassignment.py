"""The partition leader's next membership step toward the catalog's replicas (multiraft/node/reassignment.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from multiraft.metadata.catalog_records import PartitionInfo
from multiraft.metadata.placement import PlacementNode, replacement_for
from multiraft.node.learners import CATCH_UP_SLACK_ENTRIES, caught_up
from multiraft.node.reassignment import (
    FULL_SCAN_INTERVAL_S,
    MoveScan,
    Step,
    StepKind,
    move_round,
    next_step,
)
from multiraft.node.routing import LedPartition
from raftlog.messages import ConfChangeOp, Membership
from raftlog.types import GroupId, NodeId


def step(me=1, voters=(1, 2, 3), learners=(), listed=(1, 2, 3), leaving=(), matches=None, commit=100, in_sync=None):
    matches = matches if matches is not None else {n: 100 for n in (*voters, *learners)}
    return next_step(me, set(voters), set(learners), listed, leaving, matches, commit,
                     set(in_sync if in_sync is not None else voters))


def test_a_settled_group_has_nothing_to_do():
    assert step() is None


def test_a_move_adds_a_learner_promotes_it_once_caught_up_then_removes_and_reports():
    # Goal: the order etcd's learners follow: add (no vote), promote when caught up,
    # then remove the dead voter, then tell the catalog the old copy may go.
    listed, leaving = (1, 4, 3), (2,)
    assert step(listed=listed, leaving=leaving) == Step(StepKind.ADD_LEARNER, 4)
    catching_up = step(voters=(1, 2, 3), learners=(4,), listed=listed, leaving=leaving,
                       matches={1: 100, 3: 100, 4: 70})
    assert catching_up is None, "no removal while a listed copy is still a learner"
    assert step(voters=(1, 2, 3), learners=(4,), listed=listed, leaving=leaving,
                matches={1: 100, 3: 100, 4: 100}) == Step(StepKind.PROMOTE, 4)
    assert step(voters=(1, 2, 3, 4), listed=listed, leaving=leaving) == Step(StepKind.REMOVE, 2)
    assert step(voters=(1, 3, 4), listed=listed, leaving=leaving) == Step(StepKind.REPORT_LEFT, 2)
    assert step(voters=(1, 3, 4), listed=listed) is None


def test_a_stale_catalog_never_removes_what_a_move_needs():
    # Goal: a leader whose catalog has not seen the move yet (it lists the old node)
    # adds that node back as a learner at worst, and removes nothing while it is not a voter.
    assert step(voters=(1, 3, 4), listed=(1, 2, 3)) == Step(StepKind.ADD_LEARNER, 2)
    assert step(voters=(1, 3, 4), learners=(2,), listed=(1, 2, 3), matches={1: 100, 3: 100, 4: 100, 2: 0}) is None


def test_an_unlisted_leader_hands_over_before_it_could_be_removed():
    # Goal: a leader cannot remove itself: it transfers to an in-sync listed voter first,
    # and waits when none is in sync.
    assert step(me=2, voters=(1, 2, 3, 4), listed=(1, 4, 3), leaving=(2,)) == Step(StepKind.TRANSFER, 1)
    assert step(me=2, voters=(1, 2, 3, 4), listed=(1, 4, 3), leaving=(2,), in_sync=(2,)) is None


def test_replacement_prefers_the_least_loaded_node_then_a_new_rack():
    nodes = [PlacementNode(1, "a"), PlacementNode(2, "b"), PlacementNode(3, "a"), PlacementNode(4, "c"),
             PlacementNode(5, "b")]
    # Partition on 1 (a) and 2 (b) lost its copy on 9: 3, 4 and 5 are candidates.
    assert replacement_for(nodes, [1, 2], [1, 2, 9], {3: 5, 4: 5, 5: 4}) == 5, "fewest replicas first"
    assert replacement_for(nodes, [1, 2], [1, 2, 9], {3: 5, 4: 5, 5: 5}) == 4, "then a rack not used"
    assert replacement_for(nodes, [1, 2], [1, 2, 9], {}) == 4
    assert replacement_for(nodes[:2], [1, 2], [1, 2, 9], {}) is None, "every live node holds a copy"


# ---------------------------------------------------------------- the move loop (MoveScan, move_round)

def test_the_move_loop_walks_when_the_catalog_or_a_leadership_changed_else_only_the_unsettled():
    # Goal: a leadership gained (the registry's led_version moves) is looked at the next
    # round, not at the 10 s full walk: a decommissioning node hands its groups over while
    # their moves start, and its successor must take each move up at once.
    scan = MoveScan()
    assert scan.scope(0.0, catalog_index=5, led_version=1) == (True, frozenset())
    assert scan.scope(0.25, 5, 1) == (False, frozenset()), "nothing changed, nothing unsettled: nothing"
    scan.unsettled = frozenset({GroupId(3)})
    assert scan.scope(0.5, 5, 1) == (False, {GroupId(3)}), "only the group left unsettled"
    assert scan.scope(0.75, 5, 2) == (True, frozenset()), "a leadership here changed: everything"
    assert scan.scope(1.0, 6, 2) == (True, frozenset()), "the catalog changed: everything"
    assert scan.scope(1.0 + FULL_SCAN_INTERVAL_S, 6, 2) == (True, frozenset()), "the full walk is due"
    t = 2.0 + FULL_SCAN_INTERVAL_S
    assert scan.scope(t, 6, 3, moving=False) == (False, {GroupId(3)}), \
        "no copy leaving anywhere: a leadership change alone walks nothing (elections after a kill)"
    assert scan.scope(t, 6, 3, moving=True) == (False, {GroupId(3)}), "that change counts as seen"
    assert scan.scope(t, 6, 4, moving=True) == (True, frozenset()), "a move under way: it walks"
    assert scan.scope(t, 7, 5, moving=False) == (True, frozenset()), "the catalog changed: everything"


def test_the_move_loop_knows_once_per_catalog_index_whether_a_copy_is_leaving():
    scan = MoveScan()
    still = SimpleNamespace(leaving=())
    catalog = SimpleNamespace(topics={"a": SimpleNamespace(partitions=(still, SimpleNamespace(leaving=(2,))))})
    assert scan.catalog_moving(catalog, 5)
    catalog.topics["a"].partitions = (still,)
    assert scan.catalog_moving(catalog, 5), "same index: the answer kept"
    assert not scan.catalog_moving(catalog, 6)


@dataclass
class _Core:
    membership: Membership
    commit_index: int = 100

    def progress(self, node):
        return SimpleNamespace(match=100)

    def in_sync_replicas(self):
        return set(self.membership.voters)


@dataclass
class _Runtime:
    core: _Core
    changes: list = field(default_factory=list)

    async def propose_membership(self, change):
        self.changes.append((change.op, change.node_id))
        self.core.membership = self.core.membership.apply(change)


class _Node:
    """A node leading one group whose catalog moved its replica from node 2 to node 4."""

    def __init__(self, voters, learners):
        self.id = NodeId(1)
        self.runtime = _Runtime(_Core(Membership(voters=frozenset(voters), learners=frozenset(learners))))
        self.info = PartitionInfo(partition=0, group_id=GroupId(7), replicas=(NodeId(1), NodeId(4), NodeId(3)),
                                  leaving=(NodeId(2),))
        self.registry = SimpleNamespace(groups={GroupId(7): self.runtime}, led_version=1)
        self.catalog = SimpleNamespace(topics_index=5, catalog=SimpleNamespace(
            topics={"t": SimpleNamespace(partitions=(self.info,))}))
        self.reported: list = []

    def led_partitions(self):
        return [LedPartition(GroupId(7), self.runtime, "t", self.info)]

    async def propose_metadata(self, command):
        self.reported.append(command.node)
        self.info = replace(self.info, leaving=())
        self.catalog.topics_index += 1


def test_a_step_that_went_through_is_followed_by_the_groups_next_ones_in_the_same_round():
    # Goal: a caught-up learner is promoted, the old copy removed and the catalog told in
    # one round (they took a round each, a second apart), in etcd's add-before-remove order.
    node = _Node(voters=(1, 2, 3), learners=(4,))
    stepped = asyncio.run(move_round(node, node.propose_metadata, _Quiet(), MoveScan(), 0.0))
    assert stepped == 1
    assert node.runtime.changes == [(ConfChangeOp.ADD_VOTER, 4), (ConfChangeOp.REMOVE, 2)]
    assert node.reported == [2]


def test_a_copy_still_catching_up_is_rechecked_each_round_without_a_full_walk():
    # Goal: a group with a learner behind stays in the round's unsettled set (looked at each
    # round, alone), and nothing is removed meanwhile.
    node = _Node(voters=(1, 2, 3), learners=(4,))
    node.runtime.core.commit_index = 200  # the learner's match (100) is behind
    scan = MoveScan()
    assert asyncio.run(move_round(node, node.propose_metadata, _Quiet(), scan, 0.0)) == 0
    assert scan.unsettled == {GroupId(7)} and node.runtime.changes == []
    node.runtime.core.commit_index = 100  # caught up
    assert asyncio.run(move_round(node, node.propose_metadata, _Quiet(), scan, 0.25)) == 1
    assert node.reported == [2]


class _Quiet:
    def info(self, *args, **kwargs):
        pass


def test_a_learner_a_few_entries_behind_the_commit_is_promoted_one_further_is_not():
    # Goal: under steady writes the commit moves with each append the voters acknowledge and
    # a learner's acknowledgement comes a moment later; requiring match == commit refused it
    # round after round. Within CATCH_UP_SLACK_ENTRIES it is caught up; beyond, it waits.
    listed, leaving, slack = (1, 4, 3), (2,), CATCH_UP_SLACK_ENTRIES
    assert caught_up(100 - slack, 100) and not caught_up(100 - slack - 1, 100) and caught_up(0, 0)
    assert step(voters=(1, 2, 3), learners=(4,), listed=listed, leaving=leaving,
                matches={1: 100, 3: 100, 4: 100 - slack}) == Step(StepKind.PROMOTE, 4)
    assert step(voters=(1, 2, 3), learners=(4,), listed=listed, leaving=leaving,
                matches={1: 100, 3: 100, 4: 99 - slack}) is None
