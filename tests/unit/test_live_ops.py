"""Live operations in the pure layers (issue 25): more partitions, drain.

Goal: the two metadata commands encode, validate and apply deterministically (and a
catalog snapshot from before them still restores); added partitions are placed so
the grown topic is spread as a new one would be, never led by a drained node while
another replica can; a subscribed consumer group's target takes the new partitions
when the catalog applies the growth; a drained node is eligible for no leadership
and hands its own off; the first campaigner of a new or reopened group skips it.
"""

from __future__ import annotations

import json

import pytest
import structlog

from multiraft.consumer_groups import GroupsState, JoinGroup, StaticTopics, Subscription
from multiraft.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    UnknownNode,
    UnknownTopic,
)
from multiraft.metadata import (
    Catalog,
    CreatePartitions,
    NodeStatus,
    SetNodeDrained,
    SetNodeStatus,
    decode_command,
    encode_command,
    groups_for_node,
)
from multiraft.metadata.placement import PlacementNode, place_replicas
from multiraft.node import draining
from multiraft.node.leadership import Balancer
from raftlog.messages import Role
from raftlog.types import NodeId
from tests.node.test_leadership import SETTINGS, Clock, FakeNode
from tests.unit.test_catalog import Applier, create, node


def _catalog(nodes: int = 3) -> Applier:
    apply = Applier()
    for n in range(1, nodes + 1):
        assert apply(node(n)).ok
    return apply


@pytest.mark.parametrize("command", [
    CreatePartitions(name="orders", count=4, assignments=((1, 2), (3, 1))),
    SetNodeDrained(node_id=2, drained=True),
    SetNodeDrained(node_id=2, drained=False),
])
def test_the_new_commands_round_trip(command) -> None:  # type: ignore[no-untyped-def]
    assert decode_command(encode_command(command)) == command


