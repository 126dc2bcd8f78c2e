"""The metadata catalog: command encoding, validation, apply, snapshots, local groups."""

from __future__ import annotations

import pytest

from multiraft.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    InvalidTopic,
    SnapshotFormatError,
    TopicExists,
    UnknownNode,
    UnknownTopic,
)
from multiraft.metadata import (
    AllocateProducerIds,
    AlterTopicConfig,
    Catalog,
    CreateTopic,
    DeleteToken,
    DeleteTopic,
    LocalGroup,
    NodeStatus,
    ProducerIdBlock,
    PutToken,
    RegisterNode,
    ReplaceReplica,
    ReplicaLeft,
    SetClusterConfig,
    SetNodeStatus,
    decode_command,
    encode_command,
    groups_for_node,
)
from raftlog.types import Index


def node(node_id: int, rack: str | None = None) -> RegisterNode:
    return RegisterNode(node_id=node_id, raft_addr=f"127.0.0.{node_id}:7000",
                        http_addr=f"127.0.0.{node_id}:8000", rack=rack)  # fmt: skip


def create(name: str = "orders", assignments=((1, 2), (2, 3)), config=None) -> CreateTopic:
    assignments = tuple(tuple(r) for r in assignments)
    return CreateTopic(name=name, partitions=len(assignments),
                       replication_factor=len(assignments[0]), config=config or {},
                       assignments=assignments)  # fmt: skip


class Applier:
    def __init__(self) -> None:
        self.catalog = Catalog()

    def __call__(self, command):
        return self.catalog.apply(Index(self.catalog.applied_index + 1), command)


def cluster(nodes: int = 3) -> Applier:
    applier = Applier()
    for node_id in range(1, nodes + 1):
        assert applier(node(node_id)).ok
    return applier


ALL_COMMANDS = [
    node(1, rack="a"),
    node(2),
    SetNodeStatus(node_id=1, status=NodeStatus.FENCED),
    create(config={"retention_ms": 1000, "cleanup.policy": "delete", "x": True, "y": 1.5}),
    DeleteTopic(name="orders"),
    AllocateProducerIds(count=1000),
    SetClusterConfig(key="replica_lag_time_max_ms", value=10_000),
    SetClusterConfig(key="gone", value=None),
    ReplaceReplica(topic="orders", partition=1, old=3, new=4),
    ReplicaLeft(topic="orders", partition=1, node=3),
    AlterTopicConfig(name="orders", changes={"retention_ms": 60_000, "cleanup.policy": None}),
    PutToken(name="reader", digest="ab" * 32, rights=("read:*", "write:orders")),
    DeleteToken(name="reader"),
]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: type(c).__name__)
def test_commands_round_trip(command):
    # Goal: every command decodes to an equal command from its explicit encoding.
    encoded = encode_command(command)
    assert b'"v":1' in encoded
    assert decode_command(encoded) == command


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[]",
        b'{"v":2,"type":"delete_topic","name":"t"}',
        b'{"v":1,"type":"drop_database","name":"t"}',
        b'{"v":1,"type":"delete_topic"}',
        b'{"v":1,"type":"delete_topic","name":"t","extra":1}',
        b'{"v":1,"type":"delete_topic","name":7}',
        b'{"v":1,"type":"set_node_status","node_id":1,"status":"sleepy"}',
        b'{"v":1,"type":"set_node_status","node_id":true,"status":"alive"}',
        b'{"v":1,"type":"allocate_producer_ids","count":0}',
        b'{"v":1,"type":"create_topic","name":"t","partitions":1,"replication_factor":1,'
        b'"config":{},"assignments":[[1,1]]}',
    ],
)
def test_decode_refuses_malformed_commands(payload):
    # Goal: a committed entry that is not a valid command is refused, typed.
    with pytest.raises(InvalidRequest):
        decode_command(payload)


