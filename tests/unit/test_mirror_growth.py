"""Goal: a mirror topic keeps its source's partition count until promoted, except to follow
its source: partitions added by hand are refused (one would pull a source partition that
does not exist), and `GrowMirrorTopic`, which discovery proposes when the source's count
grows, adds partitions in mirror mode, checked the same on every replica and refused
whole otherwise. Only the partitions a mirror was made or grown with start in mirror mode:
one added after the promotion is plain, while one of the mirror ones, created late on a
node, still starts as the others did. Discovery trusts no count the source lists.
"""

from __future__ import annotations

import json

import pytest

from multiraft.consumer_groups import JoinGroup, Subscription, encode_group_command
from multiraft.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    MirrorPartitionsFixed,
    NotAMirror,
    ResourceExhausted,
    SnapshotFormatError,
    UnknownMirrorLink,
    UnknownTopic,
)
from multiraft.metadata.catalog import ID_MAX, Catalog, groups_for_node
from multiraft.metadata.commands import (
    PARTITIONS_MAX,
    CreatePartitions,
    CreateTopic,
    RegisterNode,
    decode_command,
    encode_command,
)
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    GrowMirrorTopic,
    PromoteMirrorTopic,
    ResyncMirrorPartition,
)
from multiraft.node.mirror_bootstrap import mirror_start
from multiraft.node.mirror_follow import listed_growth
from raftlog.types import GroupId, Index, NodeId
from tests.unit.test_group_machine import Log
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog, _finalized

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


@pytest.mark.parametrize("commands", [(), (PromoteMirrorTopic(name="orders"),)])
def test_a_snapshot_row_of_a_mirror_not_promoted_with_plain_partitions_is_refused(commands: tuple[object, ...]) -> None:
    # No command writes one (partitions come by hand only after the promotion), and applying a
    # growth to one would stop every replica of group 0: refused as it is read, not applied later.
    document = json.loads(_catalog(LINK, MIRROR, *commands).snapshot())
    (row,) = document["topics"]
    row["mirror_partitions"] = 1  # of 2
    restored = json.dumps(document).encode()
    if commands:  # promoted: the shape a growth after the promotion writes
        assert Catalog.restore(restored).topic("orders").mirror_partitions == 1
    else:
        with pytest.raises(SnapshotFormatError, match="not promoted"):
            Catalog.restore(restored)


# The source's `orders` grew from 2 to 4 partitions; partition 2's log starts at 40 (retention).
FOLLOW = GrowMirrorTopic(name="orders", link="dr", count=4, assignments=((NodeId(1),), (NodeId(1),)),
                         start_offsets=(40, 0))
OTHER_LINK = CreateMirrorLink(name="dr2", sources=("127.0.0.1:9100",), pattern="*")
PLAIN = CreateTopic(name="plain", partitions=2, replication_factor=1, config={},
                    assignments=((NodeId(1),), (NodeId(1),)))


def test_a_mirror_follows_its_source_partition_increase_in_mirror_mode() -> None:
    catalog = _catalog(LINK, MIRROR, FOLLOW)  # every command through the codec, as a replica applies it
    topic = catalog.topic("orders")
    assert topic.is_mirror and topic.mirror_partitions == 4 and catalog.next_group_id == 5
    assert [(p.partition, p.group_id, p.start_offset) for p in topic.partitions] == [
        (0, 1, 0), (1, 2, 500), (2, 3, 40), (3, 4, 0)]
    assert [mirror_start(topic, p) for p in (2, 3)] == [("orders", 2, 40, 1), ("orders", 3, 0, 1)]
    assert set(groups_for_node(catalog, NodeId(1))) == {GroupId(g) for g in (1, 2, 3, 4)}
    # The same growth proposed again (two metadata leaders around a change): refused, grown once.
    again = catalog.apply(Index(10), FOLLOW)
    assert isinstance(again.error, InvalidPartitions) and len(catalog.topic("orders").partitions) == 4
    # Still no partitions by hand; after the promotion they are plain, after the grown ones, and a
    # replica of a grown partition created late (on a node that learns the catalog now) still
    # starts from the start point its peers started from.
    with pytest.raises(MirrorPartitionsFixed):
        catalog.validate(CreatePartitions(name="orders", count=5, assignments=((NodeId(1),),)))
    assert catalog.apply(Index(11), PromoteMirrorTopic(name="orders")).ok
    assert catalog.apply(Index(12), CreatePartitions(name="orders", count=5, assignments=((NodeId(1),),))).ok
    late = Catalog.restore(catalog.snapshot()).topic("orders")
    assert late.mirror_partitions == 4
    assert mirror_start(late, 3) == ("orders", 3, 0, 1) and mirror_start(late, 4) is None


