"""Mirror links and topics in the catalog, and a mirror partition's state (issue 24)."""

from __future__ import annotations

import pytest

from multiraft.errors import (
    InvalidRequest,
    MirrorLinkExists,
    MirrorLinkInUse,
    NotAMirror,
    TopicExists,
    UnknownMirrorLink,
)
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import RegisterNode, decode_command, encode_command
from multiraft.metadata.features import SUPPORTED_LEVEL, FinalizeFeatureLevel
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    DeleteMirrorLink,
    PromoteMirrorTopic,
    SetMirrorLinkState,
    pattern_matches,
)
from multiraft.state.mirror_meta import (
    MirrorPromote,
    MirrorSkips,
    decode_mirror_meta,
    encode_mirror_meta,
)
from multiraft.state.partition import PartitionState
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, NodeId, Offset, Term
from storage.batch import Record, encode_batch

LINK = CreateMirrorLink(name="dr", sources=("127.0.0.1:9000", "src.example:9001"), pattern="orders*",
                        priority="high", token="s3cret-token")
MIRROR = CreateMirrorTopic(name="orders", link="dr", replication_factor=1, config={"retention_ms": 1000},
                           assignments=((NodeId(1),), (NodeId(1),)), start_offsets=(0, 500))


def _catalog(*commands: object) -> Catalog:
    catalog = Catalog()
    for index, command in enumerate([RegisterNode(node_id=NodeId(1), raft_addr="a:1", http_addr="a:2"),
                                     *commands], start=1):
        result = catalog.apply(Index(index), decode_command(encode_command(command)))  # type: ignore[arg-type]
        assert result.ok, result.error
    return catalog


def _finalized(catalog: Catalog, level: int = SUPPORTED_LEVEL) -> Catalog:
    """`catalog` finalized at feature `level` (its next entry): a cluster of this build's, by default."""
    assert catalog.apply(Index(catalog.applied_index + 1), FinalizeFeatureLevel(level=level)).ok
    return catalog


def test_commands_round_trip_and_the_token_is_never_in_a_repr() -> None:
    for command in (LINK, MIRROR, SetMirrorLinkState(name="dr", state="paused"), DeleteMirrorLink(name="dr"),
                    PromoteMirrorTopic(name="orders")):
        assert decode_command(encode_command(command)) == command  # type: ignore[arg-type]
    assert "s3cret" not in repr(LINK)
    catalog = _catalog(LINK)
    assert "s3cret" not in repr(catalog.mirror_links["dr"])
    assert catalog.mirror_links["dr"].describe()["credentials"] is True


@pytest.mark.parametrize("bad", [
    {"sources": ()}, {"sources": ("nohost",)}, {"sources": ("h:0",)}, {"sources": ("h:70000",)},
    {"sources": ("h:1",) * 2}, {"sources": tuple(f"h:{p}" for p in range(1, 18))},
    {"pattern": "a b"}, {"pattern": "[ab]"}, {"pattern": ""}, {"priority": "urgent"},
    {"token": "has space"}, {"token": "x" * 513}, {"name": "no/slash"},
])
def test_link_shapes_are_bounded(bad: dict[str, object]) -> None:
    arguments: dict[str, object] = {"name": "dr", "sources": ("h:1",), "pattern": "t", **bad}
    with pytest.raises(InvalidRequest):
        CreateMirrorLink(**arguments)  # type: ignore[arg-type]


def test_pattern_matching_is_a_glob_over_topic_names() -> None:
    assert pattern_matches("orders*", "orders") and pattern_matches("orders*", "orders.eu")
    assert pattern_matches("o?ders", "orders") and not pattern_matches("orders", "orders2")
    assert pattern_matches("*", "anything") and not pattern_matches("a.b", "axb")


def test_links_and_mirror_topics_in_the_catalog() -> None:
    catalog = _catalog(LINK, MIRROR)
    topic = catalog.topic("orders")
    assert topic.is_mirror and [p.start_offset for p in topic.partitions] == [0, 500]
    with pytest.raises(MirrorLinkExists):
        catalog.validate(LINK)
    with pytest.raises(TopicExists):
        catalog.validate(MIRROR)
    with pytest.raises(UnknownMirrorLink):
        catalog.validate(SetMirrorLinkState(name="nope", state="paused"))
    with pytest.raises(MirrorLinkInUse):
        catalog.validate(DeleteMirrorLink(name="dr"))
    applied = catalog.apply(Index(10), SetMirrorLinkState(name="dr", state="paused"))
    assert applied.ok and catalog.mirror_links["dr"].state == "paused"
    assert catalog.apply(Index(11), PromoteMirrorTopic(name="orders")).ok
    assert not catalog.topic("orders").is_mirror and catalog.topic("orders").mirror_link == "dr"
    with pytest.raises(NotAMirror):
        catalog.validate(PromoteMirrorTopic(name="orders"))
    assert catalog.apply(Index(12), DeleteMirrorLink(name="dr")).ok  # promoted topics do not hold it


def test_snapshot_round_trip_and_older_snapshots_still_decode() -> None:
    catalog = _catalog(LINK, MIRROR)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.mirror_links == catalog.mirror_links and restored.topics == catalog.topics
    assert restored.mirror_links["dr"].token == "s3cret-token"
    plain = _catalog()
    assert b"mirror" not in plain.snapshot()  # a catalog without mirrors snapshots as before them
    assert Catalog.restore(plain.snapshot()).mirror_links == {}


def _data(index: int, count: int, producer_id: int = 7, sequence: int = 0) -> Entry:
    batch = encode_batch([Record(None, b"v%d" % i) for i in range(count)], first_timestamp_ms=1, producer_id=producer_id,
                         producer_epoch=0, base_sequence=sequence)
    return Entry(Index(index), Term(2), EntryKind.DATA, batch)


def test_a_mirror_partition_applies_source_batches_at_their_offsets_and_skips_what_the_source_skipped() -> None:
    state = PartitionState(topic="orders", partition=1, applied_index=Index(1), next_offset=Offset(500), mirror=True)
    skips = encode_mirror_meta(MirrorSkips(((503, 2),)))
    assert decode_mirror_meta(skips) == MirrorSkips(((503, 2),))
    assert state.apply(Entry(Index(2), Term(2), EntryKind.META, skips)).ok
    # An out-of-order sequence would be refused by a producer table: a mirror takes it as the source did.
    results = [state.apply(_data(3, 3, sequence=40)), state.apply(_data(4, 2, sequence=0))]
    assert [(r.base_offset, r.ok) for r in results] == [(500, True), (503, True)]
    assert state.skipped_ranges == [(503, 2)] and state.high_watermark == 505
    again = PartitionState.restore(state.snapshot())
    assert again.mirror and again.next_offset == 505
    promote = Entry(Index(5), Term(2), EntryKind.META, encode_mirror_meta(MirrorPromote()))
    assert state.apply(promote).ok and not state.mirror
    assert not state.apply(Entry(Index(6), Term(2), EntryKind.META, encode_mirror_meta(MirrorPromote()))).ok
    assert not PartitionState.restore(state.snapshot()).mirror
