"""The one real 3-process cluster the HTTP integration modules share, and their helpers.

`cluster` is session-scoped: `test_http_processes.py` and
`test_http_errors_processes.py` run against the same `raftlog serve` processes
(fixed ports 17300/18300 on 127.0.0.1-3, so nothing clashes with test_cli.py),
started once when the first of them needs it. Each test uses its own topics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from tests.free_ports import process_cluster

RAFT_PORT = 17300
HTTP_PORT = 18300
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
STARTUP_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 15.0
CONDITION_TIMEOUT_S = 15.0
BATCH = "application/vnd.raftlog.batch"
T = TypeVar("T")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("http-processes")
    with process_cluster(directory, HOSTS, RAFT_PORT, HTTP_PORT, "the HTTP integration tests",
                         STARTUP_TIMEOUT_S) as local:
        yield local


async def call(session: aiohttp.ClientSession, server: str, method: str, path: str,
               **kwargs: Any) -> tuple[int, Any]:
    """One raw request to one node: status and decoded JSON (or raw bytes)."""
    async with asyncio.timeout(CALL_TIMEOUT_S):
        async with session.request(method, f"http://{server}{path}", **kwargs) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.read()


async def until(probe: Callable[[], Awaitable[T | None]], what: str,
                timeout_s: float = CONDITION_TIMEOUT_S) -> T:
    """Poll `probe` until it returns something other than None, within a deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        got = await probe()
        if got is not None:
            return got
        last = got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last {last!r})")
        await asyncio.sleep(0.05)  # poll interval, not a condition wait


async def create_topic(session: aiohttp.ClientSession, cluster: LocalCluster, name: str, partitions: int,
                       via: int = 0, replication_factor: int = 3,
                       config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create through node `via`, then wait until every node knows the topic and every
    replica of each partition sees a leader and a watermark."""
    status, body = await call(session, cluster.http_addresses[via], "POST", "/v1/topics",
                              json={"name": name, "partitions": partitions,
                                    "replication_factor": replication_factor, "config": config or {}})
    assert status == 201, body

    async def ready() -> bool | None:
        for node in cluster.nodes:
            got_status, described = await call(session, node.http_addr, "GET", f"/v1/topics/{name}")
            if got_status != 200 or len(described["partitions"]) != partitions:
                return None
            if any(node.node_id in p["replicas"] and (p["leader"] is None or p["high_watermark"] is None)
                   for p in described["partitions"]):
                return None
        return True

    await until(ready, f"leaders of {name} on every replica")
    return body


async def leader_of(session: aiohttp.ClientSession, cluster: LocalCluster, topic: str, partition: int) -> int:
    async def probe() -> int | None:
        for server in cluster.http_addresses:
            _, described = await call(session, server, "GET", f"/v1/topics/{topic}")
            view = described["partitions"][partition]
            if view.get("role") == "leader":
                return int(view["leader"])
        return None

    return await until(probe, f"the leader of {topic}/{partition}")


async def read_all(session: aiohttp.ClientSession, server: str, topic: str, partition: int, count: int,
                   **params: Any) -> list[dict[str, Any]]:
    """Records 0..count-1 of a partition as `server` serves them (a follower may apply a moment later)."""
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    while len(records) < count:
        status, body = await call(session, server, "GET", f"/v1/topics/{topic}/partitions/{partition}/records",
                                  params={"offset": len(records), "wait_ms": 500, **params})
        assert status == 200, body
        records += body["records"]
        assert time.monotonic() < deadline, f"{server} serves {len(records)} of {count} records"
    assert [r["offset"] for r in records] == list(range(count))
    return records


async def read_values(session: aiohttp.ClientSession, server: str, topic: str, partition: int,
                      count: int) -> dict[int, str]:
    """Offset -> value (string format) of a partition's first `count` records, read from
    `server` (bounded: at most 10,000 reads)."""
    values: dict[int, str] = {}
    offset = 0
    for _ in range(10_000):
        if offset >= count:
            break
        status, body = await call(session, server, "GET", f"/v1/topics/{topic}/partitions/{partition}/records",
                                  params={"offset": offset, "wait_ms": 500, "format": "string"})
        assert status == 200, body
        for record in body["records"]:
            values[record["offset"]] = record["value"]
        offset = body["next_offset"]
    assert offset >= count, f"{topic}/{partition}: read to {offset} of {count}"
    return values