@pytest.mark.parametrize(("before", "command", "error"), [
    ((), GrowMirrorTopic(name="orders", link="nope", count=4, assignments=FOLLOW.assignments,
                         start_offsets=(0, 0)), UnknownMirrorLink),
    ((), GrowMirrorTopic(name="nope", link="dr", count=4, assignments=FOLLOW.assignments,
                         start_offsets=(0, 0)), UnknownTopic),
    ((OTHER_LINK,), GrowMirrorTopic(name="orders", link="dr2", count=4, assignments=FOLLOW.assignments,
                                    start_offsets=(0, 0)), NotAMirror),  # another link's mirror
    ((PLAIN,), GrowMirrorTopic(name="plain", link="dr", count=4, assignments=FOLLOW.assignments,
                               start_offsets=(0, 0)), NotAMirror),
    ((PromoteMirrorTopic(name="orders"),), FOLLOW, NotAMirror),
    ((), GrowMirrorTopic(name="orders", link="dr", count=2, assignments=((NodeId(1),),), start_offsets=(0,)),
     InvalidPartitions),  # no growth
    ((), GrowMirrorTopic(name="orders", link="dr", count=5, assignments=FOLLOW.assignments, start_offsets=(0, 0)),
     InvalidReplicaAssignment),  # three new partitions, two replica lists
    ((), GrowMirrorTopic(name="orders", link="dr", count=4, assignments=((NodeId(1), NodeId(2)),) * 2,
                         start_offsets=(0, 0)), InvalidReplicaAssignment),  # not the mirror's replication factor
    ((), GrowMirrorTopic(name="orders", link="dr", count=4, assignments=((NodeId(9),),) * 2, start_offsets=(0, 0)),
     InvalidReplicaAssignment),  # a node not registered
])
def test_a_growth_the_catalog_refuses_changes_nothing_on_any_replica(
        before: tuple[object, ...], command: GrowMirrorTopic, error: type[Exception]) -> None:
    catalog = _catalog(LINK, MIRROR, *before)
    with pytest.raises(error):
        catalog.validate(command)
    topics, next_group_id = dict(catalog.topics), catalog.next_group_id
    result = catalog.apply(Index(50), decode_command(encode_command(command)))
    assert isinstance(result.error, error), result
    assert catalog.topics == topics and catalog.next_group_id == next_group_id


def test_a_growth_needs_a_group_id_for_each_new_partition() -> None:
    catalog = _catalog(LINK, MIRROR)
    catalog.next_group_id = GroupId(ID_MAX)  # one left, two wanted
    assert isinstance(catalog.apply(Index(50), FOLLOW).error, ResourceExhausted)
    assert len(catalog.topic("orders").partitions) == 2 and catalog.next_group_id == ID_MAX


# The source grew twice (2 -> 3 -> 4) around a metadata leader change: each leader saw one
# count and proposed its growth from 2.
TO_3 = GrowMirrorTopic(name="orders", link="dr", count=3, assignments=((NodeId(1),),), start_offsets=(40,))


@pytest.mark.parametrize(("first", "second", "error"), [(TO_3, FOLLOW, InvalidReplicaAssignment),
                                                        (FOLLOW, TO_3, InvalidPartitions)])
