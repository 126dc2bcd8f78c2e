"""Goal: the mirror link routes take `on_source_truncated` (POST /v1/admin/mirrors, and its
change in place, PATCH /v1/admin/mirrors/{name}) and refuse every malformed value with the one
error shape (400 INVALID_REQUEST naming the field), never a 5xx; an accepted link shows its
policy (create, change, list, status) in the OpenAPI document's shape, and /metrics names the
counter of truncated resyncs. What the policy does: tests/node/test_mirror_truncated.py."""

from __future__ import annotations

from typing import Any

import pytest

from multiraft.http.openapi import openapi_document
from tests.http.conftest import Cluster
from tests.http.test_api_mirror_tls import _body, _shape_problems

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

MALFORMED: tuple[Any, ...] = ("", "earliest", "RESYNC", None, 1, True, ["resync"], {"resync": True})


async def test_malformed_policies_are_refused_with_the_one_error_shape(cluster: Cluster) -> None:
    for value in MALFORMED:
        status, body = await cluster.call("POST", 0, "/v1/admin/mirrors",
                                          json=_body("trunc-bad", on_source_truncated=value))
        assert status == 400 and body == {"error_code": "INVALID_REQUEST",
                                          "message": "on_source_truncated is stop or resync"}, (value, body)
    status, body = await cluster.call("GET", 1, "/v1/admin/mirrors/trunc-bad")
    assert status == 404, body  # nothing was proposed
    try:
        status, created = await cluster.call("POST", 0, "/v1/admin/mirrors", json=_body("trunc-alter"))
        assert status == 201 and created["on_source_truncated"] == "stop", created
        for value in MALFORMED:
            status, body = await cluster.call("PATCH", 1, "/v1/admin/mirrors/trunc-alter",
                                              json={"on_source_truncated": value})
            assert status == 400 and body["error_code"] == "INVALID_REQUEST", (value, body)
            assert "on_source_truncated" in body["message"] and set(body) == {"error_code", "message"}
        for bad_body in ({}, {"state": "paused"}, {"on_source_truncated": "resync", "priority": "high"}, [1]):
            status, body = await cluster.call("PATCH", 2, "/v1/admin/mirrors/trunc-alter", json=bad_body)
            assert status == 400 and body["error_code"] == "INVALID_REQUEST", (bad_body, body)
        status, body = await cluster.call("PATCH", 2, "/v1/admin/mirrors/trunc-none",
                                          json={"on_source_truncated": "resync"})
        assert status == 404 and body["error_code"] == "UNKNOWN_MIRROR_LINK", body
        status, shown = await cluster.call("GET", 0, "/v1/admin/mirrors/trunc-alter")
        assert status == 200 and shown["on_source_truncated"] == "stop", shown  # no refusal changed it
    finally:
        status, _ = await cluster.call("DELETE", 0, "/v1/admin/mirrors/trunc-alter")
        assert status in (204, 404)


async def test_a_link_shows_its_policy_and_it_changes_in_place(cluster: Cluster) -> None:
    document = openapi_document()
    try:
        status, created = await cluster.call("POST", 0, "/v1/admin/mirrors",
                                             json=_body("trunc-re", on_source_truncated="resync", priority="low"))
        assert status == 201 and created["on_source_truncated"] == "resync", created
        assert _shape_problems(document, "/v1/admin/mirrors", "post", "201", created) == []
        status, altered = await cluster.call("PATCH", 1, "/v1/admin/mirrors/trunc-re",
                                             json={"on_source_truncated": "stop"})
        assert status == 200 and altered["on_source_truncated"] == "stop", altered
        assert {k: v for k, v in altered.items() if k != "on_source_truncated"} == \
            {k: v for k, v in created.items() if k != "on_source_truncated"}, "nothing else changed"
        assert _shape_problems(document, "/v1/admin/mirrors/{name}", "patch", "200", altered) == []
        status, altered = await cluster.call("PATCH", 2, "/v1/admin/mirrors/trunc-re",
                                             json={"on_source_truncated": "resync"})
        assert status == 200 and altered["on_source_truncated"] == "resync", altered
        status, listed = await cluster.call("GET", 2, "/v1/admin/mirrors")
        assert status == 200
        assert {link["name"]: link["on_source_truncated"] for link in listed["mirrors"]}["trunc-re"] == "resync"
        assert _shape_problems(document, "/v1/admin/mirrors", "get", "200", listed) == []
        status, report = await cluster.call("GET", 1, "/v1/admin/mirrors/trunc-re")
        assert status == 200 and report["on_source_truncated"] == "resync", report
        assert _shape_problems(document, "/v1/admin/mirrors/{name}", "get", "200", report) == []
        status, metrics = await cluster.call("GET", 0, "/metrics")
        assert status == 200 and b"# TYPE raftlog_mirror_truncated_resyncs_total counter" in metrics
    finally:
        status, _ = await cluster.call("DELETE", 0, "/v1/admin/mirrors/trunc-re")
        assert status in (204, 404)
