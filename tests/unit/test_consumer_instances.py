"""Confluent REST v2 consumer instances in the pure group state (multiraft/consumer_groups/instances.py).

Goal: an instance is a member of its group from its creation; subscribing, unsubscribing
and manual assignment take effect at once and never give one partition two owners (a
manual member waits until a subscribed one gave the partition back); positions are kept
only for what the member holds; the instance goes with its member; its session is its own
timeout; the codec and the snapshot (version 2, and version 1 still restoring) carry it all.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiraft.consumer_groups import (
    AssignInstance,
    CreateInstance,
    DeleteInstance,
    ExpireMembers,
    GroupsState,
    Heartbeat,
    InstancePositions,
    JoinGroup,
    Sessions,
    StaticTopics,
    SubscribeInstance,
    Subscription,
    decode_group_command,
    decode_groups,
    encode_group_command,
    encode_groups,
)
from multiraft.consumer_groups.state import check_exclusive
from multiraft.errors import (
    ConsumerIllegalState,
    ConsumerInstanceExists,
    InconsistentGroupConfig,
    InvalidRequest,
    SnapshotFormatError,
    UnknownConsumerInstance,
)

G = "g"


class Driver:
    def __init__(self, counts: dict[str, int]) -> None:
        self.state = GroupsState()
        self.topics = StaticTopics(dict(counts))
        self.index = 0

    def apply(self, command):  # type: ignore[no-untyped-def]
        self.index += 1
        result = self.state.apply(self.index, decode_group_command(encode_group_command(command)), self.topics)
        for group in self.state.groups.values():
            check_exclusive(group)
        return result

    def ok(self, command):  # type: ignore[no-untyped-def]
        result = self.apply(command)
        assert result.error is None, result.error
        return result.value

    def member(self, member_id: str):  # type: ignore[no-untyped-def]
        return self.state.groups[G].members[member_id]

    def ack(self, member_id: str):  # type: ignore[no-untyped-def]
        m = self.member(member_id)
        return self.ok(Heartbeat(group=G, member_id=member_id, member_epoch=m.epoch, owned=tuple(sorted(m.assigned))))


def test_an_instance_is_a_member_that_reads_nothing_until_it_subscribes() -> None:
    d = Driver({"t": 4})
    view = d.ok(CreateInstance(group=G, member_id="i1", format="json", instance_timeout_ms=60_000))
    assert view.assigned == () and d.member("i1").subscription is None
    assert d.state.instance_view(G, "i1")["mode"] == "none"
    assert d.apply(CreateInstance(group=G, member_id="i1")).error.__class__ is ConsumerInstanceExists
    d.ok(SubscribeInstance(group=G, member_id="i1", subscription=Subscription(topics=("t",))))
    assert len(d.member("i1").assigned) == 4
    assert d.state.instance_view(G, "i1")["mode"] == "subscribed"
    assert d.state.session_timeout_ms(G, "i1") == 60_000  # its own timeout, not the group's 45 s


def test_unsubscribe_releases_at_once_and_another_member_takes_over() -> None:
    d = Driver({"t": 4})
    d.ok(CreateInstance(group=G, member_id="i1"))
    d.ok(SubscribeInstance(group=G, member_id="i1", subscription=Subscription(topics=("t",))))
    d.ok(JoinGroup(group=G, member_id="m2", subscription=Subscription(topics=("t",))))
    d.ack("i1")  # told of the revocation...
    d.ack("i1")  # ...and, at its next records GET, gives them back
    d.ack("m2")
    assert len(d.member("i1").assigned) == 2 and len(d.member("m2").assigned) == 2
    d.ok(SubscribeInstance(group=G, member_id="i1", subscription=None))
    assert d.member("i1").assigned == frozenset() and d.member("i1").revoking == frozenset()
    d.ack("m2")
    assert len(d.member("m2").assigned) == 4


def test_manual_assignment_waits_for_the_owner_and_is_exclusive_between_instances() -> None:
    d = Driver({"t": 4})
    d.ok(JoinGroup(group=G, member_id="m1", subscription=Subscription(topics=("t",))))
    d.ack("m1")
    assert len(d.member("m1").assigned) == 4
    d.ok(CreateInstance(group=G, member_id="i1"))
    view = d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 0), ("t", 1))))
    assert view.assigned == () and set(view.pending) == {("t", 0), ("t", 1)}  # m1 still holds them
    d.ack("m1")  # m1 is told to give them back...
    d.ack("m1")  # ...and does: the subscribed member keeps only the rest
    d.ack("i1")
    assert d.member("i1").assigned == frozenset({("t", 0), ("t", 1)})
    assert d.member("m1").assigned == frozenset({("t", 2), ("t", 3)})
    d.ok(CreateInstance(group=G, member_id="i2"))
    assert isinstance(d.apply(AssignInstance(group=G, member_id="i2", partitions=(("t", 1),))).error,
                      ConsumerIllegalState)
    assert isinstance(d.apply(SubscribeInstance(group=G, member_id="i1", subscription=Subscription(topics=("t",))))
                      .error, ConsumerIllegalState)  # assigned by hand: subscribe is refused (Kafka's rule)
    d.ok(SubscribeInstance(group=G, member_id="i2", subscription=Subscription(topics=("t",))))
    assert isinstance(d.apply(AssignInstance(group=G, member_id="i2", partitions=(("t", 3),))).error,
                      ConsumerIllegalState)


def test_positions_are_kept_only_for_what_the_member_holds() -> None:
    d = Driver({"t": 2})
    d.ok(CreateInstance(group=G, member_id="i1"))
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 0), ("t", 1))))
    d.ok(InstancePositions(group=G, member_id="i1", positions=(("t", 0, 5), ("t", 1, 7)), seek=True))
    assert d.state.instance(G, "i1").positions == {("t", 0): 5, ("t", 1): 7}
    assert isinstance(d.apply(InstancePositions(group=G, member_id="i1", positions=(("u", 0, 1),), seek=True)).error,
                      ConsumerIllegalState)
    d.ok(InstancePositions(group=G, member_id="i1", positions=(("u", 0, 1), ("t", 0, 6))))  # a read's: kept what fits
    assert d.state.instance(G, "i1").positions == {("t", 0): 6, ("t", 1): 7}
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 1),)))
    assert d.state.instance(G, "i1").positions == {("t", 1): 7}


def test_the_instance_goes_with_its_member_and_native_joins_cannot_take_its_id() -> None:
    d = Driver({"t": 2})
    d.ok(CreateInstance(group=G, member_id="i1"))
    assert isinstance(d.apply(JoinGroup(group=G, member_id="i1", subscription=Subscription(topics=("t",)))).error,
                      InconsistentGroupConfig)
    d.ok(ExpireMembers(group=G, member_ids=("i1",)))
    assert G not in d.state.groups and G not in d.state.instances
    assert isinstance(d.apply(DeleteInstance(group=G, member_id="i1")).error, UnknownConsumerInstance)
    d.ok(CreateInstance(group=G, member_id="i2"))
    d.ok(DeleteInstance(group=G, member_id="i2"))
    with pytest.raises(UnknownConsumerInstance):
        d.state.instance(G, "i2")


def test_sessions_expire_an_instance_after_its_own_timeout() -> None:
    d = Driver({"t": 1})
    d.ok(CreateInstance(group=G, member_id="i1", instance_timeout_ms=10_000))
    d.ok(JoinGroup(group=G, member_id="m1", subscription=Subscription(topics=("t",))))
    sessions = Sessions()
    sessions.reset(d.state, 0)
    assert [c.member_ids for c in sessions.expired(d.state, 9_000)] == []
    assert [c.member_ids for c in sessions.expired(d.state, 10_001)] == [("i1",)]


@pytest.mark.parametrize("command", [
    {"format": "avro"}, {"auto_offset_reset": "none"}, {"instance_timeout_ms": 10},
    {"request_timeout_ms": 60_000}, {"auto_commit": "true"},
])
def test_instance_settings_are_checked(command: dict) -> None:
    with pytest.raises(InvalidRequest):
        CreateInstance(group=G, member_id="i1", **command)


def test_snapshot_round_trip_with_instances_and_version_1_still_restores() -> None:
    d = Driver({"t": 3})
    d.ok(JoinGroup(group=G, member_id="m1", subscription=Subscription(topics=("t",))))
    v1 = encode_groups(d.state)
    assert b'"v":1' in v1 and b"instances" not in v1  # no instances: the bytes of before
    assert encode_groups(decode_groups(v1)) == v1
    d.ok(CreateInstance(group=G, member_id="i1", format="json", auto_commit=False))
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 2),)))
    d.ack("m1")
    d.ack("m1")
    d.ack("i1")
    d.ok(InstancePositions(group=G, member_id="i1", positions=(("t", 2, 9),), seek=True))
    v2 = encode_groups(d.state)
    restored = decode_groups(v2)
    assert encode_groups(restored) == v2
    assert restored.instance(G, "i1").positions == {("t", 2): 9}
    assert restored.instance_view(G, "i1") == d.state.instance_view(G, "i1")
    with pytest.raises(SnapshotFormatError):
        decode_groups(v2.replace(b'[["t",2,9]]', b'[["t",1,9]]'))  # a position it does not hold


_TOPICS = {"t": 4, "u": 3}
_OPERATION = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(["m1", "m2"]), st.sampled_from([("t",), ("u",), ("t", "u")])),
    st.tuples(st.just("heartbeat"), st.sampled_from(["m1", "m2", "i1", "i2"]), st.booleans()),
    st.tuples(st.just("heartbeat"), st.sampled_from(["m1", "m2", "i1", "i2"]), st.just(True)),
    st.tuples(st.just("create"), st.sampled_from(["i1", "i2"]), st.just(None)),
    st.tuples(st.just("delete"), st.sampled_from(["i1", "i2"]), st.just(None)),
    st.tuples(st.just("subscribe"), st.sampled_from(["i1", "i2"]), st.sampled_from([None, ("t",), ("u",)])),
    st.tuples(st.just("assign"), st.sampled_from(["i1", "i2"]),
              st.lists(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 3)), max_size=3, unique=True)),
    st.tuples(st.just("seek"), st.sampled_from(["i1", "i2"]), st.integers(0, 9)),
    st.tuples(st.just("expire"), st.sampled_from(["m1", "i1", "i2"]), st.just(None)),
)


def _play(d: Driver, operation: tuple) -> None:  # type: ignore[type-arg]
    kind, who, arg = operation
    if kind in ("subscribe", "assign") and who not in d.state.instances.get(G, {}):
        d.apply(CreateInstance(group=G, member_id=who))  # reach instances that do something
    group = d.state.groups.get(G)
    member = group.members.get(who) if group is not None else None
    if kind == "join":
        d.apply(JoinGroup(group=G, member_id=who, subscription=Subscription(topics=arg)))
    elif kind == "heartbeat" and member is not None:
        d.apply(Heartbeat(group=G, member_id=who, member_epoch=member.epoch,
                          owned=tuple(sorted(member.assigned)) if arg else None))
    elif kind == "create":
        d.apply(CreateInstance(group=G, member_id=who))
    elif kind == "delete":
        d.apply(DeleteInstance(group=G, member_id=who))
    elif kind == "subscribe":
        d.apply(SubscribeInstance(group=G, member_id=who,
                                  subscription=None if arg is None else Subscription(topics=arg)))
    elif kind == "assign":
        d.apply(AssignInstance(group=G, member_id=who, partitions=tuple(sorted(arg))))
    elif kind == "seek" and member is not None and member.assigned:
        topic, partition = sorted(member.assigned)[0]
        d.apply(InstancePositions(group=G, member_id=who, positions=((topic, partition, arg),)))
    elif kind == "expire" and member is not None:
        d.apply(ExpireMembers(group=G, member_ids=(who,)))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPERATION, max_size=60))
def test_property_instances_and_members_never_share_a_partition(operations: list[tuple]) -> None:  # type: ignore[type-arg]
    # Any mix of native members and instances (subscribed, assigned by hand, neither):
    # never two owners (checked after every apply), every instance is a member, positions
    # only where its member holds, manual claims disjoint, and the snapshot restores it all.
    d = Driver(_TOPICS)
    for operation in operations:
        _play(d, operation)
        for name, by_id in d.state.instances.items():
            group = d.state.groups[name]
            for member_id, instance in by_id.items():
                member = group.members[member_id]
                assert set(instance.positions) <= member.assigned | member.revoking
        group = d.state.groups.get(G)
        if group is not None:
            claims = [m.manual for m in group.members.values() if m.manual]
            assert sum(len(c) for c in claims) == len(frozenset().union(*claims))
    restored = decode_groups(encode_groups(d.state))
    assert encode_groups(restored) == encode_groups(d.state)
    assert restored.instances.keys() == d.state.instances.keys()


def test_a_refused_seek_moves_nothing() -> None:
    # A seek naming one partition the instance holds and one it does not is refused whole:
    # apply is replicated, so it is all or nothing (it wrote the held one before raising).
    d = Driver({"t": 2})
    d.ok(CreateInstance(group=G, member_id="i1"))
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 0),)))
    d.ok(InstancePositions(group=G, member_id="i1", positions=(("t", 0, 5),), seek=True))
    before = encode_groups(d.state)
    result = d.apply(InstancePositions(group=G, member_id="i1", positions=(("t", 0, 9), ("t", 1, 1)), seek=True))
    assert isinstance(result.error, ConsumerIllegalState)
    assert d.state.instance(G, "i1").positions == {("t", 0): 5}
    assert encode_groups(d.state) == before


def test_unsubscribe_also_ends_a_manual_assignment() -> None:
    # Kafka's unsubscribe() clears assign() too: the partitions are free at once.
    d = Driver({"t": 2})
    d.ok(CreateInstance(group=G, member_id="i1"))
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 0), ("t", 1))))
    assert d.member("i1").assigned == frozenset({("t", 0), ("t", 1)})
    d.ok(SubscribeInstance(group=G, member_id="i1", subscription=None))
    assert d.member("i1").assigned == frozenset() and not d.member("i1").manual
    assert d.state.instance_view(G, "i1")["mode"] == "none"
    d.ok(SubscribeInstance(group=G, member_id="i1", subscription=Subscription(topics=("t",))))  # no longer manual


def test_an_instances_view_carries_its_own_session() -> None:
    # The long-poll is bounded by half the session the view reports: it must be the
    # instance's own timeout, else an instance timing out sooner than the group's 45 s
    # expires during its own GET.
    d = Driver({"t": 1})
    view = d.ok(CreateInstance(group=G, member_id="i1", instance_timeout_ms=2_000))
    assert view.session_timeout_ms == 2_000
    d.ok(JoinGroup(group=G, member_id="m1", subscription=Subscription(topics=("t",))))
    heartbeat = d.ok(Heartbeat(group=G, member_id="i1", member_epoch=d.member("i1").epoch))
    assert heartbeat.session_timeout_ms == 2_000
    assert d.state.instance_view(G, "i1")["member"]["session_timeout_ms"] == 2_000
    assert d.ok(Heartbeat(group=G, member_id="m1", member_epoch=d.member("m1").epoch)).session_timeout_ms == 45_000


def test_the_owner_is_replicated_bounded_and_optional_in_entries_and_snapshots() -> None:
    # The creating token's name travels in the entry and the snapshot; an entry or a
    # snapshot written before owners existed (no field) still decodes, and one principal
    # holds at most INSTANCES_PER_OWNER_MAX instances.
    from multiraft.consumer_groups.commands import INSTANCES_PER_OWNER_MAX

    d = Driver({"t": 1})
    d.ok(CreateInstance(group=G, member_id="i1", owner="alice"))
    d.ok(CreateInstance(group=G, member_id="i2"))
    assert d.state.instance_view(G, "i1")["config"]["owner"] == "alice"
    assert "owner" not in d.state.instance_view(G, "i2")["config"]
    assert b"owner" not in encode_group_command(CreateInstance(group=G, member_id="i2"))
    snapshot = encode_groups(d.state)
    assert encode_groups(decode_groups(snapshot)) == snapshot
    assert decode_groups(snapshot).instance(G, "i1").config.owner == "alice"
    with pytest.raises(InvalidRequest):
        CreateInstance(group=G, member_id="i3", owner="not a name")
    for i in range(INSTANCES_PER_OWNER_MAX - 1):
        d.ok(CreateInstance(group=f"g{i % 50}", member_id=f"b{i}", owner="alice"))
    assert isinstance(d.apply(CreateInstance(group=G, member_id="one-more", owner="alice")).error,
                      ConsumerIllegalState)
    d.ok(CreateInstance(group=G, member_id="bob-1", owner="bob"))


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_the_assignor_balances_what_manual_claims_leave(assignor: str) -> None:
    # Two subscribed members and an instance that assigns itself two of four partitions:
    # the assignor runs over the two left (one each), not over all four with the claimed
    # ones taken away afterwards (which left one member both and the other none).
    d = Driver({"t": 4})
    d.ok(JoinGroup(group=G, member_id="m1", subscription=Subscription(topics=("t",)), assignor=assignor))
    d.ok(JoinGroup(group=G, member_id="m2", subscription=Subscription(topics=("t",))))
    d.ok(CreateInstance(group=G, member_id="i1"))
    d.ok(AssignInstance(group=G, member_id="i1", partitions=(("t", 0), ("t", 1))))
    target = d.state.groups[G].target
    assert target["i1"] == frozenset({("t", 0), ("t", 1)})
    assert len(target["m1"]) == 1 and len(target["m2"]) == 1
    assert target["m1"] | target["m2"] == frozenset({("t", 2), ("t", 3)})