def test_two_growths_to_different_counts_grow_the_mirror_once(first: GrowMirrorTopic, second: GrowMirrorTopic,
                                                               error: type[Exception]) -> None:
    # The one applied first wins; the other, made for 2 partitions, is refused whole on every
    # replica (its replica lists and start offsets are for partitions the mirror no longer lacks).
    catalog = _catalog(LINK, MIRROR, first)
    before, next_group_id = catalog.topic("orders"), catalog.next_group_id
    assert isinstance(catalog.apply(Index(50), second).error, error)
    assert catalog.topic("orders") == before and catalog.next_group_id == next_group_id
    assert len(before.partitions) == before.mirror_partitions == first.count
    assert [p.group_id for p in before.partitions] == list(range(1, first.count + 1))


def test_a_grown_partition_resyncs_as_one_the_mirror_was_made_with() -> None:
    # Partition 2 came with the growth (group 3, from 40). Resynced keeping its prefix, then
    # whole: each time a new incarnation on the next group id, the others untouched, and a
    # replica created late starts from the incarnation's start point (mirror_start).
    catalog = _catalog(LINK, MIRROR, FOLLOW)
    grown = catalog.topic("orders").partitions[2]
    others = [p for p in catalog.topic("orders").partitions if p.partition != 2]
    kept = ResyncMirrorPartition(name="orders", partition=2, group_id=grown.group_id, start_offset=77, prefix_index=40,
                                 prefix_term=2, prefix_offset=1234, prefix_voters=grown.replicas)
    assert catalog.apply(Index(50), kept).ok
    fresh = catalog.topic("orders").partitions[2]
    assert (fresh.group_id, fresh.start_offset, fresh.prefix) == (5, 40, (grown.group_id, 40, 2, 1234))
    assert mirror_start(catalog.topic("orders"), 2) == ("orders", 2, 40, 2)  # the kept prefix's term
    assert catalog.apply(Index(51), ResyncMirrorPartition(name="orders", partition=2, group_id=fresh.group_id,
                                                          start_offset=77)).ok
    whole = catalog.topic("orders").partitions[2]
    assert (whole.group_id, whole.start_offset, whole.prefix, whole.replicas) == (6, 77, (), grown.replicas)
    assert catalog.next_group_id == 7
    topic = catalog.topic("orders")
    assert mirror_start(topic, 2) == ("orders", 2, 77, 1) and topic.mirror_partitions == 4
    assert [p for p in topic.partitions if p.partition != 2] == others
    assert Catalog.restore(catalog.snapshot()).topic("orders") == topic


@pytest.mark.parametrize("bad", [
    {"count": PARTITIONS_MAX + 1}, {"count": 1, "assignments": ((NodeId(1),),), "start_offsets": (0,)},
    {"count": True}, {"assignments": (), "start_offsets": ()}, {"assignments": [[1], [1]]},
    {"assignments": ((NodeId(1),), (NodeId(1), NodeId(2)))}, {"assignments": ((NodeId(1), NodeId(1)),) * 2},
    {"assignments": ((NodeId(0),),) * 2}, {"assignments": ((NodeId(1),),) * 4}, {"start_offsets": (0,)},
    {"start_offsets": (-1, 0)}, {"start_offsets": (2**63, 0)}, {"start_offsets": [0, 0]}, {"link": "no/slash"},
    {"name": "bad name"},
])
def test_a_growth_command_checks_its_shape(bad: dict[str, object]) -> None:
    arguments = {"name": "orders", "link": "dr", "count": 4, "assignments": FOLLOW.assignments,
                 "start_offsets": (0, 0), **bad}
    with pytest.raises(InvalidRequest):
        GrowMirrorTopic(**arguments)  # type: ignore[arg-type]


