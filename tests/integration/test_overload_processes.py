"""Goal (issue 26, "no storm under load"): load alone never moves leadership. Three
`raftlog serve` processes hold 60 partitions (RF 3) while producers write to every
partition; then CPU hogs, more of them than the box has cores, run beside the nodes
for a while, so every node's loop is late. Slower, never stormier: no election and
no leader change on any node during the hog window, and the writes go on (fewer of
them). The hogs are this test's own children, stopped by PID.

Its own ports (17660/18660), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient, RaftlogError
from tests.free_ports import require_free_ports, running
from tests.integration.test_scale_idle import _snapshot, _wait

pytestmark = pytest.mark.integration
PARTITIONS = 60
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
HOG_WINDOW_S = 10.0
SETTLE_BOUND_S = 60.0


def _hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _stop(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hog.pid, signal.SIGKILL)
        hog.wait(timeout=10)


async def _produce_until(client: AsyncClient, stop: asyncio.Event, acked: list[int]) -> None:
    """Writes to every partition, one request at a time, until `stop` (errors counted as
    nothing acked: the assertion is about leadership, the count shows progress)."""
    n = 0
    while not stop.is_set():
        records = [{"key": f"k{n}-{i}", "value": "v" * 100} for i in range(PARTITIONS * 2)]
        n += 1
        try:
            async with asyncio.timeout(20):
                acked[0] += len(await client.produce("load", records))
        except (RaftlogError, TimeoutError):
            await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_cpu_hogs_beside_the_nodes_change_no_leader(tmp_path: Path) -> None:
    require_free_ports(HOSTS, (17660, 18660), "test_overload_processes")
    cluster = LocalCluster(tmp_path / "overload", 3, raft_port=17660, http_port=18660)
    with running(cluster, 60):
        servers = cluster.http_addresses
        async with AsyncClient(servers, timeout_s=60) as client, aiohttp.ClientSession() as session:
            await client.create_topic("load", partitions=PARTITIONS, replication_factor=3)
            # Settled first: every partition led and leadership where the balancer wants it,
            # so that any change in the window is load's doing, not the settling's.
            await _wait(session, servers, SETTLE_BOUND_S, "led, quiet and balanced", lambda f: (
                all(n["quiet"] >= PARTITIONS + 1 for n in f) and min(n["leaders"] for n in f) >= PARTITIONS // 3
                and sum(n["leaders"] for n in f) == PARTITIONS + 1))
            stop, acked = asyncio.Event(), [0]
            producer = asyncio.create_task(_produce_until(client, stop, acked))
            try:
                await asyncio.sleep(2)  # the groups awake and replicating before the window
                before, acked_before = await _snapshot(session, servers), acked[0]
                hogs = _hogs((os.cpu_count() or 2) + 1)
                began = time.monotonic()
                try:
                    await asyncio.sleep(HOG_WINDOW_S)
                finally:
                    _stop(hogs)
                hogged_s = time.monotonic() - began
                after, acked_in_window = await _snapshot(session, servers), acked[0] - acked_before
            finally:
                stop.set()
                async with asyncio.timeout(30):
                    await producer
            for old, new in zip(before, after, strict=True):
                assert new["elections"] == old["elections"], f"elections under load: {before} -> {after}"
                assert new["leader_changes"] == old["leader_changes"], f"leader changes under load: {before} -> {after}"
            assert acked_in_window > 0, "no write was acknowledged while the hogs ran"
            print(f"overload: {len(hogs)} CPU hogs for {hogged_s:.1f} s beside 3 nodes x {PARTITIONS} partitions; "
                  f"{acked_in_window} records acked meanwhile; no election, no leader change")
