"""Goal: the pure parts of the full sync between clusters (docs/mirror.md, "Full sync"):
the resync command in the catalog (a new incarnation, once, never of a promoted topic or a
moving partition), a link's verify interval through commands and snapshots, the span a
source serves a tree over, the nodes it answers above a tree's root, and what a link's
verifies add up to on /metrics."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from multiraft.errors import InvalidRequest, NotAMirror, OffsetOutOfRange
from multiraft.metadata.catalog import Catalog, groups_for_node
from multiraft.metadata.commands import RegisterNode, ReplaceReplica, decode_command, encode_command
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    PromoteMirrorTopic,
    ResyncMirrorPartition,
)
from multiraft.node.mirror_trees import check_positions, level_nodes, served_span
from multiraft.node.mirror_verify import VERDICTS, LinkVerifyCounts, MirrorVerdict, MirrorVerifier
from multiraft.node.scrub_trees import SPAN_LEAVES_MAX
from raftlog.errors import MembershipChangeInProgress
from raftlog.types import Index, NodeId
from storage.tictac import LEAF_OFFSETS, ZERO, LeafAccumulator, element_hash
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog


def _resync(group_id: int, start: int = 40) -> ResyncMirrorPartition:
    return ResyncMirrorPartition(name="orders", partition=1, group_id=group_id, start_offset=start)


def test_a_resync_starts_a_new_incarnation_of_the_partition_once() -> None:
    catalog = _catalog(LINK, MIRROR)
    old = catalog.topic("orders").partitions[1]
    next_id = catalog.next_group_id
    command = _resync(old.group_id)
    assert decode_command(encode_command(command)) == command
    assert catalog.apply(Index(10), command).ok
    fresh = catalog.topic("orders").partitions[1]
    assert (fresh.group_id, fresh.start_offset, fresh.replicas) == (next_id, 40, old.replicas)
    assert catalog.next_group_id == next_id + 1
    assert catalog.topic("orders").partitions[0] == _catalog(LINK, MIRROR).topic("orders").partitions[0]
    hosted = groups_for_node(catalog, NodeId(1))
    assert fresh.group_id in hosted and old.group_id not in hosted  # every host drops the old, starts the new
    # A second verify that saw the same old incarnation changes nothing.
    assert catalog.apply(Index(11), _resync(old.group_id, 99)).ok
    assert catalog.topic("orders").partitions[1] == fresh and catalog.next_group_id == next_id + 1
    restored = Catalog.restore(catalog.snapshot())
    assert restored.topics == catalog.topics and restored.next_group_id == catalog.next_group_id


def test_a_resync_is_refused_for_a_promoted_topic_and_a_moving_partition() -> None:
    catalog = _catalog(LINK, MIRROR)
    group_id = catalog.topic("orders").partitions[1].group_id
    moving = _catalog(LINK, MIRROR)
    assert moving.apply(Index(10), RegisterNode(node_id=NodeId(2), raft_addr="b:1", http_addr="b:2")).ok
    assert moving.apply(Index(11), ReplaceReplica(topic="orders", partition=1, old=NodeId(1), new=NodeId(2))).ok
    with pytest.raises(MembershipChangeInProgress):
        moving.validate(_resync(group_id))
    assert catalog.apply(Index(10), PromoteMirrorTopic(name="orders")).ok
    with pytest.raises(NotAMirror):
        catalog.validate(_resync(group_id))


@pytest.mark.parametrize("bad", [{"partition": -1}, {"group_id": 0}, {"start_offset": -1},
                                 {"start_offset": 2**63}, {"name": "a b"}, {"partition": True}])
def test_resync_shapes_are_bounded(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        ResyncMirrorPartition(**{"name": "t", "partition": 0, "group_id": 5, "start_offset": 0, **bad})  # type: ignore[arg-type]


def test_a_links_verify_interval_is_bounded_shown_and_kept_in_snapshots() -> None:
    with pytest.raises(InvalidRequest):
        dataclasses.replace(LINK, verify_interval_s=1)
    with pytest.raises(InvalidRequest):
        dataclasses.replace(LINK, verify_interval_s=True)  # type: ignore[arg-type]
    scheduled = dataclasses.replace(LINK, verify_interval_s=3600)
    assert decode_command(encode_command(scheduled)) == scheduled
    catalog = _catalog(scheduled, MIRROR)
    assert catalog.mirror_links["dr"].describe()["verify_interval_s"] == 3600
    assert Catalog.restore(catalog.snapshot()).mirror_links == catalog.mirror_links
    # A link without one snapshots as before (six elements) and reads back without one.
    plain = _catalog(LINK)
    assert Catalog.restore(plain.snapshot()).mirror_links["dr"].verify_interval_s is None
    assert CreateMirrorLink(name="x", sources=("h:1",), pattern="t").verify_interval_s is None


@pytest.mark.parametrize(("asked", "holds", "served"), [
    ((0, 10_000), (0, 10_000), (0, 10_000)),  # all of it
    ((0, 10_000), (500, 8_000), (500, 8_000)),  # cut to the replica's log start and high watermark
    ((700, 300), (0, 10_000), (700, 700)),  # hi below lo: an empty span at lo
    ((0, 2**63 - 1), (0, 10**12), (0, SPAN_LEAVES_MAX * LEAF_OFFSETS)),  # at most SPAN_LEAVES_MAX leaves
    ((5000, 2**63 - 1), (0, 10**12), (5000, (1 + SPAN_LEAVES_MAX) * LEAF_OFFSETS)),  # from lo's own leaf
    ((10_000, 20_000), (0, 10_000), (10_000, 10_000)),  # at the high watermark: empty
])
def test_the_span_a_source_serves(asked: tuple[int, int], holds: tuple[int, int], served: tuple[int, int]) -> None:
    assert served_span(*asked, *holds) == served


def test_a_span_past_the_high_watermark_is_out_of_range() -> None:
    with pytest.raises(OffsetOutOfRange) as raised:
        served_span(10_001, 20_000, 5, 10_000)
    assert (raised.value.log_start_offset, raised.value.high_watermark) == (5, 10_000)


def test_levels_above_the_root_read_as_the_root() -> None:
    leaves = LeafAccumulator(0, 40 * LEAF_OFFSETS)
    for leaf in range(40):
        leaves.add(leaf * LEAF_OFFSETS, element_hash(leaf * LEAF_OFFSETS, b"batch %d" % leaf))
    tree = leaves.tree()
    assert tree.depth == 3
    assert level_nodes(tree, 1, [0, 2, 3]) == [tree.levels[1][0], tree.levels[1][2], ZERO]
    assert level_nodes(tree, 3, [0, 1]) == [tree.root, ZERO]
    assert level_nodes(tree, 63, [0]) == [tree.root]


@pytest.mark.parametrize("bad", [[], [-1], [True], ["1"], list(range(257)), None, [2**63]])
def test_positions_are_bounded(bad: object) -> None:
    with pytest.raises(InvalidRequest):
        check_positions(bad)


def test_a_links_verify_counts_add_up_its_verdicts_and_forget_a_deleted_link() -> None:
    # Goal: what /metrics shows of the full sync (multiraft/http/metrics.py) adds up each
    # verdict a leader reached, by link and verdict only; a link gone from the catalog is
    # forgotten, so the series stay bounded by the links there are.
    def verdict(status: str, **figures: object) -> MirrorVerdict:
        return MirrorVerdict(topic="orders", partition=0, status=status, leader=1, lo=0, hi=10, high_watermark=10,
                             **figures)  # type: ignore[arg-type]

    counts = LinkVerifyCounts()
    counts.record(verdict("identical", nodes_compared=1, spans=1, bytes_hashed=100, seconds=0.02))
    counts.record(verdict("different", ranges=((0, 4096), (8192, 9000)), nodes_compared=5, spans=1,
                          bytes_hashed=200, repair="resync_started", seconds=3.0))
    counts.record(verdict("unreachable", seconds=0.0))
    assert set(counts.verifies) == set(VERDICTS)
    assert counts.verifies == {**dict.fromkeys(VERDICTS, 0), "identical": 1, "different": 1, "unreachable": 1}
    assert (counts.differing_ranges, counts.digests_fetched, counts.spans, counts.bytes_hashed,
            counts.resyncs_started) == (2, 6, 2, 300, 1)
    buckets = dict(counts.seconds.cumulative())
    assert (buckets["0.01"], buckets["0.05"], buckets["5.0"], buckets["+Inf"]) == (1, 2, 3, 3)
    assert counts.seconds.total == pytest.approx(3.02)

    holder = SimpleNamespace(catalog=SimpleNamespace(mirror_links={"dr": object()}))
    verifier = MirrorVerifier(None, holder, None, None, None, None, None)  # type: ignore[arg-type]
    verifier._counts = {"dr": counts, "gone": LinkVerifyCounts()}
    assert list(verifier.counts()) == ["dr"]
