"""Goal: the client's HTTP/1.1 connections against a real loopback server that answers
with hand-written bytes: keep-alive reuse, framing (sized, empty, refused chunked),
and each failure classified as "not sent" (ConnectFailed) or "outcome unknown"
(ExchangeFailed, TimeoutError)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from multiraft.client.connection import ConnectFailed, ConnectionPool, ExchangeFailed
from tests.node.test_node_cluster import free_port

pytestmark = pytest.mark.asyncio

Answer = Callable[[bytes], bytes | None]  # request bytes -> raw answer (None: close without one)


class Server:
    """Reads one request at a time (head + Content-Length body) and writes `answer(request)`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.answer(request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[Answer], asyncio.Future[Server]]]:
    started: list[Server] = []

    async def start(answer: Answer) -> Server:
        server = Server(answer)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        server.port = server.server.sockets[0].getsockname()[1]
        started.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in started:
        assert server.server is not None
        server.server.close()


async def raw_server(handler) -> tuple[asyncio.Server, str]:
    """A loopback server running `handler` per connection, and its base URL."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def reply(writer: asyncio.StreamWriter, raw: bytes) -> None:
    writer.write(raw)
    await writer.drain()
    writer.close()


def ok(body: bytes, extra: bytes = b"") -> Answer:
    return lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_keep_alive_reuses_one_connection_and_sends_a_sized_body(serve) -> None:
    server = await serve(ok(b'{"a": 1}', b"Raftlog-Next-Offset: 7\r\n"))
    pool = ConnectionPool()
    for _ in range(3):
        response = await pool.request("POST", server.url + "/v1/topics/t/records", body=b"xyz",
                                      query={"acks": "quorum"}, headers={"X-Y": "z"}, timeout_s=5)
        assert (response.status, response.body) == (200, b'{"a": 1}')
        assert response.headers["raftlog-next-offset"] == "7"  # names are case-insensitive
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /v1/topics/t/records?acks=quorum HTTP/1.1"
    assert b"Content-Length: 3" in head and b"X-Y: z" in head and body == b"xyz"
    await pool.close()


async def test_path_is_percent_encoded(serve) -> None:
    server = await serve(ok(b""))
    pool = ConnectionPool()
    await pool.request("GET", server.url + "/v1/topics/a b%", timeout_s=5)
    assert server.requests[0].startswith(b"GET /v1/topics/a%20b%25 HTTP/1.1\r\n")
    await pool.close()


async def test_no_content_and_connection_close(serve) -> None:
    server = await serve(lambda _: b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
    pool = ConnectionPool()
    for _ in range(2):
        response = await pool.request("DELETE", server.url + "/v1/topics/t", timeout_s=5)
        assert (response.status, response.body) == (204, b"")
    assert server.connections == 2, "a connection the server closes is not reused"
    await pool.close()


async def test_a_body_split_over_many_packets_is_reassembled(serve) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    server = await serve(ok(body))
    pool = ConnectionPool()
    response = await pool.request("GET", server.url + "/big", timeout_s=10)
    assert response.body == body
    await pool.close()


@pytest.mark.parametrize(("answer", "reason"), [
    (lambda _: None, "closed"),
    (lambda _: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "chunked"),
    (lambda _: b"HTTP/1.1 200 OK\r\n\r\n", "Content-Length"),
    (lambda _: b"SMTP ready\r\n\r\n", "status line"),
    (lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", "more bytes"),
])
async def test_a_lost_or_malformed_answer_is_an_unknown_outcome(serve, answer: Answer, reason: str) -> None:
    server = await serve(answer)
    pool = ConnectionPool()
    with pytest.raises(ExchangeFailed, match=reason):
        await pool.request("GET", server.url + "/x", timeout_s=5)
    await pool.close()


async def test_a_body_cut_off_is_an_unknown_outcome() -> None:
    async def truncating(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reply(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")

    server, url = await raw_server(truncating)
    pool = ConnectionPool()
    with pytest.raises(ExchangeFailed, match="closed"):
        await pool.request("GET", url + "/x", timeout_s=5)
    server.close()
    await pool.close()


async def test_no_answer_in_time_is_a_timeout(serve) -> None:
    never = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await never.wait()
        writer.close()

    server, url = await raw_server(silent)
    pool = ConnectionPool()
    with pytest.raises(TimeoutError):
        await pool.request("GET", url + "/x", timeout_s=0.2)
    never.set()
    await asyncio.sleep(0.01)
    server.close()
    await pool.close()


async def test_nobody_listening_is_connect_failed() -> None:
    pool = ConnectionPool()
    with pytest.raises(ConnectFailed):
        await pool.request("GET", f"http://127.0.0.1:{free_port('127.0.0.1')}/x", timeout_s=5)


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    connections: list[asyncio.StreamWriter] = []

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % len(connections))
        await writer.drain()
        await reader.read()  # keep-alive as far as the client knows, until the test closes it
        writer.close()

    server, base = await raw_server(answer_once)
    url = base + "/x"
    pool = ConnectionPool()
    assert (await pool.request("GET", url, timeout_s=5)).body == b"1"
    connections[0].close()  # the server drops the idle connection
    await asyncio.sleep(0.1)
    assert (await pool.request("GET", url, timeout_s=5)).body == b"2", "a new connection, not the dead one"
    await pool.close()
    await asyncio.sleep(0.01)
    server.close()


async def test_the_source_address_is_bound(serve) -> None:
    seen: list[str] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("peername")[0])
        await reader.readuntil(b"\r\n\r\n")
        await reply(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    server, url = await raw_server(record)
    pool = ConnectionPool(local_host="127.0.0.7")
    await pool.request("GET", url + "/x", timeout_s=5)
    assert seen == ["127.0.0.7"]
    server.close()
    await pool.close()


async def test_waiting_for_a_free_connection_is_bounded(serve, monkeypatch) -> None:
    # Goal: with every connection to a server busy, a request waits for one only until
    # its deadline, and then fails as not sent.
    monkeypatch.setattr("multiraft.client.connection.CONNECTIONS_PER_SERVER_MAX", 1)
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await release.wait()
        await reply(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    server, base = await raw_server(slow)
    url = base + "/x"
    pool = ConnectionPool()
    busy = asyncio.create_task(pool.request("GET", url, timeout_s=5))
    await asyncio.sleep(0.05)
    with pytest.raises(ConnectFailed, match="within"):
        await pool.request("GET", url, timeout_s=0.2)
    release.set()
    assert (await busy).status == 200
    await pool.close()
    server.close()
