"""Goal: a mirror topic keeps its source's partition count until promoted (a partition
added would pull a source partition that does not exist), and only the partitions a
mirror was made with start in mirror mode: one added after the promotion is plain,
while one of the first ones, created late on a node, still starts as the others did.
"""

from __future__ import annotations

import pytest

from multiraft.errors import MirrorPartitionsFixed
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import CreatePartitions, CreateTopic
from multiraft.metadata.mirror_commands import PromoteMirrorTopic
from multiraft.node.mirror_bootstrap import mirror_start
from raftlog.types import Index, NodeId
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog

GROW = CreatePartitions(name="orders", count=3, assignments=((NodeId(1),),))


def test_partitions_are_not_added_to_a_mirror_until_it_is_promoted() -> None:
    catalog = _catalog(LINK, MIRROR)
    with pytest.raises(MirrorPartitionsFixed) as refused:
        catalog.validate(GROW)
    assert refused.value.http_status == 409 and refused.value.code == "MIRROR_PARTITIONS_FIXED"
    assert not catalog.apply(Index(10), GROW).ok  # refused on apply too
    assert len(catalog.topic("orders").partitions) == 2
    assert catalog.apply(Index(11), PromoteMirrorTopic(name="orders")).ok
    catalog.validate(GROW)
    assert catalog.apply(Index(12), GROW).ok


def test_only_the_partitions_the_mirror_was_made_with_start_in_mirror_mode() -> None:
    catalog = _catalog(LINK, MIRROR, PromoteMirrorTopic(name="orders"), GROW)
    topic = catalog.topic("orders")
    assert mirror_start(topic, 0) == ("orders", 0, 0, 1)
    assert mirror_start(topic, 1) == ("orders", 1, 500, 1)  # promoted: a late replica starts as the others did
    assert mirror_start(topic, 2) is None  # added after the promotion: a plain partition
    plain = _catalog(CreateTopic(name="plain", partitions=1, replication_factor=1, config={},
                                 assignments=((NodeId(1),),)))
    assert mirror_start(plain.topic("plain"), 0) is None


def test_the_count_a_mirror_was_made_with_survives_a_snapshot() -> None:
    grown = _catalog(LINK, MIRROR, PromoteMirrorTopic(name="orders"), GROW)
    restored = Catalog.restore(grown.snapshot())
    assert restored.topics == grown.topics and restored.topic("orders").mirror_partitions == 2
    made = _catalog(LINK, MIRROR)
    assert b"mirror_partitions" not in made.snapshot()  # written only when it differs from the count
    assert Catalog.restore(made.snapshot()).topic("orders").mirror_partitions == 2
