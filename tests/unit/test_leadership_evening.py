"""Evening out leaders per live node when preferred leaders cannot lead (multiraft/node/leadership.py)."""

from __future__ import annotations

from multiraft.node.leadership import Move, even_out


def test_an_overloaded_leader_hands_groups_to_the_least_loaded_candidates():
    # Goal: two survivors of three nodes, 6 partitions: 4 / 2 becomes 3 / 3 with one move.
    assert even_out(1, {1: 4, 2: 2}, [(10, [2]), (11, [2]), (12, [2])], limit=100) == [Move(10, 2)]
    # Three nodes: the excess goes to whoever leads fewest, one at a time.
    assert even_out(1, {1: 5, 2: 3, 3: 2}, [(10, [2, 3]), (11, [2, 3])], limit=100) == [Move(10, 3)]


def test_a_node_at_or_below_its_share_moves_nothing():
    assert even_out(1, {1: 3, 2: 3}, [(10, [2])], limit=100) == []
    assert even_out(1, {1: 4, 2: 3, 3: 3}, [(10, [2, 3])], limit=100) == [], "4 is the ceiling of 10 / 3"


def test_moves_go_only_where_they_narrow_the_gap_and_to_candidates():
    # Node 3 leads least but holds no in-sync copy of these groups: nothing goes there,
    # and a move to node 2 (already at the share) would only move the excess.
    assert even_out(1, {1: 5, 2: 4, 3: 0}, [(10, [2]), (11, [2])], limit=100) == []
    assert even_out(1, {1: 6, 2: 0}, [(10, [2]), (11, [2]), (12, [2]), (13, [2])], limit=2) == [
        Move(10, 2), Move(11, 2)], "bounded per round"
