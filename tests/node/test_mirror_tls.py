"""Goal: a mirror link to a source cluster that serves HTTPS copies its topic byte for byte
over TLS (discovery, the real-time path and the full sync all read the source with the
link's CA); a source presenting another CA's certificates makes each pull back off saying
why, and copying resumes once the right ones are back; a link whose CA is wrong, or whose
source does not speak TLS, says so in its status, retried with the backoff; never with the
token (docs/mirror.md "TLS to the source").

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's): the source on
127.0.0.1-3 serves its HTTP API over HTTPS only, each node with a certificate naming its
own address from a test CA (tests/tls_pki.py); the sink on 127.0.0.4-6 serves plain HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from multiraft.http import HttpServer
from multiraft.net.tls import http_server_context
from tests.node.test_mirror import Side, _batch, _http, _same, _start, _stop
from tests.node.test_node_cluster import produce_retrying
from tests.tls_pki import Pki, make_pki

pytestmark = pytest.mark.asyncio(loop_scope="function")
TOKEN = "tls-link-token-e41c-never-shown"


@pytest_asyncio.fixture
async def clusters(tmp_path: Path) -> AsyncIterator[tuple[Side, Side, Pki]]:
    pki = make_pki(tmp_path / "pki")

    def tls(host: str) -> Any:
        own = pki.nodes[host]
        return http_server_context(own.cert, own.key)

    source = await _start(tmp_path / "source", 1, tls=tls)
    sink = await _start(tmp_path / "sink", 4)
    try:
        yield source, sink, pki
    finally:
        await _stop(sink)
        await _stop(source)


async def _status(session: aiohttp.ClientSession, sink: Side, name: str) -> dict[str, Any]:
    status, report = await _http(session, sink.nodes[0], "GET", f"/v1/admin/mirrors/{name}")
    assert status == 200, report
    assert TOKEN not in json.dumps(report), report
    return report  # type: ignore[no-any-return]


async def _discovery_error(session: aiohttp.ClientSession, sink: Side, name: str) -> dict[str, Any]:
    try:
        async with asyncio.timeout(20):
            while True:
                discovery = (await _status(session, sink, name))["discovery"]
                if discovery and discovery["last_error"]:
                    return discovery  # type: ignore[no-any-return]
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"the link {name} shows no error") from None


async def _serve(side: Side, tls: Any) -> None:
    """Each node's HTTP API served again on its address, with `tls(host)`'s context."""
    for index, node in enumerate(side.nodes):
        await side.servers[index].stop()
        side.servers[index] = HttpServer(node.api, node.config.http_addr.host, node.config.http_addr.port,
                                         tls=tls(node.config.http_addr.host))
        await side.servers[index].start()


async def _until_pulls(session: aiohttp.ClientSession, sink: Side, name: str, each: Any) -> dict[str, Any]:
    """The link's status once every mirror partition's pull satisfies `each`."""
    report: dict[str, Any] = {}
    try:
        async with asyncio.timeout(20):
            while True:
                report = await _status(session, sink, name)
                partitions = [p for t in report["topics"] for p in t["partitions"]]
                if partitions and all(each(p) for p in partitions):
                    return report
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"the pulls of {name} did not get there: {report}") from None


async def test_a_mirror_copies_an_https_source_and_a_wrong_ca_is_shown(clusters: tuple[Side, Side, Pki],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from multiraft.node import mirror_links

    # Discovery every 50 ms, so the backoff is what bounds the failed attempts below (at the
    # usual 1 s interval a hot loop would show only 3 or 4 of them too).
    monkeypatch.setattr(mirror_links, "DISCOVER_INTERVAL_S", 0.05)
    source, sink, pki = clusters
    for topic in ("orders", "payments"):
        await source.nodes[0].api.create_topic(topic, 2, 3, {})
        await source.nodes[0].api.wait_for_topic(topic)
    for n in range(20):
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
        await produce_retrying(source.nodes[n % 3], "payments", n % 2, _batch(n))
    sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
    session = aiohttp.ClientSession()
    try:
        status, link = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors", json={
            "name": "secure", "sources": sources, "topics": "orders", "token": TOKEN,
            "source_tls": True, "source_ca": pki.ca.cert.read_text()})
        assert status == 201 and link["scheme"] == "https" and link["source_ca"]["certificates"] == 1, link

        # Discovery, then the real-time path, over TLS: the same offsets and bytes.
        await _same(source, sink, "orders", 2)
        for n in range(20, 40):  # a live source: the long polls over TLS follow it
            await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n, 3))
        hws = await _same(source, sink, "orders", 2)
        assert all(hw > 0 for hw in hws)
        report = await _status(session, sink, "secure")
        assert report["scheme"] == "https" and report["discovery"]["last_error"] is None, report
        partitions = report["topics"][0]["partitions"]
        assert [p["state"] for p in partitions] == ["running", "running"], report
        assert sum(p["bytes_copied"] for p in partitions) > 0, report

        # The full sync reads the source's trees over TLS too.
        status, verified = await _http(session, sink.nodes[2], "POST", "/v1/admin/mirrors/secure/verify", json={})
        assert status == 200 and verified["all_identical"], verified

        # The source's nodes now present certificates of another CA (an impostor on their
        # addresses): each pull backs off, saying why; back to the real ones, it copies on.
        await _serve(source, lambda host: http_server_context(pki.rogue.cert, pki.rogue.key))
        for n in range(40, 44):
            await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
        report = await _until_pulls(session, sink, "secure", lambda p: p["state"] == "backing_off"
                                    and "TLS: the source's certificate is not trusted" in (p["last_error"] or ""))
        assert "CERTIFICATE_VERIFY_FAILED" in report["topics"][0]["partitions"][0]["last_error"], report
        await _serve(source, lambda host: http_server_context(pki.nodes[host].cert, pki.nodes[host].key))
        await _same(source, sink, "orders", 2)
        await _until_pulls(session, sink, "secure", lambda p: p["state"] == "running")

        # A CA that did not sign the source's certificates: no mirror, the status says why.
        status, link = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors", json={
            "name": "wrong-ca", "sources": sources, "topics": "payments", "token": TOKEN,
            "source_tls": True, "source_ca": pki.rogue_ca.cert.read_text()})
        assert status == 201, link
        discovery = await _discovery_error(session, sink, "wrong-ca")
        assert "TLS: the source's certificate is not trusted" in discovery["last_error"], discovery
        assert "CERTIFICATE_VERIFY_FAILED" in discovery["last_error"], discovery
        # An HTTPS link to a source that serves plain HTTP (the sink's own API): said so too.
        plain = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in sink.nodes]
        status, link = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors", json={
            "name": "not-tls", "sources": plain, "topics": "nothing-*", "token": TOKEN, "source_tls": True})
        assert status == 201, link
        discovery = await _discovery_error(session, sink, "not-tls")
        assert "TLS: the handshake with the source failed" in discovery["last_error"], discovery

        # Backoff, not a hot loop: within 3 s more, a handful of attempts at most (0.2 s doubling).
        failures = (await _status(session, sink, "wrong-ca"))["discovery"]["failures"]
        await asyncio.sleep(3.0)
        later = (await _status(session, sink, "wrong-ca"))["discovery"]
        assert later["failures"] - failures <= 4 and "payments" not in sink.nodes[0].catalog.topics, later
        assert (await _status(session, sink, "wrong-ca"))["topics"] == []
    finally:
        await session.close()