@pytest.mark.parametrize(
    ("name", "valid"),
    [("orders", True), ("a.b_c-D9", True), ("x" * 249, True), ("...", True),
     (".", False), ("..", False), ("", False), ("x" * 250, False), ("a/b", False),
     ("ünï", False), ("a b", False)],
)  # fmt: skip
def test_topic_names_follow_kafka(name, valid):
    # Goal: Kafka's topic name rule.
    if valid:
        assert DeleteTopic(name=name).name == name
    else:
        with pytest.raises(InvalidTopic):
            DeleteTopic(name=name)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"partitions": 0, "assignments": ()}, InvalidPartitions),
        ({"partitions": 10_001, "assignments": ((1,),) * 10_001}, InvalidPartitions),
        ({"replication_factor": 0}, InvalidReplicationFactor),
        ({"assignments": ((1,),)}, InvalidReplicaAssignment),
        ({"assignments": ((1, 1),)}, InvalidReplicaAssignment),
        ({"partitions": 2}, InvalidReplicaAssignment),
        ({"config": {"Bad Key": 1}}, InvalidConfig),
        ({"config": {"k": [1]}}, InvalidConfig),
    ],
)
def test_create_topic_shape_validation(fields, error):
    # Goal: a CreateTopic that cannot be valid in any catalog fails on construction.
    arguments = {"name": "t", "partitions": 1, "replication_factor": 2, "config": {},
                 "assignments": ((1, 2),)} | fields  # fmt: skip
    with pytest.raises(error):
        CreateTopic(**arguments)


def test_create_topic_assigns_increasing_group_ids_never_reused():
    # Goal: group 0 is reserved, partitions get fresh ids, deleted ids stay retired.
    applier = cluster()
    first = applier(create("a")).value
    assert [p.group_id for p in first.partitions] == [1, 2]
    assert applier(DeleteTopic(name="a")).value == first
    again = applier(create("a")).value
    assert [p.group_id for p in again.partitions] == [3, 4]
    assert again.partitions[1].replicas == (2, 3)


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (create("orders"), TopicExists),
        (create("big", assignments=((1, 2, 3, 4),)), InvalidReplicationFactor),
        (create("far", assignments=((1, 9),)), InvalidReplicaAssignment),
        (DeleteTopic(name="missing"), UnknownTopic),
        (SetNodeStatus(node_id=9, status=NodeStatus.DEAD), UnknownNode),
    ],
)
def test_apply_refusals_leave_the_catalog_unchanged(command, error):
    # Goal: a refused command advances the applied index, changes nothing else,
    # and returns the typed error (the controller's pre-check raises the same).
    applier = cluster()
    applier(create("orders"))
    before = applier.catalog.snapshot()
    with pytest.raises(error):
        applier.catalog.validate(command)
    result = applier(command)
    assert isinstance(result.error, error) and not result.ok
    after = Catalog.restore(applier.catalog.snapshot())
    after.applied_index = Catalog.restore(before).applied_index
    assert after.snapshot() == before


def test_nodes_register_change_status_and_reregister():
    # Goal: status transitions are recorded; re-registering revives with new addresses.
    applier = cluster(2)
    assert applier(SetNodeStatus(node_id=2, status=NodeStatus.DEAD)).value.status == "dead"
    assert [n.node_id for n in applier.catalog.live_nodes()] == [1]
    moved = RegisterNode(node_id=2, raft_addr="10.0.0.2:7000", http_addr="10.0.0.2:8000")
    assert applier(moved).value.status is NodeStatus.ALIVE
    assert applier.catalog.nodes[2].raft_addr == "10.0.0.2:7000"


def test_producer_ids_are_allocated_in_disjoint_blocks():
    # Goal: blocks never overlap.
    applier = cluster(1)
    assert applier(AllocateProducerIds(count=1000)).value == ProducerIdBlock(0, 1000)
    assert applier(AllocateProducerIds(count=5)).value == ProducerIdBlock(1000, 5)
    assert applier.catalog.next_producer_id == 1005


