"""Goal: a mirror link's record filter over HTTP (docs/mirror.md "Record filters", docs/http.md):
created, shown in the link document, the list and the status (and the document's schema
says so); malformed filters refused with the one error shape; a PATCH of it refused.
The level gate (below 3) is tested on the metadata leader in
tests/unit/test_record_filter_spec.py; the copy itself in tests/node/test_mirror_filter.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from multiraft.http.openapi import openapi_document
from tests.http.conftest import Cluster
from tests.http.test_api_mirror_tls import _shape_problems

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

SOURCE = "127.0.0.9:1"  # nothing listens: discovery fails quietly while the test looks at the link
FILTER = [{"key_prefix": "eu-"}, {"header": "tenant"}, {"header": "kind", "value": ""}]


def _body(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sources": [SOURCE], "topics": "filter-none-*", **fields}


async def test_a_record_filter_is_kept_shown_and_fixed(cluster: Cluster) -> None:
    document = openapi_document()
    try:
        status, created = await cluster.call("POST", 0, "/v1/admin/mirrors", json=_body("filtered",
                                                                                         record_filter=FILTER))
        assert status == 201 and created["record_filter"] == FILTER, created
        assert _shape_problems(document, "/v1/admin/mirrors", "post", "201", created) == []
        status, plain = await cluster.call("POST", 1, "/v1/admin/mirrors", json=_body("unfiltered"))
        assert status == 201 and plain["record_filter"] is None, plain
        status, listed = await cluster.call("GET", 2, "/v1/admin/mirrors")
        shown = {link["name"]: link["record_filter"] for link in listed["mirrors"]}
        assert shown["filtered"] == FILTER and shown["unfiltered"] is None, listed
        status, report = await cluster.call("GET", 1, "/v1/admin/mirrors/filtered")
        assert status == 200 and report["record_filter"] == FILTER, report
        for patch in ({"record_filter": [{"key_prefix": "us-"}]}, {"record_filter": None},
                      {"on_source_truncated": "stop", "record_filter": FILTER}):
            status, refused = await cluster.call("PATCH", 0, "/v1/admin/mirrors/filtered", json=patch)
            assert (status, refused["error_code"]) == (400, "INVALID_REQUEST") and "fixed" in refused["message"]
        status, report = await cluster.call("GET", 0, "/v1/admin/mirrors/filtered")
        assert report["record_filter"] == FILTER
    finally:
        for name in ("filtered", "unfiltered"):
            await cluster.call("DELETE", 0, f"/v1/admin/mirrors/{name}")


@pytest.mark.parametrize(("record_filter", "fragment"), [
    (None, "record_filter is a list"), ([], "record_filter is a list"), ({"key_prefix": "a"}, "record_filter is a list"),
    ([{"key_prefix": ""}], "1..256 UTF-8 bytes"), ([{"key_prefix": "é" * 129}], "1..256 UTF-8 bytes"),
    ([{"header": "a", "value": 1}], "a header value is a string"), ([{"header": "a", "key_prefix": "b"}], "clauses"),
    ([{"key_prefix": f"p{i}"} for i in range(17)], "1..16 clauses"), ([{"header": "a"}] * 2, "listed twice"),
])
async def test_malformed_filters_are_refused_with_the_one_error_shape(cluster: Cluster, record_filter: object,
                                                                      fragment: str) -> None:
    status, body = await cluster.call("POST", 0, "/v1/admin/mirrors", json=_body("bad", record_filter=record_filter))
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST") and fragment in body["message"], body
    assert set(body) == {"error_code", "message"}
    status, _ = await cluster.call("GET", 1, "/v1/admin/mirrors/bad")
    assert status == 404  # nothing was proposed
