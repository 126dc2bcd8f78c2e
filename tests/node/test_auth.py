"""Bearer tokens over real HTTP (multiraft/metadata/auth.py, multiraft/http/access.py): a 3-node
cluster started with an admin token, in one event loop, on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.client.http import AsyncClient, RaftlogError
from multiraft.node.node import Node
from tests.node.test_node_cluster import joiner_config, running_cluster_with_http, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
ADMIN = "admin-token-0123456789abcdef"


async def call(session: aiohttp.ClientSession, method: str, url: str, token: str | None = None,
               **kwargs: Any) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with session.request(method, url, headers=headers, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else await response.text()
        return response.status, body, response.headers


async def test_tokens_gate_every_route_by_its_right(tmp_path: Path) -> None:
    # Goal: with an admin token configured, a request without a valid token is 401
    # (WWW-Authenticate), one whose token lacks the right is 403 and changes nothing, and
    # the admin makes, lists, replaces and deletes per-topic tokens that every node knows.
    async with running_cluster_with_http(tmp_path, admin_token=ADMIN.encode()) as (nodes, servers):
        url = [s.url for s in servers]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            status, body, _ = await call(session, "GET", url[0] + "/v1/health")
            assert status == 200, "health is open"
            status, body, headers = await call(session, "GET", url[0] + "/v1/topics")
            assert (status, body["error_code"]) == (401, "UNAUTHENTICATED") and "Bearer" in headers["WWW-Authenticate"]
            status, body, _ = await call(session, "GET", url[0] + "/v1/topics", token="wrong-token-0123456789")
            assert status == 401
            status, body, _ = await call(session, "GET", url[0] + "/v1/nowhere")
            assert (status, body["error_code"]) == (401, "UNAUTHENTICATED"), "no route map for strangers"
            status, body, _ = await call(session, "GET", url[0] + "/v1/nowhere", ADMIN)
            assert (status, body["error_code"]) == (404, "NOT_FOUND")
            status, body, _ = await call(session, "PUT", url[0] + "/v1/topics", ADMIN)
            assert (status, body["error_code"]) == (405, "METHOD_NOT_ALLOWED")
            status, body, _ = await call(session, "POST", url[1] + "/v1/topics", ADMIN,
                                         json={"name": "t1", "partitions": 1})
            assert status == 201, body
            status, body, _ = await call(session, "POST", url[1] + "/v1/topics", ADMIN,
                                         json={"name": "t2", "partitions": 1})
            assert status == 201, body
            status, made, _ = await call(session, "POST", url[2] + "/v1/admin/tokens", ADMIN,
                                         json={"name": "reader", "rights": ["read:t1", "write:t1"]})
            assert status == 201 and made["rights"] == ["read:t1", "write:t1"], made
            token = made["token"]
            records = "/v1/topics/{}/partitions/0/records"

            # Every node knows the token (it lives in the catalog); its rights hold everywhere.
            for base in url:
                status, body, _ = await call(session, "POST", base + records.format("t1"), token,
                                             json={"records": [{"value": base}]})
                assert status == 200, body
            for _ in range(200):  # this replica learns the last commit a moment after the leader
                status, body, _ = await call(session, "GET", url[0] + records.format("t1"), token,
                                             params={"offset": 0})
                assert status == 200, body
                if len(body["records"]) == 3:
                    break
                await asyncio.sleep(0.02)
            assert len(body["records"]) == 3, body
            for method, path, kwargs in [
                ("POST", records.format("t2"), {"json": {"records": [{"value": 1}]}}),
                ("GET", records.format("t2"), {"params": {"offset": 0}}),
                ("POST", "/v1/topics", {"json": {"name": "t3"}}),
                ("DELETE", "/v1/topics/t1", {}),
                ("PATCH", "/v1/topics/t1", {"json": {"config": {"retention_ms": 1000}}}),
                ("GET", "/v1/admin/tokens", {}),
                ("POST", "/v1/groups/g/offsets", {"json": {"offsets": [{"topic": "t2", "partition": 0, "offset": 0}]}}),
                ("GET", "/v1/groups/g/offsets", {"params": {"topic": "t2"}}),
                ("POST", "/v1/topics/t1/partitions", {"json": {"count": 2}}),  # admin, even with write:t1
                ("POST", "/v1/admin/nodes/1/drain", {}),
                ("DELETE", "/v1/admin/nodes/1/drain", {}),
                ("GET", "/v1/admin/nodes/1/decommission", {}),
                ("POST", "/v1/admin/nodes/1/decommission", {}),
                ("DELETE", "/v1/admin/nodes/1/decommission", {}),
                ("GET", "/v1/admin/config", {}),
                ("POST", "/v1/admin/nodes/1/promote", {}),
                ("PATCH", "/v1/admin/config", {"json": {"replica_move_bytes_per_s": 1}}),
            ]:
                status, body, _ = await call(session, method, url[1] + path, token, **kwargs)
                assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), (method, path, body)
            status, body, _ = await call(session, "GET", url[1] + "/v1/topics/t2", token)
            assert status == 200, "any valid token reads the cluster's description"
            status, body, _ = await call(session, "POST", url[1] + "/v1/groups/g/offsets", token,
                                         json={"offsets": [{"topic": "t1", "partition": 0, "offset": 1}]})
            assert status == 200, body
            # Deleting a group reaches every topic it has offsets in: admin only, even for its committer.
            status, body, _ = await call(session, "DELETE", url[1] + "/v1/groups/g", token)
            assert (status, body["error_code"]) == (403, "NOT_AUTHORIZED"), body
            status, body, _ = await call(session, "GET", url[1] + "/v1/groups/g/offsets", token, params={"topic": "t1"})
            assert [o["offset"] for o in body["offsets"]] == [1], "the refused delete changed nothing"
            status, body, _ = await call(session, "DELETE", url[2] + "/v1/groups/g", ADMIN)
            assert status == 204, body
            assert "t3" not in nodes[0].catalog.topics and "t1" in nodes[0].catalog.topics, "refusals changed nothing"
            assert len(nodes[0].catalog.topics["t1"].partitions) == 1 and not nodes[0].catalog.drained_nodes()

            # The Python client carries a token; replacing it under the same name retires the old one.
            async with AsyncClient(url, token=token, attempts=1) as client:
                assert (await client.produce("t1", [{"value": "client"}]))[0]["offset"] == 3
            status, body, _ = await call(session, "GET", url[0] + "/v1/admin/tokens", ADMIN)
            assert body == {"tokens": [{"name": "reader", "rights": ["read:t1", "write:t1"]}]}
            status, remade, _ = await call(session, "POST", url[0] + "/v1/admin/tokens", ADMIN,
                                           json={"name": "reader", "rights": ["read:*"]})
            assert status == 201 and remade["token"] != token
            await until(lambda: all(len(n.catalog.tokens) == 1 and n.catalog.tokens["reader"].rights == ("read:*",)
                                    for n in nodes),
                        "the replacement everywhere")
            async with AsyncClient(url, token=token, attempts=1) as client:
                with pytest.raises(RaftlogError) as raised:
                    await client.list_topics()
                assert raised.value.code == "UNAUTHENTICATED" and not raised.value.retriable
            status, body, _ = await call(session, "GET", url[2] + records.format("t2"), remade["token"],
                                         params={"offset": 0})
            assert status == 200, "read:* reads every topic"
            status, _, _ = await call(session, "DELETE", url[1] + "/v1/admin/tokens/reader", ADMIN)
            assert status == 204
            await until(lambda: all(not n.catalog.tokens for n in nodes), "deleted everywhere")
            status, body, _ = await call(session, "GET", url[2] + "/v1/topics", remade["token"])
            assert status == 401
            status, body, _ = await call(session, "POST", url[0] + "/v1/admin/tokens", ADMIN,
                                         json={"name": "x", "rights": ["read:"]})
            assert (status, body["error_code"]) == (400, "INVALID_REQUEST")

            # The CLI: an admin makes, lists and deletes tokens. The token comes from
            # $RAFTLOG_TOKEN or --token-file (0600), never from the command line.
            async def cli(*args: str, env_token: str | None = ADMIN) -> tuple[int, str, str]:
                environment = {k: v for k, v in os.environ.items() if k != "RAFTLOG_TOKEN"}
                if env_token is not None:
                    environment["RAFTLOG_TOKEN"] = env_token
                argv = ["-m", "multiraft.cli", *args, "--server", url[1]]
                assert ADMIN not in " ".join(argv), "no token in argv"
                process = await asyncio.create_subprocess_exec(
                    sys.executable, *argv, env=environment,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(process.communicate(), 60)
                return process.returncode or 0, out.decode(), err.decode()

            code, out, err = await cli("token", "create", "ops", "--right", "read:t1", "--right", "admin")
            assert code == 0 and "shown once" in err, err
            code, out, err = await cli("token", "list", env_token=out.strip())  # the new token is an admin's
            assert code == 0 and "ops" in out and "admin, read:t1" in out, (out, err)
            saved = tmp_path / "tokens" / "ops.token"
            code, out, err = await cli("token", "create", "ops", "--right", "admin", "--output", str(saved))
            assert code == 0 and out == "" and f"written to {saved}" in err, (out, err)
            assert (saved.stat().st_mode & 0o777, saved.parent.stat().st_mode & 0o777) == (0o600, 0o700)
            code, out, err = await cli("token", "create", "ops", "--right", "admin", "--output", str(saved))
            assert code == 2 and "exists" in err, "never over an existing file"
            code, out, err = await cli("token", "list", "--token-file", str(saved), env_token="not-a-token-0123")
            assert code == 0 and "ops" in out, "--token-file wins over $RAFTLOG_TOKEN"
            saved.chmod(0o644)
            code, out, err = await cli("token", "list", "--token-file", str(saved), env_token=None)
            assert code == 2 and f"chmod 600 {saved}" in err, err
            code, out, err = await cli("token", "list", "--token", saved.read_text().strip(), env_token=None)
            assert code == 2 and "--token-file FILE" in err and saved.read_text().strip() not in err, err
            code, out, err = await cli("token", "delete", "ops")
            assert code == 0, err
            code, out, err = await cli("token", "list", env_token="not-a-token-0123456789")
            assert code == 1 and "UNAUTHENTICATED" in err, err
            code, out, err = await cli("token", "list", env_token=None)
            assert code == 1 and "UNAUTHENTICATED" in err, err

            # A node joining an authenticated cluster shows the admin token to be admitted.
            joiner = Node(dataclasses.replace(joiner_config(tmp_path, url[0]), admin_token=ADMIN.encode()))
            try:
                await joiner.start()
                await until(lambda: len(nodes[0].catalog.nodes) == 4, "the joiner admitted")
            finally:
                await joiner.stop()