def test_cluster_config_set_and_remove():
    # Goal: a None value removes the key.
    applier = cluster(1)
    applier(SetClusterConfig(key="node_dead_after_ms", value=30_000))
    assert applier.catalog.cluster_config == {"node_dead_after_ms": 30_000}
    applier(SetClusterConfig(key="node_dead_after_ms", value=None))
    assert applier.catalog.cluster_config == {}


def test_apply_is_deterministic_and_snapshots_round_trip():
    # Goal: two catalogs applying the same committed commands agree byte for byte,
    # and a restored snapshot continues identically.
    commands = [node(1, "a"), node(2, "b"), node(3), create("a"),
                create("b", ((3, 1, 2),), {"retention_ms": 5}), AllocateProducerIds(count=10),
                SetClusterConfig(key="k", value="v"), DeleteTopic(name="a"),
                create("a"), SetNodeStatus(node_id=3, status=NodeStatus.FENCED)]  # fmt: skip
    left, right = Applier(), Applier()
    for command in commands:
        assert left(command) == right(command)
    assert left.catalog.snapshot() == right.catalog.snapshot()
    restored = Applier()
    restored.catalog = Catalog.restore(left.catalog.snapshot())
    assert restored.catalog.snapshot() == left.catalog.snapshot()
    assert restored(create("c")).value == left(create("c")).value


@pytest.mark.parametrize(
    "data",
    [b"", b"{}", b'{"v":9}',
     b'{"v":1,"applied_index":1,"next_group_id":0,"next_producer_id":0,'
     b'"cluster_config":{},"nodes":[],"topics":[]}'],
)  # fmt: skip
def test_restore_refuses_malformed_snapshots(data):
    # Goal: snapshot bytes are validated (group id counter must be >= 1 here).
    with pytest.raises(SnapshotFormatError):
        Catalog.restore(data)


def test_restore_refuses_group_ids_at_or_above_the_counter():
    # Goal: a snapshot whose counter would hand out a used group id is refused.
    applier = cluster()
    applier(create("a"))
    data = applier.catalog.snapshot().replace(b'"next_group_id":3', b'"next_group_id":2')
    with pytest.raises(SnapshotFormatError):
        Catalog.restore(data)


def test_groups_for_node():
    # Goal: a node hosts exactly the partitions listing it as a replica.
    applier = cluster()
    applier(create("a", ((1, 2), (2, 3))))
    applier(create("b", ((3, 1),)))
    assert groups_for_node(applier.catalog, 1) == {
        1: LocalGroup("a", 0, (1, 2), (1, 2)),
        3: LocalGroup("b", 0, (3, 1), (3, 1)),
    }
    assert set(groups_for_node(applier.catalog, 2)) == {1, 2}
    assert groups_for_node(applier.catalog, 4) == {}


