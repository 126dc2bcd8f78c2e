"""Goal: with tokens on, consumer groups follow Kafka's group ACLs in terms of our per-topic
rights (multiraft/http/access.py): a member's calls (heartbeat, fetch, leave, a join that
re-uses its id) need read on the member's subscription, describe needs read on every
member's and shows member ids and epochs (the proof of membership) only to admin, and a
list shows a token only the groups it may describe. A 3-node cluster in one event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.node.test_auth import ADMIN, call
from tests.node.test_node_cluster import running_cluster_with_http

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_member_calls_need_the_groups_read_and_describe_hides_member_ids(tmp_path: Path) -> None:
    async with running_cluster_with_http(tmp_path, admin_token=ADMIN.encode()) as (_, servers):
        url = [s.url for s in servers]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            tokens = {}
            for topic in ("ga", "gb"):
                status, body, _ = await call(session, "POST", url[0] + "/v1/topics", ADMIN,
                                             json={"name": topic, "partitions": 2})
                assert status == 201, body
                status, made, _ = await call(session, "POST", url[0] + "/v1/admin/tokens", ADMIN,
                                             json={"name": f"reader-{topic}", "rights": [f"read:{topic}"]})
                assert status == 201, made
                tokens[topic] = made["token"]
            mine, other = tokens["ga"], tokens["gb"]
            status, view, _ = await call(session, "POST", url[1] + "/v1/groups/gauth/members", mine,
                                         json={"topics": ["ga"]})
            assert status == 200, view
            member, epoch = view["member_id"], view["member_epoch"]
            base = f"/v1/groups/gauth/members/{member}"
            # Another token, even one that knows the member id, may not act as the member.
            for node in range(3):
                status, body, _ = await call(session, "POST", url[node] + base + "/heartbeat", other,
                                             json={"member_epoch": epoch})
                assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "POST", url[2] + base + "/records", other,
                                         json={"member_epoch": epoch})
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "DELETE", url[0] + base, other, params={"member_epoch": epoch})
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "POST", url[0] + "/v1/groups/gauth/members", other,
                                         json={"topics": ["gb"], "member_id": member})
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "GET", url[0] + "/v1/groups/gauth", other)
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, listed, _ = await call(session, "GET", url[0] + "/v1/groups", other)
            assert status == 200 and listed["groups"] == [], listed
            # The member's own token: describe without ids, list with the group.
            for _ in range(100):  # a describe names each partition's offsets: node 3 may not know
                status, described, _ = await call(session, "GET", url[2] + "/v1/groups/gauth", mine)
                if status != 503:  # a new partition's leader yet (LEADER_NOT_AVAILABLE, retriable)
                    break
                await asyncio.sleep(0.1)
            assert status == 200, described
            assert [(m["member_id"], m["member_epoch"]) for m in described["members"]] == [(None, None)]
            assert all(row["owner"] is None for row in described["partitions"])
            status, listed, _ = await call(session, "GET", url[1] + "/v1/groups", mine)
            assert [g["group"] for g in listed["groups"]] == ["gauth"], listed
            status, described, _ = await call(session, "GET", url[1] + "/v1/groups/gauth", ADMIN)
            assert [m["member_id"] for m in described["members"]] == [member], described
            # An unknown member is 404 whoever asks; the member itself goes on.
            status, body, _ = await call(session, "POST", url[0] + "/v1/groups/gauth/members/nobody/heartbeat",
                                         other, json={"member_epoch": 0})
            assert (status, body["error_code"]) == (404, "UNKNOWN_MEMBER_ID"), body
            for node in range(3):
                status, body, _ = await call(session, "POST", url[node] + base + "/heartbeat", mine,
                                             json={"member_epoch": epoch})
                assert status == 200, body
            status, body, _ = await call(session, "POST", url[1] + base + "/records", mine,
                                         json={"member_epoch": epoch})
            assert status == 200, body
            status, body, _ = await call(session, "DELETE", url[2] + base, mine, params={"member_epoch": epoch})
            assert status == 204, body
            # An offset reset is admin's (it moves where every future member starts), even
            # for a token that may read every topic it names.
            reset = {"strategy": "earliest", "topics": [{"topic": "ga"}]}
            status, body, _ = await call(session, "POST", url[1] + "/v1/groups/gauth/offsets/reset", mine,
                                         json=reset)
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "POST", url[1] + "/v1/groups/gauth/offsets/reset", ADMIN,
                                         json=reset)
            assert status == 200 and body["executed"] is False, body
