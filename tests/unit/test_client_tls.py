"""The client over TLS (multiraft/client/): which scheme it speaks, and its connection
pool against a real loopback HTTPS server with a certificate the test makes itself, on
asyncio and on uvloop."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from multiraft.client.connection import CertificateRefused, ConnectionPool
from multiraft.client.http import AsyncClient, cluster_scheme
from multiraft.net.tls import client_context, http_server_context
from tests.tls_pki import Pki, make_pki
from tests.unit.test_client_connection import Server, ok


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# Goal: a client speaks HTTPS when a server says https:// or a CA is given (bare HOST:PORT
# then means https, as NATS clients turn TLS on with a CA), never mixes schemes, and
# refuses a CA next to an explicit http://; $RAFTLOG_CA is the default CA.
def test_the_client_picks_its_scheme(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cluster_scheme(["127.0.0.1:8080"], None) == "http"
    assert cluster_scheme(["https://127.0.0.1:8080", "127.0.0.2:8080"], None) == "https"
    assert cluster_scheme(["127.0.0.1:8080"], pki.ca.cert) == "https"
    with pytest.raises(ValueError, match="mix"):
        cluster_scheme(["http://a:1", "https://b:1"], None)
    with pytest.raises(ValueError, match="http://"):
        cluster_scheme(["http://a:1"], pki.ca.cert)
    monkeypatch.delenv("RAFTLOG_CA", raising=False)
    assert AsyncClient("127.0.0.1:1").servers == ["http://127.0.0.1:1"]
    monkeypatch.setenv("RAFTLOG_CA", str(pki.ca.cert))
    assert AsyncClient("127.0.0.1:1,127.0.0.2:1").servers == ["https://127.0.0.1:1", "https://127.0.0.2:1"]


# Goal: keep-alive HTTPS requests through the pool on both loops (the node's and a user's
# programme may run uvloop): one TLS connection for two requests; a pool trusting another
# CA is refused with CertificateRefused (nothing was sent).
@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_https_requests_through_the_pool(pki: Pki, loop_factory) -> None:  # type: ignore[no-untyped-def]
    own = pki.nodes["127.0.0.1"]

    async def exchange() -> tuple[int, bytes, int]:
        server = Server(ok(b"tls"))
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0,
                                                   ssl=http_server_context(own.cert, own.key))
        server.port = server.server.sockets[0].getsockname()[1]
        url = server.url.replace("http://", "https://")
        pool = ConnectionPool(tls=client_context(pki.ca.cert))
        rogue = ConnectionPool(tls=client_context(pki.rogue_ca.cert))
        try:
            for _ in range(2):
                response = await pool.request("POST", url + "/x", body=b"1", timeout_s=5)
            with pytest.raises(CertificateRefused, match="did not verify"):
                await rogue.request("GET", url + "/x", timeout_s=5)
            return response.status, response.body, server.connections
        finally:
            await pool.close()
            await rogue.close()
            server.server.close()
            await server.server.wait_closed()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(exchange()) == (200, b"tls", 1), "one connection, kept alive; the rogue never got in"
