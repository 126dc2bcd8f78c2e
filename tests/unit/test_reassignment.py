"""The partition leader's next membership step toward the catalog's replicas (multiraft/node/reassignment.py)."""

from __future__ import annotations

from multiraft.metadata.placement import PlacementNode, replacement_for
from multiraft.node.reassignment import Step, StepKind, next_step


def step(me=1, voters=(1, 2, 3), learners=(), listed=(1, 2, 3), leaving=(), matches=None, commit=10, in_sync=None):
    matches = matches if matches is not None else {n: 10 for n in (*voters, *learners)}
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
                       matches={1: 10, 3: 10, 4: 7})
    assert catching_up is None, "no removal while a listed copy is still a learner"
    assert step(voters=(1, 2, 3), learners=(4,), listed=listed, leaving=leaving,
                matches={1: 10, 3: 10, 4: 10}) == Step(StepKind.PROMOTE, 4)
    assert step(voters=(1, 2, 3, 4), listed=listed, leaving=leaving) == Step(StepKind.REMOVE, 2)
    assert step(voters=(1, 3, 4), listed=listed, leaving=leaving) == Step(StepKind.REPORT_LEFT, 2)
    assert step(voters=(1, 3, 4), listed=listed) is None


def test_a_stale_catalog_never_removes_what_a_move_needs():
    # Goal: a leader whose catalog has not seen the move yet (it lists the old node)
    # adds that node back as a learner at worst, and removes nothing while it is not a voter.
    assert step(voters=(1, 3, 4), listed=(1, 2, 3)) == Step(StepKind.ADD_LEARNER, 2)
    assert step(voters=(1, 3, 4), learners=(2,), listed=(1, 2, 3), matches={1: 10, 3: 10, 4: 10, 2: 0}) is None


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
