"""Goal: hostile HTTP clients cost the node a bounded number of sockets for a bounded
time, and well-behaved clients keep getting answers meanwhile: connections beyond
the total or per-address bound are refused, headers that trickle or never come are
dropped after `header_read_timeout_s`, and an answer the client stops reading is
abandoned after `write_stall_timeout_s`.

Each test starts an extra HTTP server with small bounds on node 1 of the package's
cluster (on 127.0.0.1), and talks to it over raw sockets; clients that must count
as other addresses connect from 127.0.0.2, .3, ... (all of 127.0.0.0/8 is loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from multiraft.http import HttpServer
from multiraft.http.limits import BATCH_CONTENT_TYPE, ConnectionLimits
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def _server(cluster: Cluster, node_index: int = 0, **limits: Any) -> AsyncIterator[HttpServer]:
    server = HttpServer(cluster.nodes[node_index].api, "127.0.0.1", 0, limits=ConnectionLimits(**limits))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _connect(server: HttpServer, source_host: str = "127.0.0.1") -> Stream:
    return await asyncio.open_connection(server.host, server.port, local_addr=(source_host, 0))


async def _get(stream: Stream, path: str) -> tuple[int, bytes]:
    """One keep-alive GET on a raw connection: the status and the body."""
    reader, writer = stream
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        assert length is not None, head
        body = await reader.readexactly(int(length.group(1)))
    return int(head.split(b" ", 2)[1]), body


async def _hung_up_within(stream: Stream, timeout_s: float) -> bool:
    """True if the server closes the connection within `timeout_s` (answering nothing)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await stream[0].read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _close(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# Goal: with 2 connections from 127.0.0.2 open, a third from there is refused at once
# while other addresses still connect; with 4 open in all, a fifth from anywhere is
# refused; the connections already open keep getting answers, and /metrics counts
# each refusal by reason (and exports the raft port's counters too).
async def test_connections_over_the_bounds_are_refused_and_open_ones_are_served(cluster: Cluster) -> None:
    async with _server(cluster, connections_max=4, connections_per_address_max=2) as server:
        streams: list[Stream] = []
        try:
            first = await _connect(server, "127.0.0.2")
            streams.append(first)
            assert (await _get(first, "/v1/health"))[0] == 200
            streams.append(await _connect(server, "127.0.0.2"))
            over_address = await _connect(server, "127.0.0.2")
            streams.append(over_address)
            assert await _hung_up_within(over_address, 1.0), "a third connection from one address"

            other = await _connect(server, "127.0.0.3")
            streams.append(other)
            assert (await _get(other, "/v1/health"))[0] == 200
            streams.append(await _connect(server, "127.0.0.4"))
            over_total = await _connect(server, "127.0.0.5")
            streams.append(over_total)
            assert await _hung_up_within(over_total, 1.0), "a fifth connection in all"

            assert (await _get(first, "/v1/health"))[0] == 200, "an open connection is still served"
            status, metrics = await _get(other, "/metrics")
            assert status == 200
            assert b'raftlog_http_connections_refused_total{reason="address_full"} 1.0' in metrics
            assert b'raftlog_http_connections_refused_total{reason="connections_full"} 1.0' in metrics
            assert b"raftlog_http_connections 4.0" in metrics
            # The raft port's defences are exported alongside (tests/transport checks them).
            assert b'raftlog_transport_inbound_refused_total{reason="pending_full"}' in metrics
            assert b"raftlog_transport_handshakes_pending " in metrics
            assert b"raftlog_transport_handshake_timeouts_total " in metrics
            stats = server.connection_stats()
            assert stats.refused_by_reason == {"address_full": 1, "connections_full": 1}
        finally:
            await _close(streams)
        await until(lambda: server.connection_stats().open == 0, "every slot given back")


# Goal: a client that trickles a request's headers (a byte every 0.1 s, never the
# blank line), and one that sends nothing at all, are each dropped once the header
# deadline (0.5 s) has passed, not before, while another client is answered; the
# keep-alive timeout (30 s) would have let both hold their sockets far longer.
async def test_trickled_or_missing_headers_are_dropped_after_the_deadline(cluster: Cluster) -> None:
    loop = asyncio.get_running_loop()
    async with _server(cluster, header_read_timeout_s=0.5) as server:
        streams: list[Stream] = []
        try:
            silent = await _connect(server)
            streams.append(silent)
            started = loop.time()
            trickler = await _connect(server)
            streams.append(trickler)
            trickler[1].write(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n")
            dropped = False
            for _ in range(30):  # up to 3 s
                with contextlib.suppress(ConnectionError):
                    trickler[1].write(b"X")
                if await _hung_up_within(trickler, 0.1):
                    dropped = True
                    break
            elapsed = loop.time() - started
            assert dropped, "the trickling client is still connected after 3 s"
            assert 0.4 <= elapsed < 2.0, f"dropped after {elapsed:.2f} s; the deadline is 0.5 s"
            assert await _hung_up_within(silent, 1.0), "the silent client was dropped too"

            good = await _connect(server)
            streams.append(good)
            assert (await _get(good, "/v1/health"))[0] == 200
            assert server.connection_stats().header_timeouts == 2
        finally:
            await _close(streams)


# Goal: between requests a kept-alive connection may idle past the header deadline
# (the keep-alive timeout governs idling), but once its next request has begun, the
# headers must be complete within the deadline.
async def test_an_idle_keepalive_connection_is_kept_but_its_next_headers_are_timed(cluster: Cluster) -> None:
    async with _server(cluster, header_read_timeout_s=0.5) as server:
        stream = await _connect(server)
        try:
            assert (await _get(stream, "/v1/health"))[0] == 200
            await asyncio.sleep(1.0)  # idle: twice the header deadline
            assert (await _get(stream, "/v1/health"))[0] == 200, "an idle keep-alive connection is kept"
            stream[1].write(b"GET /v1/health HTTP/1.1\r\n")
            assert await _hung_up_within(stream, 2.0), "a begun request's headers are timed"
            assert server.connection_stats().header_timeouts == 1
        finally:
            await _close([stream])


def _request_tasks() -> set[asyncio.Task]:  # type: ignore[type-arg]
    """aiohttp runs one `RequestHandler.start` task per open connection (every server in
    this loop: the cluster's too, whose keep-alive connections from earlier tests may end
    at any moment, so a test compares sets, not counts)."""
    return {task for task in asyncio.all_tasks()
            if getattr(task.get_coro(), "__qualname__", "") == "RequestHandler.start"}


# Goal: a client that asks for a large binary consume answer (16 MB, more than the
# socket buffers hold) and never reads it is dropped within the write deadline (1 s):
# its socket is reset (what the kernel still buffered is dropped too) and its handler
# ends, so the answer's memory is let go; the node answers /v1/health quickly all along.
async def test_a_client_that_stops_reading_is_dropped_after_the_write_deadline(cluster: Cluster) -> None:
    await cluster.create_topic("slow-reader", replication_factor=1)
    group_id = cluster.nodes[0].catalog.topics["slow-reader"].partitions[0].group_id
    host = next(i for i, node in enumerate(cluster.nodes) if group_id in node.groups)
    body = json.dumps({"format": "string", "records": [{"value": "v" * 1_000_000}] * 8}).encode()
    for _ in range(2):  # 16 MB in two batches
        status, answer = await cluster.call("POST", host, "/v1/topics/slow-reader/partitions/0/records",
                                            data=io.BytesIO(body), headers={"Content-Type": "application/json"})
        assert status == 200, answer

    loop = asyncio.get_running_loop()
    async with _server(cluster, host, write_stall_timeout_s=1.0) as server:
        before = _request_tasks()
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        stalled.setblocking(False)
        health = await _connect(server)
        try:
            await loop.sock_connect(stalled, (server.host, server.port))
            await loop.sock_sendall(stalled, (
                "GET /v1/topics/slow-reader/partitions/0/records?offset=0&max_bytes=67108864 HTTP/1.1\r\n"
                f"Host: localhost\r\nAccept: {BATCH_CONTENT_TYPE}\r\n\r\n").encode())
            started = loop.time()
            while server.connection_stats().write_timeouts == 0:
                assert loop.time() - started < 6.0, "the stalled reader was not dropped"
                asked = loop.time()
                assert (await _get(health, "/v1/health"))[0] == 200
                assert loop.time() - asked < 0.5, "health answered slowly while a reader stalled"
                await asyncio.sleep(0.05)
            assert loop.time() - started >= 0.9, "dropped before the write deadline"
            await until(lambda: server.connection_stats().open == 1, "the stalled connection closed")
            # Of the connections opened since `before`, only the health one is left.
            await until(lambda: len(_request_tasks() - before) == 1, "its handler ended")
            received = 0
            with contextlib.suppress(ConnectionResetError):
                async with asyncio.timeout(5):
                    while chunk := await loop.sock_recv(stalled, 65536):
                        received += len(chunk)
            # Reset, not closed: the kernel's send buffer (megabytes) was dropped too.
            assert received < 1024 * 1024, f"{received} bytes still arrived after the drop"
        finally:
            stalled.close()
            await _close([health])
