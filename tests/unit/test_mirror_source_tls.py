"""A link's reads of an HTTPS source (docs/mirror.md "TLS to the source"): the SSL context
`source_context` builds (verification, host names, TLS 1.2, only the link's CA or the
system's store with $SSL_CERT_FILE), and a `SourceClient` made by `source_client` against
real loopback servers with a test CA (tests/tls_pki.py): the right CA reads; a wrong CA,
a certificate for another host, a plain HTTP source and a CA this OpenSSL refuses each
fail as a `SourceError` that says what to check and never holds the token."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from multiraft.metadata.mirror_commands import LinkState, MirrorLink, Priority
from multiraft.net.tls import TlsError, http_server_context, source_context
from multiraft.node.mirror_source import SourceClient, SourceError, source_client
from tests.node.test_node_cluster import free_port
from tests.tls_pki import Pki, make_pki

TOKEN = "tls-token-5b2e-never-shown"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _link(address: str, *, tls: bool = True, ca: str | None = None) -> MirrorLink:
    return MirrorLink("dr", (address,), "*", Priority.NORMAL, LinkState.RUNNING, TOKEN, None, tls, ca)


async def _source(host: str, context: ssl.SSLContext | None) -> tuple[web.AppRunner, str]:
    """A source answering `GET /v1/topics` on `host`, over HTTPS with `context` (else plain)."""
    async def topics(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == f"Bearer {TOKEN}"
        return web.json_response({"topics": [{"name": "orders"}], "scheme": request.scheme})

    app = web.Application()
    app.router.add_get("/v1/topics", topics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port(host)
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    return runner, f"{host}:{port}"


@pytest_asyncio.fixture
async def sources(pki: Pki) -> AsyncIterator[dict[str, str]]:
    """An HTTPS source on 127.0.0.1 (its certificate names it), one on 127.0.0.2 presenting
    127.0.0.1's certificate (another host's), and a plain HTTP one."""
    own = pki.nodes["127.0.0.1"]
    made = [await _source("127.0.0.1", http_server_context(own.cert, own.key)),
            await _source("127.0.0.2", http_server_context(own.cert, own.key)),
            await _source("127.0.0.1", None)]
    try:
        yield {"https": made[0][1], "other_host": made[1][1], "plain": made[2][1]}
    finally:
        for runner, _ in made:
            await runner.cleanup()


# Goal: the context a link reads its source with verifies the certificate and the host
# name, refuses TLS below 1.2, and trusts only the link's CA when it has one.
def test_the_source_context_verifies_and_trusts_only_the_links_ca(pki: Pki) -> None:
    context = source_context(pki.ca.cert.read_text())
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "raftlog test CA"),),)]
    not_a_certificate = base64.b64encode(b"\x30\x03\x02\x01\x01").decode()  # a DER SEQUENCE, shaped right
    with pytest.raises(TlsError, match="source_ca: OpenSSL takes no CA certificate"):
        source_context(f"-----BEGIN CERTIFICATE-----\n{not_a_certificate}\n-----END CERTIFICATE-----\n")


# Goal: without a CA the system's trust store is used, $SSL_CERT_FILE included (as OpenSSL's
# defaults: how a sink host's operator adds a private CA for every link at once).
def test_without_a_ca_the_system_store_and_ssl_cert_file(pki: Pki, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.rogue_ca.cert))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))  # empty: only the file counts
    context = source_context(None)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert ((("commonName", "rogue CA"),),) in [c["subject"] for c in context.get_ca_certs()]


async def _fails(client: SourceClient) -> str:
    with pytest.raises(SourceError) as raised:
        await client.get_json("/v1/topics")
    text = str(raised.value)
    assert TOKEN not in text and TOKEN not in repr(raised.value)
    return text


# Goal: an HTTPS link reads an HTTPS source with the right CA; a wrong CA, a certificate
# naming another host, a plain HTTP source and an HTTP link to an HTTPS source fail as
# SourceErrors saying what to check, never with the token.
@pytest.mark.asyncio(loop_scope="function")
async def test_a_link_reads_https_with_its_ca_and_each_tls_failure_says_what_to_check(
        pki: Pki, sources: dict[str, str]) -> None:
    ca, rogue = pki.ca.cert.read_text(), pki.rogue_ca.cert.read_text()
    clients = {name: source_client(link) for name, link in {
        "good": _link(sources["https"], ca=ca),
        "wrong_ca": _link(sources["https"], ca=rogue),
        "other_host": _link(sources["other_host"], ca=ca),
        "plain_source": _link(sources["plain"], ca=ca),
        "plain_link": _link(sources["https"], tls=False),
    }.items()}
    try:
        async with asyncio.timeout(20):
            assert clients["good"].scheme == "https" and clients["plain_link"].scheme == "http"
            answer = await clients["good"].get_json("/v1/topics")
            assert answer == {"topics": [{"name": "orders"}], "scheme": "https"}
            wrong_ca = await _fails(clients["wrong_ca"])
            assert ": TLS: the source's certificate is not trusted" in wrong_ca, wrong_ca
            assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca, wrong_ca
            other_host = await _fails(clients["other_host"])
            assert ": TLS: the source's certificate is not trusted" in other_host, other_host
            assert "mismatch" in other_host, other_host  # OpenSSL's reason: the certificate names another host
            plain = await _fails(clients["plain_source"])
            assert ": TLS: the handshake with the source failed" in plain, plain
            hung_up = await _fails(clients["plain_link"])  # the HTTPS server hangs up on plain HTTP
            assert "if it serves HTTPS, the link needs source_tls" in hung_up, hung_up
    finally:
        for client in clients.values():
            await client.close()


# Goal: a link whose CA this node's OpenSSL refuses (its shape passed the catalog's check)
# makes no connection and fails every call with the reason, for the link's status.
@pytest.mark.asyncio(loop_scope="function")
async def test_a_ca_openssl_refuses_fails_each_call_without_connecting(sources: dict[str, str]) -> None:
    not_a_certificate = base64.b64encode(b"\x30\x03\x02\x01\x01").decode()
    client = source_client(_link(sources["https"], ca=f"-----BEGIN CERTIFICATE-----\n{not_a_certificate}\n"
                                                      "-----END CERTIFICATE-----\n"))
    try:
        for _ in range(2):
            text = await _fails(client)
            assert text.startswith("TLS: source_ca: OpenSSL takes no CA certificate"), text
        assert client.scheme == "https" and client._session is None
    finally:
        await client.close()
