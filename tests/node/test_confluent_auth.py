"""Goal: with tokens on, the Confluent REST v2 dialect asks the native routes' rights
(multiraft/http/access.py), answered in Confluent's codes: produce needs write on the
topic, a partition's offsets read; creating an instance needs read on some topic, and
only the token that created it (or an admin) may drive it, whatever rights another token
has; its calls need read on its subscription (or its manual assignment), and a subscribe,
assign or offsets call read on what it names; no token is 401 / 40101, too few rights
403 / 40301. A 3-node cluster in one event loop."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.node.test_auth import ADMIN
from tests.node.test_node_cluster import running_cluster_with_http

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


async def call(session: aiohttp.ClientSession, method: str, url: str, token: str | None, body: Any = None,
               content_type: str = V2) -> tuple[int, Any]:
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if body is None else json.dumps(body).encode()
    async with session.request(method, url, headers=headers, data=data) as answer:
        raw = await answer.read()
        return answer.status, json.loads(raw) if raw else None


async def test_the_dialect_asks_the_native_rights(tmp_path: Path) -> None:
    async with running_cluster_with_http(tmp_path, admin_token=ADMIN.encode()) as (_, servers):
        url = [s.url for s in servers]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            tokens = {}
            for name, rights in (("also-ca", ["read:ca"]), ("write-only", ["write:ca"])):
                status, made = await call(session, "POST", url[0] + "/v1/admin/tokens", ADMIN,
                                          {"name": name, "rights": rights}, "application/json")
                assert status == 201, made
                tokens[name] = made["token"]
            for topic in ("ca", "cb"):
                status, body = await call(session, "POST", url[0] + "/v1/topics", ADMIN,
                                          {"name": topic, "partitions": 2}, "application/json")
                assert status == 201, body
                status, made = await call(session, "POST", url[0] + "/v1/admin/tokens", ADMIN,
                                          {"name": f"rw-{topic}", "rights": [f"read:{topic}", f"write:{topic}"]},
                                          "application/json")
                assert status == 201, made
                tokens[topic] = made["token"]
            mine, other = tokens["ca"], tokens["cb"]
            record = {"records": [{"value": base64.b64encode(b"x").decode()}]}
            status, body = await call(session, "POST", url[1] + "/topics/ca", None, record, BINARY_V2)
            assert (status, body["error_code"]) == (401, 40101), body
            status, body = await call(session, "POST", url[1] + "/topics/ca", other, record, BINARY_V2)
            assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "POST", url[1] + "/topics/ca", mine, record, BINARY_V2)
            assert status == 200, body
            status, body = await call(session, "GET", url[2] + "/topics/ca/partitions/0/offsets", other)
            assert (status, body["error_code"]) == (403, 40301), body

            status, body = await call(session, "POST", url[0] + "/consumers/cauth", tokens["write-only"], {"name": "w"})
            assert (status, body["error_code"]) == (403, 40301), body  # no read right: no instance
            status, made = await call(session, "POST", url[0] + "/consumers/cauth", mine, {"name": "c1"})
            assert status == 200, made
            fresh = "/consumers/cauth/instances/c1"
            for method, path, body in (("POST", "/subscription", {"topics": ["ca"]}), ("DELETE", "", None),
                                       ("POST", "/assignments", {"partitions": [{"topic": "ca", "partition": 0}]})):
                # Not subscribed yet (no topic to check): still not another token's to drive.
                status, answer = await call(session, method, url[1] + fresh + path, tokens["also-ca"], body)
                assert (status, answer["error_code"]) == (403, 40301), (method, path, answer)
            base = "/consumers/cauth/instances/c1"
            status, body = await call(session, "POST", url[1] + base + "/subscription", mine, {"topics": ["cb"]})
            assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "POST", url[1] + base + "/subscription", mine, {"topic_pattern": "c*"})
            assert (status, body["error_code"]) == (403, 40301), body  # a pattern needs read:*
            status, body = await call(session, "POST", url[2] + base + "/subscription", mine, {"topics": ["ca"]})
            assert status == 204, body
            for node in range(3):  # another token, knowing the instance id, may not drive it
                status, body = await call(session, "GET", url[node] + base + "/assignments", other)
                assert (status, body["error_code"]) == (403, 40301), body
                # ... even with read on the instance's topic: the instance is its creator's
                status, body = await call(session, "GET", url[node] + base + "/records", tokens["also-ca"])
                assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "POST", url[1] + base + "/subscription", tokens["also-ca"],
                                      {"topics": ["ca"]})
            assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "GET", url[2] + base + "/subscription", ADMIN)
            assert (status, body) == (200, {"topics": ["ca"]})  # an admin may
            status, body = await call(session, "DELETE", url[0] + base, other)
            assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "GET", url[0] + base + "/offsets", mine,
                                      {"partitions": [{"topic": "cb", "partition": 0}]})
            assert (status, body["error_code"]) == (403, 40301), body
            status, body = await call(session, "GET", url[1] + base + "/assignments", mine)
            assert status == 200, body
            status, body = await call(session, "DELETE", url[2] + base, mine)
            assert status == 204, body