def test_the_growth_command_round_trips_and_older_commands_keep_their_bytes() -> None:
    encoded = encode_command(FOLLOW)
    assert encoded == (b'{"assignments":[[1],[1]],"count":4,"link":"dr","name":"orders","start_offsets":[40,0],'
                       b'"type":"grow_mirror_topic","v":1}')
    assert decode_command(encoded) == FOLLOW
    # A mirror's creation is written as before the growth existed (an older node applies it).
    assert encode_command(MIRROR) == (
        b'{"assignments":[[1],[1]],"config":{"retention_ms":1000},"link":"dr","name":"orders",'
        b'"replication_factor":1,"start_offsets":[0,500],"type":"create_mirror_topic","v":1}')
    for missing in ("start_offsets", "count"):
        document = json.loads(encoded)
        del document[missing]
        with pytest.raises(InvalidRequest):
            decode_command(json.dumps(document).encode())
    with pytest.raises(InvalidRequest):
        decode_command(encoded.replace(b'"v":1', b'"v":1,"extra":0'))


def test_a_grown_mirror_survives_a_snapshot_written_as_an_older_node_reads_it() -> None:
    grown = _catalog(LINK, MIRROR, FOLLOW)
    snapshot = grown.snapshot()
    restored = Catalog.restore(snapshot)
    assert restored.topics == grown.topics and restored.next_group_id == grown.next_group_id
    assert restored.snapshot() == snapshot == _catalog(LINK, MIRROR, FOLLOW).snapshot()
    # No field an older node lacks: its mirror partitions are all its partitions, as at creation.
    (row,) = json.loads(snapshot)["topics"]
    assert set(row) == {"assignments", "config", "group_ids", "initial", "leaving", "mirror_link", "name",
                        "replication_factor", "start_offsets"}
    assert row["start_offsets"] == [0, 500, 40, 0]


@pytest.mark.parametrize(("said", "growing", "why"), [
    (4, {"orders": 4}, None), (PARTITIONS_MAX, {"orders": PARTITIONS_MAX}, None), (2, {}, None),
    (1, {}, "fewer than the mirror's 2"), (0, {}, "fewer than the mirror's 2"),
    (PARTITIONS_MAX + 1, {}, f"a topic has 1..{PARTITIONS_MAX}"),
    ("4", {}, "no partition count"), (None, {}, "no partition count"), (True, {}, "no partition count"),
    (4.0, {}, "no partition count"),
])
def test_discovery_grows_a_mirror_only_to_a_larger_bounded_count(said: object, growing: dict[str, int],
                                                                  why: str | None) -> None:
    # The source lists every topic with its count; only this link's mirrors not promoted are looked at.
    others = CreateMirrorTopic(name="theirs", link="dr2", replication_factor=1, config={},
                               assignments=((NodeId(1),),), start_offsets=(0,))
    promoted = CreateMirrorTopic(name="orders-old", link="dr", replication_factor=1, config={},
                                 assignments=((NodeId(1),),), start_offsets=(0,))
    catalog = _finalized(_catalog(LINK, OTHER_LINK, MIRROR, others, promoted, PromoteMirrorTopic(name="orders-old"),
                                  PLAIN))
    listed = {"orders": said, "theirs": said, "orders-old": said, "plain": said, "absent": said}
    found, refused = listed_growth(catalog, "dr", listed)
    assert found == growing
    assert set(refused) == ({"orders"} if why else set()) and (why is None or why in refused["orders"])


def test_group_zero_gives_a_subscribed_group_the_partitions_its_mirror_grew() -> None:
    # The wiring in node/machines.py: the growth and the group's new target at the same entry, as
    # after a partition increase by hand (tests/unit/test_live_ops.py).
    log = Log()
    for command in (RegisterNode(node_id=NodeId(1), raft_addr="a:1", http_addr="a:2"), LINK, MIRROR):
        assert log.apply(encode_command(command)).ok
    assert log.apply(encode_group_command(JoinGroup(group="g", member_id="a", rebalance_timeout_ms=1000,
                                                    subscription=Subscription(topics=("orders",))))).error is None
    group = log.machine.holder.groups.groups["g"]
    epoch = group.epoch
    assert log.apply(encode_command(FOLLOW)).ok
    assert group.epoch == epoch + 1 and group.target["a"] == {("orders", p) for p in range(4)}
    assert not log.apply(encode_command(FOLLOW)).ok and group.epoch == epoch + 1, "a refused growth bumps nothing"
