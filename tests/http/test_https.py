"""HTTPS on the HTTP API (multiraft/http/server.py with a TLS context), with a CA the
test makes itself (tests/tls_pki.py): an extra server on node 1 of the package's
cluster, on 127.0.0.1, whose certificate names 127.0.0.1. The connection bounds of
test_connection_limits.py hold over TLS too, applied before the TLS handshake."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from multiraft.client.http import AsyncClient, RaftlogError, UnavailableError
from multiraft.http import HttpServer
from multiraft.http.limits import BATCH_CONTENT_TYPE, ConnectionLimits
from multiraft.net.tls import client_context, http_server_context
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until
from tests.tls_pki import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.asynccontextmanager
async def _https(cluster: Cluster, pki: Pki, node_index: int = 0, **limits: Any) -> AsyncIterator[HttpServer]:
    own = pki.nodes["127.0.0.1"]
    server = HttpServer(cluster.nodes[node_index].api, "127.0.0.1", 0, limits=ConnectionLimits(**limits),
                        tls=http_server_context(own.cert, own.key))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _request(server: HttpServer, method: str, path: str, context: ssl.SSLContext,
                   **kwargs: Any) -> tuple[int, Any]:
    async with (asyncio.timeout(15), aiohttp.ClientSession() as session,
                session.request(method, server.url + path, ssl=context, **kwargs) as response):
        return response.status, await response.json()


async def _hung_up_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True if the server closes the connection within `timeout_s`, sending nothing."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _close(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


# Goal: with the CA, a client creates a topic, produces and reads back over HTTPS; the
# server's own origin is https://HOST:PORT (a page it serves may call it); nothing counts
# as a failed handshake.
async def test_https_produce_and_consume_with_the_ca(cluster: Cluster, pki: Pki) -> None:
    async with _https(cluster, pki) as server:
        assert server.url.startswith("https://127.0.0.1:")
        trusted = client_context(pki.ca.cert)
        status, body = await _request(server, "POST", "/v1/topics", trusted,
                                      json={"name": "tls-topic", "partitions": 1, "replication_factor": 3})
        assert status == 201, body
        await cluster.create_topic_wait("tls-topic")
        status, body = await _request(server, "POST", "/v1/topics/tls-topic/records", trusted,
                                      json={"records": [{"value": {"n": 1}}, {"value": {"n": 2}}]},
                                      headers={"Origin": server.url})
        assert status == 200, body
        status, body = await _request(server, "GET", "/v1/topics/tls-topic/partitions/0/records", trusted,
                                      params={"offset": 0, "wait_ms": 1000})
        assert status == 200 and [r["value"] for r in body["records"]] == [{"n": 1}, {"n": 2}], body
        stats = server.connection_stats()
        assert (stats.tls_handshakes_failed, stats.tls_handshake_timeouts) == (0, 0)


# Goal: a plain HTTP request on the TLS port gets no answer at all (the connection is
# closed: curl says "Empty reply from server") and is counted; clients that do not trust
# the certificate (the system's CAs; another CA) fail verification and are counted too.
async def test_plain_http_and_untrusting_clients_are_refused(cluster: Cluster, pki: Pki) -> None:
    async with _https(cluster, pki) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        try:
            writer.write(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert await _hung_up_within(reader, 2.0), "closed without an answer"
        finally:
            await _close([(reader, writer)])
        for untrusting in (client_context(None), client_context(pki.rogue_ca.cert)):
            with pytest.raises(aiohttp.ClientConnectorCertificateError, match="certificate verify failed"):
                await _request(server, "GET", "/v1/health", untrusting)
        await until(lambda: server.connection_stats().tls_handshakes_failed == 3, "three failed handshakes")
        stats = server.connection_stats()
        assert stats.tls_handshake_timeouts == 0 and stats.open == 0
        status, metrics = await _request_text(server, "/metrics", client_context(pki.ca.cert))
        assert status == 200 and "raftlog_http_tls_handshakes_failed_total 3.0" in metrics


async def _request_text(server: HttpServer, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    async with (asyncio.timeout(15), aiohttp.ClientSession() as session,
                session.get(server.url + path, ssl=context) as response):
        return response.status, await response.text()


# Goal: the connection bounds apply before the TLS handshake: connections that open TCP
# and never speak TLS count against the per-address bound (a third from 127.0.0.2 is
# reset at once, before any TLS), are dropped by the header deadline (0.5 s, counted as
# TLS handshake timeouts), and a TLS client from another address is served meanwhile.
async def test_bounds_and_the_deadline_hold_before_the_tls_handshake(cluster: Cluster, pki: Pki) -> None:
    loop = asyncio.get_running_loop()
    async with _https(cluster, pki, connections_per_address_max=2, header_read_timeout_s=0.5) as server:
        streams: list[Stream] = []
        try:
            started = loop.time()
            for _ in range(2):
                streams.append(await asyncio.open_connection(server.host, server.port,
                                                             local_addr=("127.0.0.2", 0)))
            over = await asyncio.open_connection(server.host, server.port, local_addr=("127.0.0.2", 0))
            streams.append(over)
            assert await _hung_up_within(over[0], 0.3), "a third connection from one address, before TLS"
            assert server.connection_stats().open == 2
            status, body = await _request(server, "GET", "/v1/health", client_context(pki.ca.cert))
            assert status == 200, body
            for reader, _ in streams[:2]:
                assert await _hung_up_within(reader, 3.0), "dropped by the deadline"
            elapsed = loop.time() - started
            assert 0.4 <= elapsed < 2.5, f"dropped after {elapsed:.2f} s; the deadline is 0.5 s"
        finally:
            await _close(streams)
        stats = server.connection_stats()
        assert stats.refused_by_reason == {"address_full": 1}
        assert (stats.tls_handshakes_failed, stats.tls_handshake_timeouts) == (2, 2)
        await until(lambda: server.connection_stats().open == 0, "every slot given back")


async def _stalled_tls_client(server: HttpServer, pki: Pki, path: str) -> Stream:
    """A TLS client that asks for `path` and never reads (a small socket window and a tiny
    stream buffer: it stops reading at once)."""
    loop = asyncio.get_running_loop()
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.setblocking(False)
    await loop.sock_connect(stalled, (server.host, server.port))
    reader, writer = await asyncio.open_connection(sock=stalled, ssl=client_context(pki.ca.cert),
                                                   server_hostname="127.0.0.1", limit=1024)
    writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {BATCH_CONTENT_TYPE}\r\n\r\n").encode())
    return reader, writer


async def _topic_of_batches(cluster: Cluster, name: str, batches: int) -> int:
    """A one-replica topic holding `batches` batches of 8 MB; the index of the node hosting it."""
    await cluster.create_topic(name, replication_factor=1)
    group_id = cluster.nodes[0].catalog.topics[name].partitions[0].group_id
    host = next(i for i, node in enumerate(cluster.nodes) if group_id in node.groups)
    body = json.dumps({"format": "string", "records": [{"value": "v" * 1_000_000}] * 8}).encode()
    for _ in range(batches):
        status, answer = await cluster.call("POST", host, f"/v1/topics/{name}/partitions/0/records",
                                            data=io.BytesIO(body), headers={"Content-Type": "application/json"})
        assert status == 200, answer
    return host


# Goal: over TLS too, a client that asks for a large answer (two stored batches, two
# writes) and stops reading is reset after the write deadline (1 s): TLS's buffer fills
# behind the first write and passes the back-pressure on to the handler.
async def test_a_tls_client_that_stops_reading_is_dropped_after_the_write_deadline(
        cluster: Cluster, pki: Pki) -> None:
    host = await _topic_of_batches(cluster, "tls-slow-reader", 2)
    loop = asyncio.get_running_loop()
    async with _https(cluster, pki, host, write_stall_timeout_s=1.0) as server:
        stream = await _stalled_tls_client(
            server, pki, "/v1/topics/tls-slow-reader/partitions/0/records?offset=0&max_bytes=67108864")
        try:
            started = loop.time()
            await until(lambda: server.connection_stats().write_timeouts == 1, "the stalled reader dropped",
                        timeout_s=8.0)
            assert loop.time() - started >= 0.9, "dropped before the write deadline"
            await until(lambda: server.connection_stats().open == 0, "its slot given back")
        finally:
            await _close([stream])


# Goal: an answer written in one piece goes below TLS at once, so the write deadline does
# not see that client stall (http/server.py's docstring); the connection is still cut by
# the keep-alive timeout (1 s here) and the TLS shutdown's bound (write_stall_timeout_s,
# 1 s), not held for ever.
async def test_a_stalled_tls_answer_written_in_one_piece_is_cut_by_keepalive_and_shutdown(
        cluster: Cluster, pki: Pki) -> None:
    host = await _topic_of_batches(cluster, "tls-slow-reader-one", 1)
    loop = asyncio.get_running_loop()
    async with _https(cluster, pki, host, write_stall_timeout_s=1.0, keepalive_timeout_s=1.0) as server:
        stream = await _stalled_tls_client(
            server, pki, "/v1/topics/tls-slow-reader-one/partitions/0/records?offset=0&max_bytes=67108864")
        try:
            started = loop.time()
            await until(lambda: server.connection_stats().open == 1, "connected")
            await until(lambda: server.connection_stats().open == 0, "the stalled connection cut", timeout_s=10.0)
            elapsed = loop.time() - started
            assert elapsed < 5.0, f"cut after {elapsed:.1f} s; keep-alive plus shutdown is 2 s"
        finally:
            await _close([stream])


# Goal: the Python client with `ca_file` produces and consumes over HTTPS (bare HOST:PORT
# addresses become https, leader hints too); without the CA (the system's CAs) it fails at
# once with TLS_VERIFICATION_FAILED instead of retrying; a plain-HTTP client meets a closed
# connection and is told the node may serve HTTPS.
async def test_the_python_client_takes_a_ca_file(cluster: Cluster, pki: Pki) -> None:
    async with _https(cluster, pki) as server:
        address = f"{server.host}:{server.port}"
        async with AsyncClient(address, ca_file=pki.ca.cert, timeout_s=10) as client:
            assert client.servers == [server.url]
            await client.create_topic("tls-client", partitions=1, replication_factor=3)
            await cluster.create_topic_wait("tls-client")
            offsets = await client.produce("tls-client", [{"value": "a"}, {"value": "b"}])
            assert [o["offset"] for o in offsets] == [0, 1]
            read = await client.consume("tls-client", 0, 0, wait_ms=1000)
            assert [r["value"] for r in read["records"]] == ["a", "b"]
        loop = asyncio.get_running_loop()
        async with AsyncClient(server.url, timeout_s=10, attempts=8) as untrusting:
            started = loop.time()
            with pytest.raises(RaftlogError, match="TLS_VERIFICATION_FAILED") as refused:
                await untrusting.health()
            assert "--ca" in refused.value.message
            assert loop.time() - started < 1.0, "a certificate that does not verify is not retried"
        async with AsyncClient(f"http://{address}", timeout_s=10, attempts=2, backoff_s=0.01) as plain:
            with pytest.raises(UnavailableError, match="https://HOST:PORT or --ca"):
                await plain.health()
