"""Replica placement: balance, rack spread, leader spread, determinism, errors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multiraft.errors import InvalidPartitions, InvalidReplicationFactor
from multiraft.metadata.placement import PlacementNode, place_replicas, rack_alternating_order


def spread(counts: Counter, nodes: list[PlacementNode]) -> int:
    values = [counts.get(n.node_id, 0) for n in nodes]
    return max(values) - min(values)


def check_invariants(nodes, assignments, partitions, rf):
    assert len(assignments) == partitions
    ids = {n.node_id for n in nodes}
    for replicas in assignments:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= ids
    load = Counter(n for replicas in assignments for n in replicas)
    assert spread(load, nodes) <= 1


cluster_shapes = st.integers(1, 12).flatmap(
    lambda n: st.tuples(
        st.just([PlacementNode(i + 1) for i in range(n)]),
        st.integers(1, min(n, 5)),
        st.integers(1, 60),
        st.integers(0, 100),
    )
)


@settings(max_examples=300, deadline=None)
@given(cluster_shapes)
def test_balanced_replicas_and_leaders_without_racks(shape):
    # Goal: per node, replica counts and preferred-leader counts differ by at most one.
    nodes, rf, partitions, start = shape
    assignments = place_replicas(nodes, partitions, rf, start)
    check_invariants(nodes, assignments, partitions, rf)
    assert spread(Counter(r[0] for r in assignments), nodes) <= 1


def racked_nodes(racks: int, per_rack: int) -> list[PlacementNode]:
    return [
        PlacementNode(r * per_rack + k + 1, f"rack-{r}")
        for r in range(racks)
        for k in range(per_rack)
    ]


equal_racks = st.tuples(st.integers(2, 4), st.integers(1, 3)).flatmap(
    lambda shape: st.tuples(
        st.just(racked_nodes(*shape)),
        st.integers(1, shape[0]),
        st.integers(1, 60),
        st.integers(0, 100),
    )
)


@settings(max_examples=300, deadline=None)
@given(equal_racks)
def test_equal_racks_give_every_partition_distinct_racks(shape):
    # Goal: with racks of equal size and RF <= racks, no partition has two replicas
    # in one rack, and balance still holds.
    nodes, rf, partitions, start = shape
    assignments = place_replicas(nodes, partitions, rf, start)
    check_invariants(nodes, assignments, partitions, rf)
    rack = {n.node_id: n.rack for n in nodes}
    for replicas in assignments:
        assert len({rack[n] for n in replicas}) == rf


def test_unequal_racks_keep_balance_over_rack_spread():
    # Goal: when racks are lopsided, balance holds and racks spread as far as it allows.
    nodes = [PlacementNode(1, "a"), PlacementNode(2, "a"), PlacementNode(3, "a"),
             PlacementNode(4, "b")]  # fmt: skip
    assignments = place_replicas(nodes, 8, 2)
    check_invariants(nodes, assignments, 8, 2)
    assert sum(4 in replicas for replicas in assignments) == 4


def test_rack_alternating_order():
    # Goal: racks interleave, ids sorted within a rack, rackless nodes last.
    nodes = [PlacementNode(5, "b"), PlacementNode(1, "a"), PlacementNode(3, "a"),
             PlacementNode(2, "b"), PlacementNode(9)]  # fmt: skip
    assert [n.node_id for n in rack_alternating_order(nodes)] == [1, 2, 9, 3, 5]


def test_deterministic_regardless_of_input_order():
    # Goal: the same nodes and start give the same assignment; start rotates leaders.
    nodes = [PlacementNode(i, f"r{i % 3}") for i in range(1, 10)]
    first = place_replicas(nodes, 30, 3, start=4)
    assert place_replicas(list(reversed(nodes)), 30, 3, start=4) == first
    assert place_replicas(nodes, 1, 3, start=0)[0][0] != place_replicas(nodes, 1, 3, start=1)[0][0]


@pytest.mark.parametrize(
    ("nodes", "partitions", "rf", "error"),
    [
        (2, 1, 3, InvalidReplicationFactor),
        (0, 1, 1, InvalidReplicationFactor),
        (3, 1, 0, InvalidReplicationFactor),
        (3, 0, 1, InvalidPartitions),
        (3, 10_001, 1, InvalidPartitions),
    ],
)
def test_errors(nodes, partitions, rf, error):
    # Goal: impossible placements raise typed errors.
    with pytest.raises(error):
        place_replicas([PlacementNode(i + 1) for i in range(nodes)], partitions, rf)