@pytest.mark.parametrize("fields, error", [
    ({"name": "t", "count": 1, "assignments": ((1,),)}, InvalidPartitions),
    ({"name": "t", "count": 10_001, "assignments": ((1,),)}, InvalidPartitions),
    ({"name": "t", "count": 3, "assignments": ()}, InvalidReplicaAssignment),
    ({"name": "t", "count": 3, "assignments": ((1, 2), (1,))}, InvalidReplicaAssignment),
    ({"name": "t", "count": 3, "assignments": ((1, 1),)}, InvalidReplicaAssignment),
    ({"name": "t", "count": 3, "assignments": ((0,),)}, InvalidRequest),
    ({"name": "bad name", "count": 3, "assignments": ((1,),)}, InvalidRequest),
])
def test_create_partitions_checks_its_shape(fields, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        CreatePartitions(**fields)
    with pytest.raises(InvalidRequest):
        SetNodeDrained(node_id=1, drained="yes")  # type: ignore[arg-type]


def test_a_topic_grows_with_new_group_ids_and_only_grows() -> None:
    apply = _catalog()
    assert apply(create("orders", ((1, 2), (2, 3)))).ok
    assert apply(create("other", ((3, 1),))).ok  # takes group 3
    result = apply(CreatePartitions(name="orders", count=4, assignments=((3, 1), (1, 2))))
    assert result.ok, result.error
    partitions = apply.catalog.topics["orders"].partitions
    assert [(p.partition, p.group_id, p.replicas) for p in partitions] == [
        (0, 1, (1, 2)), (1, 2, (2, 3)), (2, 4, (3, 1)), (3, 5, (1, 2))]
    assert apply.catalog.next_group_id == 6
    assert set(groups_for_node(apply.catalog, NodeId(3))) == {2, 3, 4}
    for command, error in (
        (CreatePartitions(name="orders", count=4, assignments=((1, 2),)), InvalidPartitions),  # not above 4
        (CreatePartitions(name="orders", count=3, assignments=((1, 2),)), InvalidPartitions),  # fewer
        (CreatePartitions(name="orders", count=6, assignments=((1, 2),)), InvalidReplicaAssignment),  # 2 lists
        (CreatePartitions(name="orders", count=5, assignments=((1, 2, 3),)), InvalidReplicaAssignment),  # RF
        (CreatePartitions(name="orders", count=5, assignments=((1, 9),)), InvalidReplicaAssignment),
        (CreatePartitions(name="nope", count=5, assignments=((1, 2),)), UnknownTopic),
    ):
        before = apply.catalog.snapshot()
        result = apply(command)
        assert isinstance(result.error, error), (command, result.error)
        assert json.loads(apply.catalog.snapshot())["topics"] == json.loads(before)["topics"]
    restored = Catalog.restore(apply.catalog.snapshot())
    assert restored.topics == apply.catalog.topics and restored.next_group_id == 6


def test_a_racing_second_growth_to_the_same_count_is_refused() -> None:
    # Two requests for 3 partitions, both placed against 2: the second must not add a 4th.
    apply = _catalog()
    assert apply(create("t", ((1, 2), (2, 3)))).ok
    assert apply(CreatePartitions(name="t", count=3, assignments=((3, 1),))).ok
    assert isinstance(apply(CreatePartitions(name="t", count=3, assignments=((1, 2),))).error, InvalidPartitions)
    assert len(apply.catalog.topics["t"].partitions) == 3


def test_the_drain_mark_survives_status_changes_restarts_and_snapshots() -> None:
    apply = _catalog()
    assert apply(SetNodeDrained(node_id=2, drained=True)).ok
    assert apply(SetNodeStatus(node_id=2, status=NodeStatus.DEAD)).ok
    assert apply(node(2)).ok  # the node restarts and registers again: still drained
    assert apply.catalog.nodes[NodeId(2)].drained and apply.catalog.nodes[NodeId(2)].status is NodeStatus.ALIVE
    assert apply.catalog.drained_nodes() == {2}
    restored = Catalog.restore(apply.catalog.snapshot())
    assert restored.nodes == apply.catalog.nodes
    assert isinstance(apply(SetNodeDrained(node_id=9, drained=True)).error, UnknownNode)
    assert apply(SetNodeDrained(node_id=2, drained=False)).ok
    assert apply.catalog.drained_nodes() == frozenset()


def test_a_drain_must_leave_a_node_to_lead() -> None:
    apply = _catalog()
    assert apply(SetNodeDrained(node_id=1, drained=True)).ok
    assert apply(SetNodeStatus(node_id=3, status=NodeStatus.DEAD)).ok
    result = apply(SetNodeDrained(node_id=2, drained=True))
    assert isinstance(result.error, InvalidRequest) and "no node to lead" in str(result.error)
    assert apply(SetNodeDrained(node_id=2, drained=False)).ok, "undraining is always allowed"


def test_a_snapshot_from_before_drains_restores_with_no_node_drained() -> None:
    apply = _catalog()
    assert apply(create("t", ((1, 2),))).ok
    document = json.loads(apply.catalog.snapshot())
    del document["drained"]
    restored = Catalog.restore(json.dumps(document).encode())
    assert restored.drained_nodes() == frozenset() and restored.topics == apply.catalog.topics
    document["drained"] = [7]
    with pytest.raises(Exception, match="drained node 7"):
        Catalog.restore(json.dumps(document).encode())


NODES = [PlacementNode(NodeId(n)) for n in (1, 2, 3)]


def _counts(assignments: list[list[NodeId]]) -> tuple[dict[int, int], dict[int, int]]:
    replicas: dict[int, int] = {}
    leaders: dict[int, int] = {}
    for replica_list in assignments:
        leaders[replica_list[0]] = leaders.get(replica_list[0], 0) + 1
        for n in replica_list:
            replicas[n] = replicas.get(n, 0) + 1
    return replicas, leaders


@pytest.mark.parametrize("before, after", [(1, 3), (2, 3), (4, 6), (3, 4), (5, 12), (7, 8)])
def test_added_partitions_spread_the_topic_as_a_new_one_would_be(before: int, after: int) -> None:
    existing = place_replicas(NODES, before, 2, start=5)
    added = place_replicas(NODES, after - before, 2, start=9, existing=existing)
    replicas, leaders = _counts(existing + added)
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert max(leaders.get(n.node_id, 0) for n in NODES) - min(leaders.get(n.node_id, 0) for n in NODES) <= 1
    assert all(len(set(r)) == 2 for r in added)


def test_a_drained_node_leads_no_new_partition_while_another_replica_can() -> None:
    for assignments in (place_replicas(NODES, 9, 2, drained={NodeId(2)}),
                        place_replicas(NODES, 4, 3, start=1, existing=[[2, 1, 3]], drained={NodeId(2)})):
        replicas, leaders = _counts(assignments)
        assert leaders.get(2, 0) == 0 and replicas[2] > 0, "it holds replicas, leads none"
    only = place_replicas([PlacementNode(NodeId(2))], 1, 1, drained={NodeId(2)})
    assert only == [[2]], "with no other replica it is still placed"


def test_a_subscribed_group_takes_added_partitions_when_the_catalog_applies_the_growth() -> None:
    state, topics = GroupsState(), StaticTopics({"t": 2}, version=1)
    result = state.apply(1, JoinGroup(group="g", member_id="m", subscription=Subscription(topics=("t",), pattern=None)),
                         topics)
    assert result.error is None
    epoch = state.groups["g"].epoch
    assert state.groups["g"].target["m"] == {("t", 0), ("t", 1)}
    assert state.partitions_added(topics) == [], "nothing grew: no new epoch"
    grown = StaticTopics({"t": 4}, version=2)
    assert state.partitions_added(grown) == ["g"]
    group = state.groups["g"]
    assert group.epoch == epoch + 1 and group.counts == {"t": 4}
    assert group.target["m"] == {("t", p) for p in range(4)}


def _drained_balancer(partitions: int = 2) -> tuple[FakeNode, Balancer, Clock]:
    fake, clock = FakeNode(partitions), Clock()
    balance = Balancer(fake, SETTINGS, structlog.get_logger(), clock)  # type: ignore[arg-type]
    balance.observe()
    clock.now += max(SETTINGS.settle_s, SETTINGS.target_live_s)
    return fake, balance, clock


def test_no_leadership_goes_to_a_drained_preferred_replica() -> None:
    fake, balance, _ = _drained_balancer(1)
    fake.apply(SetNodeDrained(node_id=2, drained=True))
    assert balance.balance_now() == 0 and balance.balance_now(explicit=True) == 0
    fake.apply(SetNodeDrained(node_id=2, drained=False))
    assert balance.balance_now() == 1 and fake.runtime(0).transfers == [2], "undrained: it goes home"


def test_a_drained_node_hands_every_leadership_off_without_waiting_to_settle() -> None:
    fake, balance, _ = _drained_balancer(2)
    fake.apply(SetNodeDrained(node_id=1, drained=True))
    fake.create("u", 1)  # a topic creation starts a settle period: a drain does not wait for it
    fake.registry.groups[fake.catalog.catalog.topics["u"].partitions[0].group_id] = _follower()
    fake.runtime(1).core.isr.discard(2)  # partition 1's preferred replica is out of sync: node 3 takes it
    assert balance.balance_now() == 2
    assert fake.runtime(0).transfers == [2] and fake.runtime(1).transfers == [3]


def test_a_drain_target_is_settled_first_then_preferred_then_least_loaded() -> None:
    fake, _, _ = _drained_balancer(1)
    fake.apply(SetNodeDrained(node_id=3, drained=True))
    assert draining.is_drained(fake, NodeId(3)) and not draining.is_drained(fake, NodeId(1))  # type: ignore[arg-type]
    assert draining.pick_target([NodeId(2), NodeId(3)], NodeId(3), {2: 5, 3: 0}, lambda n: True) == 3
    assert draining.pick_target([NodeId(2), NodeId(3)], None, {2: 5, 3: 0}, lambda n: n == 2) == 2


def _follower():  # type: ignore[no-untyped-def]
    from tests.node.test_leadership import FakeRuntime

    runtime = FakeRuntime()
    runtime.core.role = Role.FOLLOWER
    runtime.core.leader = 2
    return runtime


def test_the_first_campaigner_skips_drained_and_silent_replicas() -> None:
    def live(n: int) -> bool:
        return n != 3

    assert draining.first_campaigner([NodeId(1), NodeId(2)], NodeId(2), set(), live) == 1
    assert draining.first_campaigner([NodeId(1), NodeId(2)], NodeId(2), {NodeId(1)}, live) == 2
    assert draining.first_campaigner([NodeId(1), NodeId(3), NodeId(2)], NodeId(1), {NodeId(1)}, live) == 2
    assert draining.first_campaigner([NodeId(1), NodeId(2)], NodeId(1), {NodeId(1), NodeId(2)}, live) == 1


def test_group_zero_bumps_the_subscribed_groups_as_it_applies_the_growth() -> None:
    # The wiring in node/machines.py: the growth and the groups' new target at the same entry.
    from multiraft.metadata.commands import encode_command as encode_metadata
    from tests.unit.test_group_machine import _join, _with_topic

    log = _with_topic(partitions=2)
    assert log.apply(_join("a")).error is None
    groups = log.machine.holder.groups
    epoch = groups.groups["g"].epoch
    assert log.apply(encode_metadata(CreatePartitions(name="t", count=3, assignments=((NodeId(1),),)))).ok
    group = groups.groups["g"]
    assert group.epoch == epoch + 1 and group.target["a"] == {("t", 0), ("t", 1), ("t", 2)}
    refused = log.apply(encode_metadata(CreatePartitions(name="t", count=3, assignments=((NodeId(1),),))))
    assert not refused.ok and groups.groups["g"].epoch == epoch + 1, "a refused growth bumps nothing"


def _rounds_in(balance: Balancer, seconds: float) -> int:
    """How many rounds `balance.run` (1 s interval) makes in `seconds` of real time."""
    import asyncio
    import contextlib

    calls = []
    real = balance.balance_now

    def counting(explicit: bool = False) -> int:
        calls.append(explicit)
        return real(explicit)

    balance.balance_now = counting  # type: ignore[method-assign]

    async def run_for() -> None:
        task = asyncio.create_task(balance.run(interval_s=1.0))
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run_for())
    balance.balance_now = real  # type: ignore[method-assign]
    return len(calls)


def test_a_drained_node_that_still_leads_rounds_every_tenth_of_a_second_while_it_moves_something() -> None:
    # Goal: a decommission's copies of the groups a drained node leads are made by their
    # next leader, so it hands them over within DRAIN_ROUND_S of the mark, not at its next
    # one-second round; and only while its rounds move something (a transfer in flight
    # here), so a node with no ready target does not walk its groups ten times a second.
    fake, balance, _ = _drained_balancer(1)
    fake.registry.led = {g: 1 for g in fake.registry.groups}
    assert _rounds_in(balance, 0.35) == 1, "not drained: the first round, then one a second (the clock stands)"
    fake.apply(SetNodeDrained(node_id=1, drained=True))
    assert _rounds_in(balance, 0.55) >= 3, "drained, a transfer in flight: rounds every 0.1 s"
    assert fake.runtime(0).transfers == [2]
    fake, balance, _ = _drained_balancer(1)
    fake.registry.led = {g: 1 for g in fake.registry.groups}
    fake.live = {2: False, 3: False}  # no ready target: nothing moves
    fake.apply(SetNodeDrained(node_id=1, drained=True))
    assert _rounds_in(balance, 0.55) == 1, "nothing to move: the usual interval"
