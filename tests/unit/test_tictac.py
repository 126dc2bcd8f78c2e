"""The tictac tree (storage/tictac.py): build, compare root first, bounds, lengths."""

from __future__ import annotations

from storage.tictac import (
    FANOUT,
    LEAF_OFFSETS,
    Descent,
    LeafAccumulator,
    TicTacTree,
    compare_trees,
    element_hash,
    run_descent,
)


def tree_of(batches: list[tuple[int, bytes]], lo: int, hi: int) -> TicTacTree:
    leaves = LeafAccumulator(lo, hi)
    for base, data in batches:
        leaves.add(base, element_hash(base, data))
    return leaves.tree()


def log(records: int, per_batch: int = 100) -> list[tuple[int, bytes]]:
    return [(base, b"batch-%d" % base) for base in range(0, records, per_batch)]


def test_identical_trees_compare_with_one_root() -> None:
    # Goal: the cheap case costs one digest, whatever the size.
    batches = log(1_000_000)
    a, b = tree_of(batches, 0, 1_000_000), tree_of(batches, 0, 1_000_000)
    assert a.depth == 3 and len(a.levels[0]) == 245, "1 M offsets: 245 leaves of 4096, 16 branches, a root"
    result = compare_trees(a, b).comparison
    assert result.identical and result.nodes_compared == 1 and not result.truncated


def test_one_differing_batch_yields_exactly_its_range() -> None:
    batches = log(1_000_000)
    changed = [(base, data + b"!" if base == 500_000 else data) for base, data in batches]
    a, b = tree_of(batches, 0, 1_000_000), tree_of(changed, 0, 1_000_000)
    result = compare_trees(a, b).comparison
    leaf = 500_000 // LEAF_OFFSETS
    assert result.ranges == ((leaf * LEAF_OFFSETS, (leaf + 1) * LEAF_OFFSETS),)
    assert result.nodes_compared <= 1 + 3 * FANOUT, "root, then 16 per level below it"


def test_order_counts_a_batch_moved_to_another_offset_differs() -> None:
    a = tree_of([(0, b"x"), (10, b"y")], 0, 20)
    b = tree_of([(0, b"y"), (10, b"x")], 0, 20)
    assert a.root != b.root


def test_a_span_starting_mid_leaf_clips_its_first_and_last_ranges() -> None:
    batches = [(base, b"b%d" % base) for base in range(5000, 9000, 10)]
    a = tree_of(batches, 5000, 9000)
    b = tree_of([(base, d + b"?" if base == 5000 else d) for base, d in batches], 5000, 9000)
    assert compare_trees(a, b).comparison.ranges == ((5000, 8192),)
    b = tree_of([(base, d + b"?" if base == 8990 else d) for base, d in batches], 5000, 9000)
    assert compare_trees(a, b).comparison.ranges == ((8192, 9000),)


def test_a_comparison_stops_after_its_bound_and_says_so() -> None:
    batches = log(200 * LEAF_OFFSETS, per_batch=LEAF_OFFSETS)
    changed = [(base, data + b"!") for base, data in batches]
    a, b = tree_of(batches, 0, 200 * LEAF_OFFSETS), tree_of(changed, 0, 200 * LEAF_OFFSETS)
    result = compare_trees(a, b, leaves_max=5).comparison
    assert result.truncated and len(result.ranges) == 5
    assert result.ranges[0] == (0, LEAF_OFFSETS)


def test_different_lengths_compare_the_shorter_prefix_and_report_the_difference() -> None:
    batches = log(100_000)
    longer, shorter = tree_of(batches, 0, 100_000), tree_of([b for b in batches if b[0] < 50_000], 0, 50_000)
    compared = compare_trees(longer, shorter)
    assert compared.length_difference == -50_000
    assert compared.comparison.identical
    assert compared.comparison.hi == 49_152, "cut back to a leaf boundary: the partial leaf is not comparable"
    damaged = tree_of([(base, d + b"!" if base == 1000 else d) for base, d in batches if base < 50_000], 0, 50_000)
    assert compare_trees(longer, damaged).comparison.ranges == ((0, LEAF_OFFSETS),)


def test_a_descent_over_rpc_counts_what_it_asked_for() -> None:
    # Goal: the step machine the node drives over RPC asks only for differing branches.
    batches = log(300_000)
    a, b = tree_of(batches, 0, 300_000), tree_of([(x, d + b"!" if x == 0 else d) for x, d in batches], 0, 300_000)
    asked: list[tuple[int, list[int]]] = []

    def fetch(level: int, positions: list[int]) -> list[bytes]:
        asked.append((level, positions))
        return b.nodes(level, positions)

    result = run_descent(Descent(a), fetch)
    assert result.ranges == ((0, LEAF_OFFSETS),)
    assert asked[0] == (a.depth - 1, [0])
    assert all(positions[0] == 0 for _, positions in asked)


def test_an_empty_span_has_a_zero_root() -> None:
    empty = tree_of([], 7, 7)
    assert empty.root == bytes(16) and compare_trees(empty, tree_of([], 7, 7)).comparison.identical
