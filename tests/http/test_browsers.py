"""Goal (issue 21, family 3): a web page the developer visits cannot drive a node:
no simple cross-site POST (415), no foreign Origin (403), no rebound host name (403);
clients that are not browsers see no change."""

from __future__ import annotations

import pytest

from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
BODY = '{"name": "csrf", "partitions": 1, "replication_factor": 1}'


@pytest.mark.parametrize(("headers", "status", "code"), [
    ({"Content-Type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403, "FORBIDDEN_ORIGIN"),
    ({"Content-Type": "application/json", "Origin": "null"}, 403, "FORBIDDEN_ORIGIN"),
    ({"Content-Type": "application/json", "Host": "evil.example:8080"}, 403, "FORBIDDEN_HOST"),
    ({"Content-Type": "application/json", "Host": "127.0.0.1.evil.example"}, 403, "FORBIDDEN_HOST"),
])
async def test_a_browser_request_from_elsewhere_creates_nothing(cluster: Cluster, headers: dict[str, str],
                                                                status: int, code: str) -> None:
    got, body = await cluster.call("POST", 0, "/v1/topics", data=BODY, headers=headers)
    assert (got, body["error_code"]) == (status, code), body
    got, body = await cluster.call("GET", 0, "/v1/topics/csrf")
    assert got == 404, body


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}",
                                  "node.localhost"])
async def test_hosts_a_node_answers_to(cluster: Cluster, host: str) -> None:
    port = cluster.servers[0].port
    got, body = await cluster.call("GET", 0, "/v1/health", headers={"Host": host.format(port=port)})
    assert got == 200, body


async def test_the_nodes_own_pages_may_post(cluster: Cluster) -> None:
    server = cluster.servers[1]
    origin = f"http://{server.host}:{server.port}"
    got, body = await cluster.call("POST", 1, "/v1/admin/leadership/balance", headers={"Origin": origin})
    assert got == 200, body
