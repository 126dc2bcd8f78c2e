"""Goal: consumer groups over three real `raftlog serve` processes, every member call
hopping to the next node (so most are forwarded to the coordinator): three members
split a 12-partition topic evenly; a fourth joins and partitions move incrementally,
never owned twice and never read twice without a cause; a member that stops
heartbeating loses its partitions after the group's (short) session timeout and the
survivors read them from its committed offsets on, skipping nothing; a fenced
member's commit is refused. Then the coordinator's process is killed: the group
survives in Raft, its members are not expired by the new coordinator while they go on
through the live nodes, and the new coordinator expires a member that goes silent.

Its own ports (17800/18800), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from tests.free_ports import process_cluster
from tests.group_member import Member, no_two_owners, settle
from tests.integration.conftest import call, create_topic, until

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
PARTITIONS = 12
RECORDS_PER_PARTITION = 6
SESSION_TIMEOUT_MS = 4000  # long enough that members idle while others work are not expired on a busy box


@pytest.fixture(scope="module")
def groups_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("groups-processes")
    with process_cluster(directory, HOSTS, 17800, 18800, "the consumer group integration tests") as local:
        yield local


def _caller(session: aiohttp.ClientSession, cluster: LocalCluster, live: list[int] | None = None) -> Any:
    """The member helper's call: node index -> one of `live` (default: every node)."""
    servers = cluster.http_addresses

    async def do(node: int, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        chosen = live[node % len(live)] if live else node
        for _ in range(50):  # a leadership change answers 421/503 for a moment: retry as a client would
            status, body = await call(session, servers[chosen], method, path, **kwargs)
            if status not in (421, 503) or body.get("error_code") not in (
                    "NOT_LEADER", "LEADER_NOT_AVAILABLE", "PROPOSAL_DROPPED"):
                return status, body
            await asyncio.sleep(0.1)
        return status, body

    return do


async def _produce(session: aiohttp.ClientSession, cluster: LocalCluster, topic: str) -> None:
    for partition in range(PARTITIONS):
        status, body = await call(session, cluster.http_addresses[partition % 3], "POST",
                                  f"/v1/topics/{topic}/partitions/{partition}/records",
                                  json={"records": [{"value": i} for i in range(RECORDS_PER_PARTITION)]})
        assert status == 200, body


@pytest.mark.asyncio
async def test_members_split_move_take_over_and_are_fenced(groups_cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, groups_cluster, "orders", PARTITIONS)
        await _produce(session, groups_cluster, "orders")
        do = _caller(session, groups_cluster)
        members = [Member(do, 3, "billing", start_node=i) for i in range(3)]
        for member in members:
            await member.join(["orders"], session_timeout_ms=SESSION_TIMEOUT_MS)
        await settle(members)
        assert sorted(len(m.owned) for m in members) == [4, 4, 4]

        # Each reads half of each of its partitions and commits there.
        async with asyncio.timeout(30):
            for member in members:
                while any(member.positions.get(tp, 0) < RECORDS_PER_PARTITION // 2 for tp in member.owned):
                    await member.fetch(max_records=1)
        for member in members:
            status, body = await member.commit()
            assert status == 200, body
        consumed_before = [c for m in members for c in m.consumed]

        # A fourth joins: partitions move incrementally (each old member gives one; the
        # newcomer reads them from the commits, so nothing is read twice).
        before = {m.member_id: set(m.owned) for m in members}
        newcomer = Member(do, 3, "billing", start_node=2)
        await newcomer.join(["orders"])
        members.append(newcomer)
        await settle(members)
        no_two_owners(members)
        assert sorted(len(m.owned) for m in members) == [3, 3, 3, 3]
        for member in members[:3]:
            assert member.owned <= before[member.member_id]
        async with asyncio.timeout(30):
            while len(newcomer.consumed) < 3 * (RECORDS_PER_PARTITION - RECORDS_PER_PARTITION // 2):
                await newcomer.fetch(wait_ms=100)
        seen = {(t, p, o) for t, p, o, _ in consumed_before}
        assert not seen & {(t, p, o) for t, p, o, _ in newcomer.consumed}  # nothing read twice
        status, body = await newcomer.commit()
        assert status == 200, body

        # A fenced member's commit is refused, through every node.
        victim = members[1]
        mine = sorted(victim.owned)[0]
        offsets = [{"topic": mine[0], "partition": mine[1], "offset": 1}]
        for node in range(3):
            status, body = await do(node, "POST", "/v1/groups/billing/offsets", json={
                "member_id": victim.member_id, "member_epoch": victim.epoch + 3, "offsets": offsets})
            assert (status, body["error_code"]) == (409, "FENCED_MEMBER_EPOCH")
            other = sorted(members[2].owned)[0]
            status, body = await do(node, "POST", "/v1/groups/billing/offsets", json={
                "member_id": victim.member_id, "member_epoch": victim.epoch,
                "offsets": [{"topic": other[0], "partition": other[1], "offset": 1}]})
            assert (status, body["error_code"]) == (409, "PARTITION_NOT_ASSIGNED")

        # One member stops heartbeating: after the session timeout its partitions go to
        # the others, who read them from its commits on (no record skipped).
        silent = members[0]
        survivors = members[1:]
        committed = {tp: silent.positions[tp] for tp in silent.owned}
        async with asyncio.timeout(30):
            while not (sum(len(m.owned) for m in survivors) == PARTITIONS
                       and all(m.last["state"] == "stable" for m in survivors)):
                for member in survivors:
                    await member.heartbeat()
                    no_two_owners(survivors)
                await asyncio.sleep(0.2)
        status, body = await do(0, "POST", f"/v1/groups/billing/members/{silent.member_id}/heartbeat",
                                json={"member_epoch": silent.epoch})
        assert (status, body["error_code"]) == (404, "UNKNOWN_MEMBER_ID")
        status, body = await silent.commit()
        assert (status, body["error_code"]) == (404, "UNKNOWN_MEMBER_ID")
        for member in survivors:
            member.consumed.clear()
        async with asyncio.timeout(30):
            while sum(len(m.consumed) for m in survivors) < sum(RECORDS_PER_PARTITION - o
                                                               for o in committed.values()):
                for member in survivors:
                    await member.fetch(wait_ms=50)
        for tp, offset in committed.items():
            read = sorted(o for m in survivors for t, p, o, _ in m.consumed if (t, p) == tp)
            assert read == list(range(offset, RECORDS_PER_PARTITION)), (tp, read)

        # The group has members: a commit without one, another session timeout, a delete: refused.
        status, body = await do(2, "POST", "/v1/groups/billing/offsets", json={"offsets": offsets})
        assert (status, body["error_code"]) == (409, "NON_EMPTY_GROUP")
        status, body = await do(0, "POST", "/v1/groups/billing/members", json={"topics": ["orders"],
                                                                             "session_timeout_ms": 45_000})
        assert (status, body["error_code"]) == (409, "INCONSISTENT_GROUP_CONFIG")
        status, body = await do(1, "DELETE", "/v1/groups/billing")
        assert (status, body["error_code"]) == (409, "NON_EMPTY_GROUP")

        status, described = await do(1, "GET", "/v1/groups/billing")
        assert status == 200 and len(described["members"]) == 3, described
        assert {r["partition"] for r in described["partitions"]} == set(range(PARTITIONS))
        for member in survivors:
            await member.leave()
        status, body = await do(1, "DELETE", "/v1/groups/billing")
        assert status == 204, body  # no members left: its offsets go


@pytest.mark.asyncio
async def test_the_group_survives_its_coordinators_death_and_members_get_a_full_session(
        groups_cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, groups_cluster, "payments", 6)
        _, view = await call(session, groups_cluster.http_addresses[0], "GET", "/v1/cluster")
        coordinator = int(view["metadata_leader"])
        live = [i for i in range(3) if i + 1 != coordinator]
        do = _caller(session, groups_cluster, live)
        members = [Member(do, 2, "audit", start_node=i) for i in range(2)]
        for member in members:
            await member.join(["payments"], session_timeout_ms=SESSION_TIMEOUT_MS)
        await settle(members)
        epochs = [m.epoch for m in members]
        groups_cluster.kill_node(coordinator)

        async def new_coordinator() -> int | None:
            _, now = await call(session, groups_cluster.http_addresses[live[0]], "GET", "/v1/cluster")
            leader = now.get("metadata_leader")
            return leader if leader and leader != coordinator else None

        await until(new_coordinator, "a new metadata leader", timeout_s=20)
        # Heartbeats go on through the live nodes: nobody is expired, nothing moves.
        async with asyncio.timeout(30):
            for _ in range(30):  # about 3 s of heartbeats through the live nodes
                for member in members:
                    await member.heartbeat()
                await asyncio.sleep(0.1)
        assert [m.epoch for m in members] == epochs
        assert sorted(len(m.owned) for m in members) == [3, 3]
        no_two_owners(members)
        # The new coordinator expires too: one member goes silent, the other takes all.
        survivor = members[0]
        async with asyncio.timeout(30):
            while len(survivor.owned) < 6 or survivor.last["state"] != "stable":
                await survivor.heartbeat()
                await asyncio.sleep(0.1)
        groups_cluster.start_node(coordinator)
        await survivor.leave()