def test_a_replaced_replica_keeps_its_copy_until_the_group_left_it():
    # Goal: ReplaceReplica puts the new node in the old one's place (preferred-leader
    # order kept) and keeps the old node hosting its copy as leaving; the new node's
    # copy is not bootstrapped (the voters stay the created ones); ReplicaLeft lets
    # the old copy go. Refusals leave the catalog unchanged.
    applier = cluster(4)
    applier(create("a", ((1, 2, 3),)))
    before = applier.catalog.snapshot()
    for command, error in [(ReplaceReplica(topic="a", partition=0, old=4, new=1), InvalidReplicaAssignment),
                           (ReplaceReplica(topic="a", partition=0, old=3, new=2), InvalidReplicaAssignment),
                           (ReplaceReplica(topic="a", partition=0, old=3, new=9), UnknownNode),
                           (ReplaceReplica(topic="a", partition=1, old=3, new=4), UnknownTopic),
                           (ReplicaLeft(topic="a", partition=0, node=3), InvalidReplicaAssignment)]:
        assert isinstance(applier(command).error, error), command
    assert applier.catalog.snapshot().replace(b'"applied_index":10', b'"applied_index":5') == before

    assert applier(ReplaceReplica(topic="a", partition=0, old=2, new=4)).ok
    info = applier.catalog.topics["a"].partitions[0]
    assert (info.replicas, info.leaving, info.bootstrap_voters) == ((1, 4, 3), (2,), (1, 2, 3))
    assert groups_for_node(applier.catalog, 4)[1] == LocalGroup("a", 0, (1, 4, 3), (1, 2, 3))
    assert 1 in groups_for_node(applier.catalog, 2), "the leaving node keeps its copy"
    assert isinstance(applier(ReplaceReplica(topic="a", partition=0, old=4, new=2)).error,
                      InvalidReplicaAssignment), "the leaving node still holds a copy"
    refused = applier(ReplaceReplica(topic="a", partition=0, old=3, new=5))
    assert isinstance(refused.error, InvalidReplicaAssignment) and "still moving" in str(refused.error), \
        "one move per partition at a time"
    restored = Catalog.restore(applier.catalog.snapshot())
    assert restored.topics == applier.catalog.topics

    assert applier(ReplicaLeft(topic="a", partition=0, node=2)).ok
    info = applier.catalog.topics["a"].partitions[0]
    assert (info.replicas, info.leaving, info.bootstrap_voters) == ((1, 4, 3), (), (1, 2, 3))
    assert groups_for_node(applier.catalog, 2) == {}


def test_snapshots_without_move_fields_restore_as_never_moved():
    # Goal: a snapshot written before replica moves existed restores with the
    # created replicas as the bootstrap voters and nothing leaving.
    applier = cluster()
    applier(create("a", ((1, 2, 3),)))
    data = applier.catalog.snapshot().replace(b',"initial":[[]]', b"").replace(b',"leaving":[[]]', b"")
    assert b"initial" not in data and b"leaving" not in data
    info = Catalog.restore(data).topics["a"].partitions[0]
    assert (info.replicas, info.leaving, info.bootstrap_voters) == ((1, 2, 3), (), (1, 2, 3))
    for bad in (b'"initial":[[1,1,2]]', b'"initial":[[1]]', b'"leaving":[[1]]', b'"leaving":[]'):
        with pytest.raises(SnapshotFormatError):
            Catalog.restore(applier.catalog.snapshot().replace(b'"initial":[[]]', bad)
                            if b"initial" in bad else applier.catalog.snapshot().replace(b'"leaving":[[]]', bad))


def test_topic_settings_change_after_creation():
    # Goal: AlterTopicConfig sets and removes keys (Kafka's incremental alter-configs),
    # refuses bad values, unknown topics and a config past its size bound, and a
    # refusal changes nothing.
    applier = cluster()
    applier(create("a", ((1, 2),), {"retention_ms": 5, "segment_bytes": 8192}))
    assert applier(AlterTopicConfig(name="a", changes={"retention_ms": 60_000, "segment_bytes": None,
                                                       "min_insync_replicas": 2})).ok
    assert applier.catalog.topics["a"].config == {"retention_ms": 60_000, "min_insync_replicas": 2}
    assert isinstance(applier(AlterTopicConfig(name="b", changes={"x": 1})).error, UnknownTopic)
    many = {f"k{i}": i for i in range(99)}
    assert isinstance(applier(AlterTopicConfig(name="a", changes=many)).error, InvalidConfig)
    assert applier.catalog.topics["a"].config == {"retention_ms": 60_000, "min_insync_replicas": 2}
    for changes in ({}, {"retention_ms": 0}, {"Bad-Key": None}, {"min_insync_replicas": 9}):
        with pytest.raises(InvalidConfig):
            AlterTopicConfig(name="a", changes=changes)
    restored = Catalog.restore(applier.catalog.snapshot())
    assert restored.topics["a"].config == applier.catalog.topics["a"].config
