"""Goal: the route that creates mirror links (POST /v1/admin/mirrors) takes a source's
TLS settings (`source_tls`, `source_ca`) and refuses every malformed one with the one
error shape (400 INVALID_REQUEST, a message saying what is wrong), a CA bundle this
node's OpenSSL refuses included; an accepted HTTPS link is shown (create, list, status)
with its scheme and its CA summed up, never the bundle, in the OpenAPI document's shape.
The copy over TLS itself: tests/node/test_mirror_tls.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from multiraft.http.openapi import openapi_document
from tests.http.conftest import Cluster
from tests.tls_pki import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

SOURCE = "127.0.0.9:1"  # nothing listens: discovery fails quietly while the test looks at the link


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _body(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sources": [SOURCE], "topics": "tls-none-*", **fields}


async def test_tls_fields_malformed_are_refused_with_the_one_error_shape(cluster: Cluster, pki: Pki) -> None:
    ca, key = pki.ca.cert.read_text(), pki.ca.key.read_text()
    shaped_not_a_certificate = base64.b64encode(b"\x30\x03\x02\x01\x01").decode()
    for fields, fragment in (
        ({"source_tls": "true"}, "source_tls is true or false"),
        ({"source_tls": None}, "source_tls is true or false"),
        ({"source_ca": ca}, "set source_tls too"),
        ({"source_tls": False, "source_ca": ca}, "set source_tls too"),
        ({"source_tls": True, "source_ca": ["-----BEGIN CERTIFICATE-----"]}, "PEM text"),
        ({"source_tls": True, "source_ca": "not a certificate"}, "holds no PEM certificate"),
        ({"source_tls": True, "source_ca": ca + key}, "private key"),
        ({"source_tls": True, "source_ca": ca * (65536 // len(ca) + 1)}, "larger than 65536 bytes"),
        ({"source_tls": True, "source_ca": "-----BEGIN CERTIFICATE-----\n" + shaped_not_a_certificate
          + "\n-----END CERTIFICATE-----\n"}, "OpenSSL takes no CA certificate"),
        ({"source_tls": True, "source_cert": ca}, "body is"),
    ):
        status, body = await cluster.call("POST", 0, "/v1/admin/mirrors", json=_body("tls-bad", **fields))
        assert status == 400, (fields, body)
        assert body["error_code"] == "INVALID_REQUEST" and fragment in body["message"], (fields, body)
        assert set(body) == {"error_code", "message"} and ca.splitlines()[1] not in body["message"]  # not echoed
    status, body = await cluster.call("GET", 1, "/v1/admin/mirrors/tls-bad")
    assert status == 404, body  # nothing was proposed


def _shape_problems(document: dict[str, Any], path: str, method: str, status: str, answer: Any) -> list[str]:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = document["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    return [str(e) for e in jsonschema_rs.validator_for(schema).iter_errors(answer)]


async def test_an_https_link_is_shown_with_its_scheme_and_its_ca_summed_up(cluster: Cluster, pki: Pki) -> None:
    ca = pki.ca.cert.read_text()
    bundle = ca + pki.rogue_ca.cert.read_text()
    document = openapi_document()
    try:
        status, created = await cluster.call("POST", 0, "/v1/admin/mirrors",
                                             json=_body("tls-ca", source_tls=True, source_ca=bundle))
        assert status == 201, created
        assert created["scheme"] == "https" and created["source_tls"] is True
        assert created["source_ca"]["certificates"] == 2 and len(created["source_ca"]["fingerprints_sha256"]) == 2
        assert _shape_problems(document, "/v1/admin/mirrors", "post", "201", created) == []
        status, system = await cluster.call("POST", 1, "/v1/admin/mirrors", json=_body("tls-system", source_tls=True))
        assert status == 201 and (system["scheme"], system["source_ca"]) == ("https", None), system
        status, plain = await cluster.call("POST", 2, "/v1/admin/mirrors", json=_body("tls-plain"))
        assert status == 201 and (plain["scheme"], plain["source_tls"], plain["source_ca"]) == ("http", False, None)

        status, listed = await cluster.call("GET", 2, "/v1/admin/mirrors")
        assert status == 200
        shown = {link["name"]: link for link in listed["mirrors"]}
        assert shown["tls-ca"]["source_ca"] == created["source_ca"] and shown["tls-system"]["scheme"] == "https"
        assert _shape_problems(document, "/v1/admin/mirrors", "get", "200", listed) == []
        status, report = await cluster.call("GET", 1, "/v1/admin/mirrors/tls-ca")
        assert status == 200 and report["scheme"] == "https" and report["source_ca"] == created["source_ca"]
        assert _shape_problems(document, "/v1/admin/mirrors/{name}", "get", "200", report) == []
        for text in (json.dumps(created), json.dumps(listed), json.dumps(report)):
            assert "BEGIN CERTIFICATE" not in text and ca.splitlines()[1] not in text
        # Paused and resumed, the link keeps its TLS settings (the catalog's state change).
        status, paused = await cluster.call("POST", 0, "/v1/admin/mirrors/tls-ca/pause")
        assert status == 200 and paused["source_ca"] == created["source_ca"] and paused["scheme"] == "https"
    finally:
        for name in ("tls-ca", "tls-system", "tls-plain"):
            status, _ = await cluster.call("DELETE", 0, f"/v1/admin/mirrors/{name}")
            assert status in (204, 404)
