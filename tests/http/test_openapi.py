"""Goal: the OpenAPI document served at /v1/openapi.json matches what is served:
every route of the app is documented with its path parameters, every documented
operation is routed, and each documented path answers something other than 404
or 405 (so neither side can drift)."""

from __future__ import annotations

import json
import re

import pytest
from aiohttp import web

from multiraft.http import ROUTES
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
METHODS = {"get", "post", "put", "delete", "patch"}


def _served(app: web.Application) -> set[tuple[str, str]]:
    served = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("formatter") or info.get("path")
        if path.startswith("/v1/debug/"):
            continue  # the chaos runner's routes (RAFTLOG_CHAOS_DEBUG=1): not public API, not documented
        served.add((route.method.lower(), path))
    return served


def _documented(document: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items() for method in item if method in METHODS}


async def test_document_and_routes_agree(cluster: Cluster) -> None:
    status, document = await cluster.call("GET", 0, "/v1/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    documented = _documented(document)
    declared = {(m.lower(), p) for m, p, _ in ROUTES}
    assert declared == documented, f"undocumented: {declared - documented}; unserved: {documented - declared}"
    app = cluster.servers[0]._runner.app  # type: ignore[union-attr]
    assert _served(app) == declared, "the app serves exactly ROUTES"
    for path, item in document["paths"].items():
        names = set(re.findall(r"{(\w+)}", path))
        declared_params = {p["name"] for p in item.get("parameters", []) if p["in"] == "path"}
        for method in set(item) & METHODS:
            declared_params |= {p["name"] for p in item[method].get("parameters", []) if p["in"] == "path"}
            assert item[method]["responses"], f"{method} {path} documents its answers"
        assert names == declared_params, f"{path}: path parameters {names} vs documented {declared_params}"


async def test_every_documented_operation_is_reachable(cluster: Cluster) -> None:
    _, document = await cluster.call("GET", 0, "/v1/openapi.json")
    for method, path in sorted(_documented(document)):
        # A Confluent instance made here lives on in its group: keep it out of the native tests' group g.
        group = "g" if path.startswith("/v1") else "openapi-reachable"
        concrete = path.replace("{topic}", "no-such-topic").replace("{partition}", "0").replace("{group}", group) \
            .replace("{member}", "m").replace("{instance}", "i").replace("{node}", "9").replace("{name}", "no-link")
        if method == "delete":
            continue  # deleting is exercised in the topic tests; here nothing must be removed
        status, body = await cluster.call(method.upper(), 1, concrete, json={} if method == "post" else None)
        if isinstance(body, bytes) and body.startswith(b"{"):  # the Confluent dialect's vnd.kafka JSON
            body = json.loads(body)
        # Unrouted: NOT_FOUND / METHOD_NOT_ALLOWED, or in Confluent's codes a bare 404 / 405 (40401... is a handler's).
        unrouted = ("NOT_FOUND", "METHOD_NOT_ALLOWED", 404, 405)
        assert status not in (404, 405) or (isinstance(body, dict) and body.get("error_code") not in unrouted), \
            (method, path)
        assert status < 500 or status == 501, (method, path, status, body)
