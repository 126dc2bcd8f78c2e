"""Goal: consumer groups over the native HTTP routes, on the package's in-process
3-node cluster, every member hopping between nodes: members split a topic evenly, a
join moves partitions incrementally (revoked before reassigned, never two owners),
a silent member's partitions go to the others after the group's session timeout and
are read from the committed offsets on, fenced commits are refused, and describe,
list and leave answer alike from every node."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from multiraft.consumer_groups import JoinGroup, Subscription, encode_groups
from multiraft.node import group_reads
from multiraft.node.registry import METADATA_GROUP
from raftlog.messages import Role
from tests.group_member import Member, no_two_owners, settle
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
PARTITIONS = 12


def _call(cluster: Cluster):  # type: ignore[no-untyped-def]
    """The member helper's call shape (node first) over the cluster's."""
    return lambda node, method, path, **kwargs: cluster.call(method, node, path, **kwargs)


async def _produce(cluster: Cluster, topic: str, per_partition: int) -> None:
    for partition in range(PARTITIONS):
        status, body = await cluster.call("POST", partition % 3, f"/v1/topics/{topic}/partitions/{partition}/records",
                                          json={"records": [{"value": f"{partition}-{i}"} for i in range(per_partition)]})
        assert status == 200, body


async def _drain(members: list[Member], expected: int) -> None:
    async with asyncio.timeout(30):
        while sum(len(m.consumed) for m in members) < expected:
            for member in members:
                await member.fetch(wait_ms=50)


async def test_members_split_a_topic_and_a_join_moves_partitions_incrementally(cluster: Cluster) -> None:
    await cluster.create_topic("cg-split", partitions=PARTITIONS)
    await _produce(cluster, "cg-split", 5)
    members = [Member(_call(cluster), 3, "split", start_node=i) for i in range(3)]
    for member in members:
        await member.join(["cg-split"])
        no_two_owners(members)
    await settle(members)
    assert sorted(len(m.owned) for m in members) == [4, 4, 4]
    await _drain(members, PARTITIONS * 5)
    assert len({(t, p, o) for t, p, o, _ in [c for m in members for c in m.consumed]}) == PARTITIONS * 5
    for member in members:
        status, body = await member.commit()
        assert status == 200, body
    before = {m.member_id: set(m.owned) for m in members}
    newcomer = Member(_call(cluster), 3, "split", start_node=1)
    view = await newcomer.join(["cg-split"])
    assert view["assignment"] == [] and view["state"] == "assigning"
    members.append(newcomer)
    await settle(members)
    assert sorted(len(m.owned) for m in members) == [3, 3, 3, 3]
    for member in members[:3]:
        assert member.owned <= before[member.member_id]  # sticky: old members only gave
    await newcomer.fetch()
    assert newcomer.consumed == []  # its partitions start at the commits the old owners made

    def replicas_agree() -> bool:  # every node applied group 0 as far, to the same group state
        applied = {n.groups[METADATA_GROUP].core.applied_index for n in cluster.nodes}
        return len(applied) == 1 and len({encode_groups(n.catalog_holder.groups) for n in cluster.nodes}) == 1

    await until(replicas_agree, "every node's group state equal")
    # describe and list from every node
    for node in range(3):
        status, described = await cluster.call("GET", node, "/v1/groups/split")
        assert status == 200, described
        assert described["state"] == "stable" and len(described["members"]) == 4
        assert all(row["lag"] == 0 and row["committed_offset"] == 5 for row in described["partitions"])
        status, listed = await cluster.call("GET", node, "/v1/groups")
        assert {"group": "split", "members": 4} .items() <= next(
            g for g in listed["groups"] if g["group"] == "split").items()
    for member in members:
        await member.leave()
    status, body = await cluster.call("GET", 2, "/v1/groups/split")
    assert status == 404 and body["error_code"] == "UNKNOWN_GROUP"


async def test_a_silent_members_partitions_move_after_the_session_timeout(cluster: Cluster) -> None:
    await cluster.create_topic("cg-expire", partitions=PARTITIONS)
    await _produce(cluster, "cg-expire", 4)
    members = [Member(_call(cluster), 3, "expire", start_node=i) for i in range(3)]
    for member in members:
        await member.join(["cg-expire"], session_timeout_ms=1500)
    await settle(members)
    # Everyone reads two records of each of its partitions and commits there.
    async with asyncio.timeout(30):
        while sum(len(m.consumed) for m in members) < PARTITIONS * 2:
            for member in members:
                await member.fetch(max_records=1)
    for member in members:
        assert (await member.commit())[0] == 200
    silent, survivors = members[0], members[1:]
    committed = dict(silent.positions)
    async with asyncio.timeout(15):
        while True:  # the survivors keep heartbeating; the silent one does not
            for member in survivors:
                await member.heartbeat()
            if sum(len(m.owned) for m in survivors) == PARTITIONS and all(
                    m.last["state"] == "stable" for m in survivors):
                break
            await asyncio.sleep(0.1)
    no_two_owners(survivors)
    status, body = await cluster.call("POST", 1, f"/v1/groups/expire/members/{silent.member_id}/heartbeat",
                                      json={"member_epoch": silent.epoch})
    assert (status, body["error_code"]) == (404, "UNKNOWN_MEMBER_ID")
    status, body = await silent.commit()
    assert (status, body["error_code"]) == (404, "UNKNOWN_MEMBER_ID")
    for member in survivors:
        member.consumed.clear()
    await _drain(survivors, PARTITIONS * 4 - sum(committed.values()) - 2 * 8)
    taken_over = [(t, p, o) for m in survivors for t, p, o, _ in m.consumed if (t, p) in committed]
    for tp, offset in committed.items():  # read again from the commit on: nothing skipped
        assert sorted(o for t, p, o in taken_over if (t, p) == tp) == list(range(offset, 4))


async def test_fenced_and_foreign_commits_are_refused(cluster: Cluster) -> None:
    await cluster.create_topic("cg-fence", partitions=2)
    a, b = Member(_call(cluster), 3, "fence"), Member(_call(cluster), 3, "fence", start_node=2)
    await a.join(["cg-fence"])
    await b.join(["cg-fence"])
    await settle([a, b])
    (mine,), (theirs,) = sorted(a.owned), sorted(b.owned)
    path = "/v1/groups/fence/offsets"

    def body(tp: tuple[str, int], **extra: object) -> dict[str, object]:
        return {"offsets": [{"topic": tp[0], "partition": tp[1], "offset": 0}], **extra}

    status, answer = await cluster.call("POST", 0, path, json=body(mine, member_id=a.member_id,
                                                                      member_epoch=a.epoch))
    assert status == 200, answer
    for node in range(3):
        status, answer = await cluster.call("POST", node, path, json=body(theirs, member_id=a.member_id,
                                                                             member_epoch=a.epoch))
        assert (status, answer["error_code"]) == (409, "PARTITION_NOT_ASSIGNED")
        status, answer = await cluster.call("POST", node, path, json=body(mine, member_id=a.member_id,
                                                                             member_epoch=a.epoch + 7))
        assert (status, answer["error_code"]) == (409, "FENCED_MEMBER_EPOCH")
        status, answer = await cluster.call("POST", node, path, json=body(mine))
        assert (status, answer["error_code"]) == (409, "NON_EMPTY_GROUP")
    status, answer = await cluster.call("POST", 1, path, json=body(theirs, admin_reset=True))
    assert status == 200, answer
    status, answer = await cluster.call("POST", 1, "/v1/groups/fence/members", json={"topics": ["cg-fence"],
                                                                                     "session_timeout_ms": 999})
    assert (status, answer["error_code"]) == (409, "INCONSISTENT_GROUP_CONFIG")
    await a.leave()
    await b.leave()


async def test_a_long_poll_is_bounded_by_half_the_session_and_keeps_the_member(cluster: Cluster) -> None:
    # Goal: a member that owns nothing (one partition, two members) long-polls with a
    # wait far past its session timeout: the answer comes after half the session, and
    # polling so keeps it a member.
    await cluster.create_topic("cg-poll", partitions=1)
    owner, idle = Member(_call(cluster), 3, "poll"), Member(_call(cluster), 3, "poll", start_node=1)
    await owner.join(["cg-poll"], session_timeout_ms=1000)
    await idle.join(["cg-poll"])
    await settle([owner, idle])
    assert not idle.owned
    loop = asyncio.get_running_loop()
    for _ in range(3):  # 1.5 s in all, past the 1 s session, kept alive by the polls themselves
        started = loop.time()
        assert await idle.fetch(wait_ms=30_000) == []
        assert 0.4 <= loop.time() - started < 5
        await owner.heartbeat()
    assert idle.last["state"] == "stable"
    await owner.leave()
    await idle.leave()


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/groups/bad/members", {"topics": [{}]}),
    ("/v1/groups/bad/members", {"topics": [["a"]], "topic_pattern": "x*"}),
    ("/v1/groups/bad/members", {"topics": ["a"], "topic_pattern": "a*"}),
    ("/v1/groups/bad/members", {"topic_pattern": "(a+)+$"}),
    ("/v1/groups/bad/members", {"topics": ["a"], "session_timeout_ms": True}),
    ("/v1/groups/bad/members/m1/heartbeat", {"member_epoch": 1, "owned": [{"topic": "a", "partitions": [[1]]}]}),
    ("/v1/groups/bad/members/m1/heartbeat", {"member_epoch": 1, "owned": [{"topic": {}, "partitions": [1]}]}),
    ("/v1/groups/bad/members/m1/heartbeat", {"member_epoch": -1}),
    ("/v1/groups/bad/members/m1/records", {"member_epoch": 1, "positions": [{"topic": [], "partition": 0,
                                                                             "offset": 0}]}),
    ("/v1/groups/bad/members/m1/records", {"member_epoch": 1, "wait_ms": 10**9}),
    ("/v1/groups/bad/offsets", {"offsets": [{"topic": "a", "partition": 0, "offset": 0}], "member_id": {}}),
])
async def test_malformed_member_calls_are_400(cluster: Cluster, path: str, body: dict) -> None:
    # Goal: bad member input is refused with the one error shape, never a 500.
    status, answer = await cluster.call("POST", 0, path, json=body)
    assert (status, answer["error_code"]) == (400, "INVALID_REQUEST"), answer


async def test_a_join_whose_caller_is_cancelled_still_expires(cluster: Cluster) -> None:
    # Goal: a join's caller cancelled after the proposal went out (as the HTTP deadline
    # does) still leaves a member the coordinator knows of when the entry applies, so
    # it expires after its session timeout instead of holding partitions for ever.
    await cluster.create_topic("cg-ghost", partitions=2)
    node = next(n for n in cluster.nodes if n.groups[METADATA_GROUP].core.role is Role.LEADER)
    runtime = node.groups[METADATA_GROUP]
    command = JoinGroup(group="ghost", member_id="ghost", subscription=Subscription(topics=("cg-ghost",)),
                        session_timeout_ms=500)
    last = runtime.core.log.last_index()
    task = asyncio.ensure_future(node.group_coordinator.command(command))
    async with asyncio.timeout(5):
        while runtime.core.log.last_index() == last:
            await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await until(lambda: "ghost" in node.catalog_holder.groups.groups, "the join applied")
    await until(lambda: node.group_coordinator.sessions.seen_ms("ghost", "ghost") is not None, "the member noted")
    await until(lambda: "ghost" not in node.catalog_holder.groups.groups, "the member expired", timeout_s=10)


async def test_a_long_poll_over_more_partitions_than_reads_in_flight_waits_once(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a member's long-poll over more partitions than run at once (three rounds here)
    # waits `wait_ms` in all, one deadline shared by every read, not once per round,
    # which would run past the session it is bounded by.
    monkeypatch.setattr(group_reads, "READS_IN_FLIGHT_MAX", 2)
    await cluster.create_topic("cg-rounds", partitions=6)
    member = Member(_call(cluster), 3, "rounds")
    await member.join(["cg-rounds"], session_timeout_ms=2000)
    assert len(member.owned) == 6
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await member.fetch(wait_ms=1000) == []
    assert 0.9 <= loop.time() - started < 1.8
    await member.leave()


async def test_describe_and_fetch_meet_partitions_their_catalog_does_not_have(cluster: Cluster) -> None:
    # Goal: never a 500 from client-reachable state. A topic deleted and created again with
    # fewer partitions leaves the group's resolved counts stale until a member heartbeats:
    # describe lists only the partitions that exist. A node whose catalog trails the
    # coordinator's (here: a coordinator answer naming partitions this node lacks) answers
    # a fetch with those partitions in `errors`, the others read as usual.
    await cluster.create_topic("cg-shrink", partitions=4, replication_factor=1)
    member = Member(_call(cluster), 3, "shrink")
    await member.join(["cg-shrink"])
    status, body = await cluster.call("DELETE", 0, "/v1/topics/cg-shrink")
    assert status == 204, body
    await until(lambda: all("cg-shrink" not in n.catalog.topics for n in cluster.nodes), "the delete applied")
    await cluster.create_topic("cg-shrink", partitions=2, replication_factor=1)
    for node in range(3):
        status, described = await cluster.call("GET", node, "/v1/groups/shrink")
        assert status == 200, described
        assert {row["partition"] for row in described["partitions"]} <= {0, 1}
    await cluster.create_topic("cg-trail", partitions=2)
    follower = next(n for n in cluster.nodes if n.groups[METADATA_GROUP].core.role is not Role.LEADER)
    index = cluster.nodes.index(follower)
    real = follower.group_coordinator.command

    async def trailing(command):  # type: ignore[no-untyped-def]
        view = await real(command)
        return {**view, "assignment": [{"topic": "cg-trail", "partitions": [0, 1, 5]},
                                       {"topic": "cg-not-yet", "partitions": [0]}]}

    follower.group_coordinator.command = trailing  # type: ignore[method-assign]
    try:
        status, body = await cluster.call("POST", index, f"/v1/groups/shrink/members/{member.member_id}/records",
                                          json={"member_epoch": member.epoch, "auto_offset_reset": "earliest"})
    finally:
        del follower.group_coordinator.command
    assert status == 200, body
    assert sorted((e["topic"], e["partition"]) for e in body["errors"]) == [("cg-not-yet", 0), ("cg-trail", 5)]
    assert sorted((p["topic"], p["partition"]) for p in body["positions"]) == [("cg-trail", 0), ("cg-trail", 1)]
    await member.heartbeat()
    await member.leave()
