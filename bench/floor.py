"""The floor under a sequential write: the same pipeline shape with nothing of raftlog in it.

A raftlog write crosses client -> leader (HTTP) -> two followers (append, fsync,
answer) -> leader (its own append and fsync, commit on the first answer) -> client.
This script runs exactly that shape with the least Python that can do it: a
leader on aiohttp (one route with the produce path's shape, one middleware, a JSON
answer, as raftlog's HTTP layer has), followers on a bare asyncio protocol, an
12-byte header per frame, O_APPEND files with an fsync per write, all on uvloop
and loopback, driven by raftlog's own HTTP client. No Raft, no CRC, no index, no
state database, no metrics.

Why: the sequential latency target is set on this 2-core machine, where four
busy processes share two cores and every step a woken process takes runs from
a cold cache. The floor says how much of raftlog's latency the shape itself
costs here (processes, wake-ups, sockets, fsyncs, aiohttp) and how much is
raftlog's own work per write; `bench/sequential.py --floor` prints both from one
run, and their ratio.

    .venv/bin/python bench/floor.py [--count 3000] [--warmup 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.client.http import AsyncClient

FRAME = struct.Struct(">IQ")  # body length, write number
BASE_PORT = 17600  # apart from bench/node.py's and bench/sequential.py's
START_TIMEOUT_S = 20
PARENT_CHECK_S = 1.0
ROUTE = "/v1/topics/{topic}/partitions/{partition}/records"


class FollowerProtocol(asyncio.Protocol):
    """Append each frame's body, fsync, answer its write number."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= FRAME.size:
            length, number = FRAME.unpack_from(self._buffer)
            if len(self._buffer) < FRAME.size + length:
                return
            os.write(self._fd, self._buffer[FRAME.size : FRAME.size + length])
            del self._buffer[: FRAME.size + length]
            os.fsync(self._fd)
            self._transport.write(FRAME.pack(0, number))


class AnswerProtocol(asyncio.Protocol):
    """The leader's side of a follower connection: resolves the waiting write."""

    def __init__(self, waiting: dict[int, asyncio.Future[None]]) -> None:
        self._waiting = waiting
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= FRAME.size:
            _, number = FRAME.unpack_from(self._buffer)
            del self._buffer[: FRAME.size]
            future = self._waiting.pop(number, None)
            if future is not None and not future.done():
                future.set_result(None)  # the first answer commits (leader + one follower)


async def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_CHECK_S)
    os._exit(1)


async def serve_follower(port: int, directory: str, parent: int) -> None:
    fd = os.open(os.path.join(directory, f"follower-{port}.log"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: FollowerProtocol(fd), "127.0.0.1", port)
    await _exit_with_parent(parent)


async def serve_leader(port: int, follower_ports: list[int], directory: str, parent: int) -> None:
    from aiohttp import web

    fd = os.open(os.path.join(directory, "leader.log"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[None]] = {}
    links = []
    for follower in follower_ports:
        transport, _ = await loop.create_connection(lambda: AnswerProtocol(waiting), "127.0.0.1", follower)
        links.append(transport)
    count = 0

    async def produce(request: web.Request) -> web.Response:
        nonlocal count
        body = await request.read()
        count += 1
        number = count
        answered = waiting[number] = loop.create_future()
        frame = FRAME.pack(len(body), number) + body
        for link in links:
            link.write(frame)
        os.write(fd, body)
        os.fsync(fd)
        await asyncio.wait_for(answered, 10)
        return web.json_response({"partition": int(request.match_info["partition"]), "base_offset": number - 1,
                                  "count": 1, "duplicate": False})

    @web.middleware
    async def passthrough(request: web.Request, handler: Any) -> web.StreamResponse:
        return await handler(request)

    app = web.Application(middlewares=[passthrough])
    app.router.add_post(ROUTE, produce)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await _exit_with_parent(parent)


async def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"floor: nothing listens on port {port} after {START_TIMEOUT_S} s") from None
            await asyncio.sleep(0.05)


@dataclass(frozen=True)
class Pipeline:
    client: AsyncClient  # of the leader
    directory: str  # the three logs: leader.log, follower-<port>.log
    pids: tuple[int, ...]


@contextlib.asynccontextmanager
async def pipeline(base_port: int = BASE_PORT) -> AsyncIterator[Pipeline]:
    """A fresh floor pipeline (two followers, a leader) and a client of its leader;
    its processes are stopped (by PID) and its files removed on the way out. The
    leader listens on `base_port`, the followers on the next two."""
    ports = [base_port + 1, base_port + 2]
    script, me = str(Path(__file__).resolve()), str(os.getpid())
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="raftlog-floor-") as directory:
        try:
            for port in ports:
                processes.append(subprocess.Popen([sys.executable, script, "follower", str(port), directory, me]))
            for port in ports:
                await _wait_listening(port)
            processes.append(subprocess.Popen([sys.executable, script, "leader", str(base_port), directory, me,
                                               *map(str, ports)]))
            await _wait_listening(base_port)
            async with AsyncClient([f"127.0.0.1:{base_port}"], timeout_s=10) as client:
                yield Pipeline(client, directory, tuple(process.pid for process in processes))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


async def measure(record: bytes, count: int, warmup: int) -> list[float]:
    """Sequential produce latencies (ms) through a fresh floor pipeline."""
    samples = []
    async with pipeline() as floor:
        client = floor.client
        for _ in range(warmup):
            await client.produce_batch("floor", 0, record)
        for _ in range(count):
            began = time.perf_counter()
            await client.produce_batch("floor", 0, record)
            samples.append((time.perf_counter() - began) * 1000)
    return samples


def percentile(sorted_samples: list[float], fraction: float) -> float:
    return sorted_samples[min(len(sorted_samples) - 1, int(len(sorted_samples) * fraction))]


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"p50 {statistics.median(ordered):.2f} ms, p90 {percentile(ordered, 0.9):.2f} ms, "
            f"p99 {percentile(ordered, 0.99):.2f} ms, max {ordered[-1]:.2f} ms")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "follower":
        uvloop.run(serve_follower(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "leader":
        uvloop.run(serve_leader(int(sys.argv[2]), [int(p) for p in sys.argv[5:]], sys.argv[3], int(sys.argv[4])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    if args.count < 100:
        parser.error("--count: at least 100, or the p99 is one sample")
    from storage.batch import Record, encode_batch

    record = encode_batch([Record(None, b"x" * 100)], first_timestamp_ms=int(time.time() * 1000))
    samples = uvloop.run(measure(record, args.count, args.warmup))
    print(f"floor pipeline, {args.count} sequential writes: {summary(samples)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
