"""The consumer group state machine (multiraft/consumer_groups/): KIP-848 membership,
incremental reconciliation, fencing and limits, applied as group 0 applies it.

Goal: the properties the issue asks for hold over arbitrary sequences of joins,
heartbeats, leaves, expiries and topic changes (hypothesis): never two owners of one
partition; once members keep heartbeating what they own, every subscribed partition
is owned, by exactly its target member, balanced for like subscriptions; a join moves
only what the newcomer needs (sticky); the state stays within its limits. Plus the
table-driven cases: fencing, idempotent joins, settings, the codec and the snapshot.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiraft.consumer_groups import (
    ExpireMembers,
    GroupsState,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    Sessions,
    StaticTopics,
    Subscription,
    decode_group_command,
    decode_groups,
    encode_group_command,
    encode_groups,
)
from multiraft.consumer_groups.commands import MEMBERS_PER_GROUP_MAX
from multiraft.consumer_groups.state import check_exclusive
from multiraft.errors import (
    FencedMemberEpoch,
    GroupMaxSizeReached,
    InconsistentGroupConfig,
    InvalidRequest,
    PartitionNotAssigned,
    SnapshotFormatError,
    TooManyConsumerGroups,
    UnknownMemberId,
)

G = "g"


class Driver:
    """Applies commands at increasing indexes, as group 0 would, and plays well-behaved members."""

    def __init__(self, counts: dict[str, int], assignor: str | None = None) -> None:
        self.state = GroupsState()
        self.topics = StaticTopics(dict(counts))
        self.index = 0
        self.assignor = assignor

    def apply(self, command):  # type: ignore[no-untyped-def]
        self.index += 1
        result = self.state.apply(self.index, decode_group_command(encode_group_command(command)), self.topics)
        return result

    def join(self, member: str, topics: tuple[str, ...] = ("t",), pattern: str | None = None):  # type: ignore[no-untyped-def]
        subscription = Subscription(topics=() if pattern else topics, pattern=pattern)
        return self.apply(JoinGroup(group=G, member_id=member, subscription=subscription, assignor=self.assignor))

    def heartbeat(self, member: str, acknowledge: bool = True):  # type: ignore[no-untyped-def]
        m = self.state.groups[G].members[member]
        owned = tuple(sorted(m.assigned)) if acknowledge else None
        return self.apply(Heartbeat(group=G, member_id=member, member_epoch=m.epoch, owned=owned))

    def settle(self, rounds_max: int = 20) -> int:
        """Every member heartbeats what it owns until no heartbeat changes anything; the rounds taken."""
        for rounds in range(rounds_max):
            group = self.state.groups.get(G)
            if group is None:
                return rounds
            changed = False
            for member_id in sorted(group.members):
                m = group.members[member_id]
                command = Heartbeat(group=G, member_id=member_id, member_epoch=m.epoch, owned=tuple(sorted(m.assigned)))
                needed, _ = self.state.plan_heartbeat(command, self.topics)
                if needed:
                    assert self.apply(command).error is None
                    changed = True
            if not changed:
                return rounds
        raise AssertionError("did not settle")

    def owners(self) -> dict[tuple[str, int], str]:
        group = self.state.groups[G]
        return {tp: m.member_id for m in group.members.values() for tp in m.assigned | m.revoking}


def test_three_members_split_twelve_partitions_evenly() -> None:
    # Goal: the first scenario, in the state machine alone.
    driver = Driver({"t": 12})
    for member in ("a", "b", "c"):
        assert driver.join(member).error is None
    driver.settle()
    group = driver.state.groups[G]
    assert sorted(len(m.assigned) for m in group.members.values()) == [4, 4, 4]
    assert len(driver.owners()) == 12


def test_a_join_revokes_before_it_assigns_and_moves_only_what_the_newcomer_needs() -> None:
    # Goal: incremental move: the old owner is told to give back, the newcomer gets a
    # partition only after its owner's next heartbeat, and no partition moves between old members.
    driver = Driver({"t": 12})
    for member in ("a", "b", "c"):
        driver.join(member)
    driver.settle()
    before = {m: set(x.assigned) for m, x in driver.state.groups[G].members.items()}
    view = driver.join("d").value
    assert view.assigned == () and len(view.pending) == 3  # all three held by others, none given yet
    group = driver.state.groups[G]
    for member in ("a", "b", "c"):
        view = driver.heartbeat(member, acknowledge=False).value  # told, has not given back yet
        assert view.state == "revoking" and len(view.revoking) == 1
    assert driver.heartbeat("d").value.assigned == ()  # nothing released yet: still nothing
    driver.settle()
    after = {m: set(x.assigned) for m, x in group.members.items()}
    assert sorted(len(a) for a in after.values()) == [3, 3, 3, 3]
    for member in ("a", "b", "c"):
        assert after[member] <= before[member]  # sticky: old members only lose
    assert after["d"] == set().union(*before.values()) - set().union(*(after[m] for m in "abc"))


def test_leave_and_expiry_free_partitions_for_the_others() -> None:
    # Goal: a leaving (or expired) member's partitions go to the others at once.
    driver = Driver({"t": 6})
    for member in ("a", "b", "c"):
        driver.join(member)
    driver.settle()
    a_epoch = driver.state.groups[G].members["a"].epoch
    assert driver.apply(LeaveGroup(group=G, member_id="a", member_epoch=a_epoch)).value == 1
    driver.settle()
    assert sorted(len(m.assigned) for m in driver.state.groups[G].members.values()) == [3, 3]
    assert driver.apply(ExpireMembers(group=G, member_ids=("b", "zz"))).value == 1
    driver.settle()
    assert len(driver.state.groups[G].members["c"].assigned) == 6
    assert driver.apply(ExpireMembers(group=G, member_ids=("c",))).value == 1
    assert G not in driver.state.groups  # an empty group keeps nothing


def test_fenced_and_unknown_members_get_typed_errors() -> None:
    # Goal: a stale epoch is FENCED_MEMBER_EPOCH, an unknown id UNKNOWN_MEMBER_ID, a commit
    # for a partition the member does not own PARTITION_NOT_ASSIGNED.
    driver = Driver({"t": 4})
    driver.join("a")
    driver.join("b")
    driver.settle()
    a = driver.state.groups[G].members["a"]
    stale = Heartbeat(group=G, member_id="a", member_epoch=a.epoch + 5)
    assert isinstance(driver.apply(stale).error, FencedMemberEpoch)
    assert isinstance(driver.apply(replace(stale, member_id="nobody")).error, UnknownMemberId)
    with pytest.raises(FencedMemberEpoch):
        driver.state.check_commit(G, "a", a.epoch + 5, [])
    mine = sorted(a.assigned)[0]
    driver.state.check_commit(G, "a", a.epoch, [mine])
    other = sorted(driver.state.groups[G].members["b"].assigned)[0]
    with pytest.raises(PartitionNotAssigned):
        driver.state.check_commit(G, "a", a.epoch, [other])
    assert isinstance(driver.apply(LeaveGroup(group=G, member_id="a", member_epoch=a.epoch + 5)).error,
                      FencedMemberEpoch)


def test_a_revoking_member_may_still_commit_what_it_gives_back() -> None:
    driver = Driver({"t": 2})
    driver.join("a")
    driver.settle()
    driver.join("b")
    view = driver.heartbeat("a", acknowledge=False).value
    (revoked,) = view.revoking
    driver.state.check_commit(G, "a", view.member_epoch, [revoked])


def test_a_retried_join_changes_nothing_and_settings_must_agree() -> None:
    driver = Driver({"t": 3})
    first = driver.join("a").value
    assert driver.join("a").value == first
    epoch = driver.state.groups[G].epoch
    assert driver.state.groups[G].epoch == epoch
    other = JoinGroup(group=G, member_id="b", subscription=Subscription(topics=("t",)), session_timeout_ms=1000)
    assert isinstance(driver.apply(other).error, InconsistentGroupConfig)
    assert isinstance(driver.apply(replace(other, session_timeout_ms=None, assignor="range")).error,
                      InconsistentGroupConfig)
    assert driver.apply(replace(other, session_timeout_ms=None)).error is None


def test_a_group_is_bounded_in_members() -> None:
    driver = Driver({"t": 1})
    for i in range(MEMBERS_PER_GROUP_MAX):
        assert driver.join(f"m{i}").error is None
    assert isinstance(driver.join("one-too-many").error, GroupMaxSizeReached)


def test_a_pattern_subscription_follows_topics_as_they_come_and_go() -> None:
    # Goal: a topic created (or deleted) under a pattern is assigned (or dropped) at the next heartbeat.
    driver = Driver({"orders-eu": 2, "other": 5})
    driver.join("a", pattern="orders-*")
    driver.settle()
    assert {tp[0] for tp in driver.owners()} == {"orders-eu"}
    driver.topics.counts["orders-us"] = 2
    driver.settle()
    assert len(driver.owners()) == 4
    del driver.topics.counts["orders-eu"]
    driver.settle()
    assert set(driver.owners()) == {("orders-us", 0), ("orders-us", 1)}


def test_pattern_matches_are_kept_while_the_topics_version_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a heartbeat or join of a pattern member does not match the glob against every
    # topic again while the catalog is unchanged (the view's version); a new version (a
    # topic created) is matched afresh and reaches the members, as without the cache.
    from multiraft.consumer_groups import topics as topics_module

    calls = []
    real = topics_module.glob_match
    monkeypatch.setattr(topics_module, "glob_match", lambda p, n: calls.append(n) or real(p, n))
    counts = {f"t{i}": 1 for i in range(200)}
    state, index = GroupsState(), 0

    def apply(command, view):  # type: ignore[no-untyped-def]
        nonlocal index
        index += 1
        result = state.apply(index, command, view)
        assert result.error is None, result.error
        return result.value

    view = StaticTopics(counts, version=1)
    epochs = {}
    for member in range(10):
        epochs[f"m{member}"] = apply(JoinGroup(group=G, member_id=f"m{member}",
                                               subscription=Subscription(pattern="t1*")), view).member_epoch
    assert len(calls) == 200  # matched once, for every member
    for _ in range(5):
        for member, epoch in epochs.items():
            heartbeat = Heartbeat(group=G, member_id=member, member_epoch=epoch)
            state.plan_heartbeat(heartbeat, view)
            epochs[member] = apply(heartbeat, view).member_epoch
    assert len(calls) == 200
    counts["t1-new"] = 3
    epoch_before = state.groups[G].epoch
    apply(Heartbeat(group=G, member_id="m0", member_epoch=epochs["m0"]), StaticTopics(counts, version=2))
    assert len(calls) == 200 + 201
    assert state.groups[G].epoch == epoch_before + 1 and state.groups[G].counts["t1-new"] == 3


def test_range_assignor_gives_contiguous_ranges() -> None:
    driver = Driver({"t": 5}, assignor="range")
    driver.join("a")
    driver.join("b")
    driver.settle()
    group = driver.state.groups[G]
    assert sorted(p for _, p in group.members["a"].assigned) == [0, 1, 2]
    assert sorted(p for _, p in group.members["b"].assigned) == [3, 4]


@pytest.mark.parametrize("bad", [
    b"consumer-group:{}", b"consumer-group:not json", b'{"v":1,"type":"join"}',
    b'consumer-group:{"v":1,"type":"leave","group":"g","member_id":"a"}',
    b'consumer-group:{"v":1,"type":"leave","group":"g","member_id":"a","member_epoch":true}',
    b'consumer-group:{"v":1,"type":"heartbeat","group":"g","member_id":"a","member_epoch":1,"owned":[["t",1],["t",1]]}',
    b'consumer-group:{"v":1,"type":"expire","group":"g","member_ids":[],"reason":"session_timeout"}',
    b'consumer-group:{"v":2,"type":"leave","group":"g","member_id":"a","member_epoch":1}',
])
def test_the_codec_refuses_what_does_not_validate(bad: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_group_command(bad)


@pytest.mark.parametrize("subscription", [
    {"topics": (), "pattern": None}, {"topics": ("a",), "pattern": "a*"}, {"topics": ("b", "a")},
    {"topics": ("a", "a")}, {"pattern": "(a+)+$"}, {"topics": tuple(f"t{i:03}" for i in range(101))},
])
def test_subscriptions_are_bounded_and_well_formed(subscription: dict) -> None:
    with pytest.raises(InvalidRequest):
        Subscription(**subscription)


def test_snapshot_round_trip_and_refusal() -> None:
    driver = Driver({"t": 7, "u": 3})
    driver.join("a")
    driver.join("b", topics=("t", "u"))
    driver.heartbeat("a", acknowledge=False)
    data = encode_groups(driver.state)
    restored = decode_groups(data)
    assert encode_groups(restored) == data
    broken = data.replace(b'"assignor":"uniform"', b'"assignor":"magic"')
    with pytest.raises(SnapshotFormatError):
        decode_groups(broken)
    with pytest.raises(SnapshotFormatError):
        decode_groups(b'{"v":1,"groups":[{"name":"g"}]}')


def test_sessions_expire_silent_members_and_give_a_new_coordinator_a_full_session() -> None:
    driver = Driver({"t": 2})
    driver.apply(JoinGroup(group=G, member_id="a", subscription=Subscription(topics=("t",)),
                           session_timeout_ms=1000))
    driver.join("b")
    group = driver.state.groups[G]
    sessions = Sessions()
    sessions.reset(driver.state, 0)  # leadership gained: everyone seen now
    assert sessions.expired(driver.state, 1000) == []
    sessions.note(G, group.members["b"], 1000, 900)
    assert sessions.expired(driver.state, 1001) == [ExpireMembers(group=G, member_ids=("a",))]
    assert sessions.expired(driver.state, 1002) == []  # asked once; looked at again a session later
    sessions.reset(driver.state, 5000)  # leadership moved here again
    assert sessions.expired(driver.state, 6000) == []
    assert sessions.expired(driver.state, 6001) == [ExpireMembers(group=G, member_ids=("a", "b"))]
    driver.apply(ExpireMembers(group=G, member_ids=("a",)))
    assert sessions.expired(driver.state, 7002) == [ExpireMembers(group=G, member_ids=("b",))]
    assert sessions.seen_ms(G, "a") is None  # forgotten once the state no longer has it


def test_a_delayed_heartbeat_from_before_a_revocation_does_not_acknowledge_it() -> None:
    # Goal: a heartbeat the member sent before it heard of a revocation (its epoch then,
    # an `owned` without the revoked partitions), arriving late, does not free them: only
    # a heartbeat carrying the epoch the revocation moved the member to acknowledges it.
    driver = Driver({"t": 4})
    driver.join("a")
    driver.settle()
    old_epoch = driver.state.groups[G].members["a"].epoch
    driver.join("b")
    assert driver.heartbeat("a").error is None  # a learns what to give back
    a = driver.state.groups[G].members["a"]
    assert a.revoking and a.epoch != old_epoch
    late = Heartbeat(group=G, member_id="a", member_epoch=old_epoch, owned=())
    assert not driver.state.plan_heartbeat(late, driver.topics)[0]  # the coordinator would not propose it
    assert driver.apply(late).error is None  # the previous epoch is still accepted...
    assert driver.state.groups[G].members["a"].revoking == a.revoking  # ...but acknowledges nothing
    ack = Heartbeat(group=G, member_id="a", member_epoch=a.epoch, owned=tuple(sorted(a.assigned)))
    assert driver.state.plan_heartbeat(ack, driver.topics)[0]
    assert driver.apply(ack).error is None
    assert not driver.state.groups[G].members["a"].revoking


def test_a_groups_summary_agrees_with_its_description() -> None:
    # Goal: the list's cheap summary (no per-member views) tells the same state as describe.
    from multiraft.consumer_groups import describe, summary

    driver = Driver({"t": 6, "u": 2})
    driver.join("a")
    group = driver.state.groups[G]
    assert summary(group)["state"] == describe(group)["state"]
    driver.settle()
    assert summary(group)["state"] == describe(group)["state"] == "stable"
    driver.join("b", pattern="u*")
    assert summary(group)["state"] == describe(group)["state"] == "reconciling"
    assert summary(group)["topics"] == ["t"] and summary(group)["topic_patterns"] == ["u*"]
    driver.settle()
    assert summary(group)["state"] == describe(group)["state"] == "stable"


def test_a_join_past_the_total_partitions_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: the partitions all groups resolve to are bounded in all: a join that would take
    # them past it is refused (TOO_MANY_CONSUMER_GROUPS) and changes nothing; joins that
    # add no partitions still go in.
    from multiraft.consumer_groups import state as state_module

    monkeypatch.setattr(state_module, "GROUP_STATE_PARTITIONS_MAX", 10)
    topics = StaticTopics({"a": 6, "b": 6, "small": 4})
    state = GroupsState()
    index = 0

    def join(group: str, member: str, *names: str):  # type: ignore[no-untyped-def]
        nonlocal index
        index += 1
        return state.apply(index, JoinGroup(group=group, member_id=member, subscription=Subscription(topics=names)),
                           topics)

    assert join("g1", "m1", "a").error is None
    refused = join("g2", "m1", "b").error
    assert isinstance(refused, TooManyConsumerGroups) and "bound of 10" in str(refused)
    assert "g2" not in state.groups
    assert join("g2", "m1", "small").error is None
    assert join("g1", "m2", "a").error is None  # adds members, not partitions
    before = encode_groups(state)
    assert isinstance(join("g1", "m2", "a", "b").error, TooManyConsumerGroups)
    assert encode_groups(state) == before


def test_a_member_forgotten_by_the_sessions_and_back_in_the_state_still_expires() -> None:
    # Goal: an entry that comes up for a member the state has again, after the sessions
    # forgot it (another entry of it came up while it was gone), neither raises (the
    # loop would die) nor is dropped (the member would never expire): it is seen from then.
    driver = Driver({"t": 1})
    driver.apply(JoinGroup(group=G, member_id="m", subscription=Subscription(topics=("t",)), session_timeout_ms=1000))
    member = driver.state.groups[G].members["m"]
    sessions = Sessions()
    sessions.note(G, replace(member, revoking=frozenset({("t", 0)}), rebalance_timeout_ms=100), 1000, 0)
    assert driver.apply(LeaveGroup(group=G, member_id="m", member_epoch=member.epoch)).error is None
    assert sessions.expired(driver.state, 200) == []  # its rebalance entry: gone, forgotten
    driver.apply(JoinGroup(group=G, member_id="m", subscription=Subscription(topics=("t",)),
                           session_timeout_ms=1000))  # back, and this coordinator did not note it
    assert sessions.expired(driver.state, 1001) == []  # its session entry: seen from now
    assert sessions.expired(driver.state, 2002) == [ExpireMembers(group=G, member_ids=("m",))]


def test_expiries_past_one_scans_cap_come_at_the_next_scan() -> None:
    # Goal: more silent members than one scan proposes (one command per group): those past
    # the cap are expired at the very next scan, not a session later.
    counts = {"t": 1}
    state = GroupsState()
    for i in range(7):
        result = state.apply(i + 1, JoinGroup(group=f"g{i}", member_id="m", subscription=Subscription(topics=("t",)),
                                              session_timeout_ms=1000), StaticTopics(counts))
        assert result.error is None
    sessions = Sessions()
    sessions.reset(state, 0)
    first = sessions.expired(state, 1001, commands_max=3)
    assert [c.group for c in first] == ["g0", "g1", "g2"]
    second = sessions.expired(state, 1002, commands_max=3)
    assert [c.group for c in second] == ["g3", "g4", "g5"]
    assert [c.group for c in sessions.expired(state, 1003, commands_max=3)] == ["g6"]
    assert sessions.expired(state, 1004, commands_max=3) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 900)), max_size=40))
def test_property_the_heap_expires_exactly_the_silent(touches: list[tuple[int, int]]) -> None:
    # Goal: the due-time heap asks to expire a member exactly when a full scan would
    # (silent for more than the session), and asks again only a session later.
    driver = Driver({"t": 4})
    driver.apply(JoinGroup(group=G, member_id="m0", subscription=Subscription(topics=("t",)),
                           session_timeout_ms=1000))
    for i in range(1, 4):
        driver.join(f"m{i}")
    group = driver.state.groups[G]
    sessions = Sessions()
    sessions.reset(driver.state, 0)
    seen = dict.fromkeys(group.members, 0)
    asked: dict[str, int] = {}  # when last asked, since last seen
    now = 0
    for who, step in touches:
        now += step
        expected = sorted(m for m in group.members
                          if now - seen[m] > 1000 and (m not in asked or now - asked[m] > 1000))
        got = [m for c in sessions.expired(driver.state, now) for m in c.member_ids]
        assert got == expected
        for member_id in got:
            asked[member_id] = now
        member_id = f"m{who}"
        sessions.note(G, group.members[member_id], 1000, now)
        seen[member_id] = now
        asked.pop(member_id, None)


# ---------------------------------------------------------------------------- properties

TOPICS = {"t": 8, "u": 5, "v": 3}
SUBSCRIPTIONS = [("t",), ("t", "u"), ("u", "v"), ("v",)]
operation = st.one_of(
    st.tuples(st.just("join"), st.integers(0, 5), st.integers(0, len(SUBSCRIPTIONS) - 1)),
    st.tuples(st.just("heartbeat"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("expire"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("grow"), st.sampled_from(sorted(TOPICS)), st.integers(1, 12)),
)


def _run(driver: Driver, operations: list[tuple]) -> None:
    for kind, who, arg in operations:
        member = f"m{who}"
        members = driver.state.groups[G].members if G in driver.state.groups else {}
        if kind == "join":
            driver.join(member, topics=SUBSCRIPTIONS[arg])
        elif kind == "grow":
            driver.topics.counts[who] = arg
        elif member not in members:
            continue
        elif kind == "heartbeat":
            driver.heartbeat(member, acknowledge=arg)
        elif kind == "leave":
            driver.apply(LeaveGroup(group=G, member_id=member, member_epoch=members[member].epoch))
        else:
            driver.apply(ExpireMembers(group=G, member_ids=(member,)))
        if G in driver.state.groups:
            check_exclusive(driver.state.groups[G])  # never two owners, after every step


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, max_size=40), st.sampled_from(["uniform", "range"]))
def test_property_no_two_owners_and_everything_owned_once_settled(operations: list[tuple], assignor: str) -> None:
    driver = Driver(TOPICS, assignor=assignor)
    _run(driver, operations)
    driver.settle()
    group = driver.state.groups.get(G)
    if group is None:
        return
    subscribed = {t for m in group.members.values() for t in m.subscription.topics}
    wanted = {(t, p) for t in subscribed for p in range(driver.topics.counts[t])}
    owners = driver.owners()
    assert set(owners) == wanted  # every subscribed partition owned, nothing else
    for member in group.members.values():
        assert member.assigned == group.target[member.member_id] and not member.revoking
        assert member.epoch == group.epoch
        assert all(tp[0] in member.subscription.topics for tp in member.assigned)
    if assignor == "uniform" and len({m.subscription for m in group.members.values()}) == 1:
        sizes = [len(m.assigned) for m in group.members.values()]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40), st.integers(0, 10_000))
def test_property_a_join_is_sticky(members: int, partitions: int, salt: int) -> None:
    # Goal: with like subscriptions, a newcomer takes only its share and old members only lose.
    driver = Driver({"t": partitions})
    for i in range(members):
        driver.join(f"m{(i * 7919 + salt) % 100_000}")
    driver.settle()
    before = {m: set(x.assigned) for m, x in driver.state.groups[G].members.items()}
    driver.join("newcomer")
    driver.settle()
    after = {m: set(x.assigned) for m, x in driver.state.groups[G].members.items()}
    for member, owned in before.items():
        assert after[member] <= owned
    moved = sum(len(owned - after[member]) for member, owned in before.items())
    assert moved == len(after["newcomer"]) in (partitions // (members + 1), -(-partitions // (members + 1)))


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, max_size=40))
def test_property_snapshots_restore_what_was_applied(operations: list[tuple]) -> None:
    driver = Driver(TOPICS)
    _run(driver, operations)
    data = encode_groups(driver.state)
    assert encode_groups(decode_groups(data)) == data


@pytest.mark.parametrize(("pattern", "name", "matches"), [
    ("orders-*", "orders-eu", True), ("orders-*", "orders", False), ("*", "x", True), ("a?c", "abc", True),
    ("a*b*c", "axxbyyc", True), ("a*b*c", "axxbyy", False), ("*a*a*a*a*a*b", "a" * 249, False),
    ("t", "t", True), ("t", "tt", False), ("**", "", True),
])
def test_glob_match(pattern: str, name: str, matches: bool) -> None:
    from multiraft.consumer_groups.topics import glob_match

    assert glob_match(pattern, name) is matches


def test_the_room_reads_no_clock_and_draws_no_randomness() -> None:
    # Goal: apply is deterministic: nothing in consumer_groups/ imports a clock or a random source.
    import ast
    from pathlib import Path

    import multiraft.consumer_groups as package

    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in {"time", "random", "uuid", "datetime", "os", "secrets"}, (path, name)


@settings(max_examples=100, deadline=None)
@given(st.lists(operation, max_size=30), st.integers(0, 5), st.sampled_from(["owned", "none", "stale"]))
def test_property_a_heartbeat_answered_without_a_write_changes_nothing(operations: list[tuple], who: int,
                                                                       report: str) -> None:
    # Goal: the coordinator answers a heartbeat from its applied state, without proposing it,
    # only when applying it would change nothing and answer the same.
    import copy

    driver = Driver(TOPICS)
    _run(driver, operations)
    group = driver.state.groups.get(G)
    member = group.members.get(f"m{who}") if group else None
    if member is None:
        return
    owned = {"owned": tuple(sorted(member.assigned)), "none": None,
             "stale": tuple(sorted(member.assigned | member.revoking))}[report]
    command = Heartbeat(group=G, member_id=member.member_id, member_epoch=member.epoch, owned=owned)
    needed, view = driver.state.plan_heartbeat(command, driver.topics)
    before = encode_groups(driver.state)
    applied = copy.deepcopy(driver.state).apply(driver.index + 1, command, driver.topics)
    if not needed:
        assert applied.value == view
        after = copy.deepcopy(driver.state)
        after.apply(driver.index + 1, command, driver.topics)
        assert encode_groups(after) == before


def test_mixed_subscriptions_balance_and_keep_what_only_they_can_take() -> None:
    # Goal: a member holding everything keeps first the topics nobody else subscribes to,
    # so a newcomer subscribed to two thirds of them gets an even half (not what is left).
    from multiraft.consumer_groups.assignors import uniform_assign

    counts = {f"t{i}": 10 for i in range(9)}
    everything = frozenset((t, p) for t in counts for p in range(10))
    subscriptions = {"a": tuple(sorted(counts)), "b": tuple(f"t{i}" for i in range(9) if i % 3)}
    result = uniform_assign(subscriptions, counts, {"a": everything})
    assert sorted(len(v) for v in result.values()) == [45, 45]
    assert {tp[0] for tp in result["a"]} >= {"t0", "t3", "t6"}  # only a could take these
    assert result["b"] <= everything and all(tp[0] in subscriptions["b"] for tp in result["b"])
    assert uniform_assign(subscriptions, counts, result) == result  # stable: nothing moves again
