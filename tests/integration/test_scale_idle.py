"""Goal (issue 26, "scale without collapse"): a real 3-process cluster takes 1,000
partitions at replication factor 3 (3,000 replicas) in one create: the create answers,
every partition has a leader within a bound, and once the cluster has settled (every
group quiet, leadership on the preferred replicas, so the leadership balancer has
nothing left to move: it has no switch to turn it off) a 5 s idle window sees no
election and no leader change on any node.

1,000 rather than the issue's 3 x 1,000: on a 2-core CI box this module must stay under
a minute; bench/scale.py measures 2,000-3,000 (docs/scale.md). Its own ports
(17600/18600), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient
from tests.free_ports import require_free_ports, running

pytestmark = pytest.mark.integration
PARTITIONS = 1000
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
LED_BOUND_S = 30.0  # 4-10 s measured (bench/scale.py); before issue 26 a 2,000 step never got there
SETTLE_BOUND_S = 30.0  # quiet and on the preferred replicas, after every partition is led
IDLE_WINDOW_S = 5.0


async def _metrics(session: aiohttp.ClientSession, server: str) -> str:
    async with asyncio.timeout(10), session.get(f"http://{server}/metrics") as response:
        return await response.text()


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def _counter_sum(text: str, name: str) -> float:
    """The sum over every labelled series of a counter (one per group)."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:_total)?\{{[^}}]*\}} (\S+)$", text, re.MULTILINE))


async def _snapshot(session: aiohttp.ClientSession, servers: list[str]) -> list[dict[str, float]]:
    figures = []
    for server in servers:
        text = await _metrics(session, server)
        figures.append({
            "quiet": _gauge(text, "raftlog_quiesced_groups"),
            "leaders": _gauge(text, "raftlog_node_leaders"),
            "elections": _counter_sum(text, "raftlog_group_elections"),
            "leader_changes": _counter_sum(text, "raftlog_group_leader_changes"),
        })
    return figures


async def _wait(session: aiohttp.ClientSession, servers: list[str], bound_s: float, what: str,
                done) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound_s
    while True:
        figures = await _snapshot(session, servers)
        if done(figures):
            return figures
        assert time.monotonic() < deadline, f"{what} not within {bound_s} s: {figures}"
        await asyncio.sleep(0.5)


@pytest.mark.asyncio
async def test_a_thousand_partitions_are_led_within_a_bound_and_idle_without_elections(tmp_path: Path) -> None:
    require_free_ports(HOSTS, (17600, 18600), "test_scale_idle")
    cluster = LocalCluster(tmp_path / "scale", 3, raft_port=17600, http_port=18600)
    with running(cluster, 60):
        servers = cluster.http_addresses
        async with AsyncClient(servers, timeout_s=60) as client, aiohttp.ClientSession() as session:
            began = time.monotonic()
            await client.create_topic("scale", partitions=PARTITIONS, replication_factor=3)
            await _wait(session, servers, LED_BOUND_S, "every partition led",
                        lambda f: sum(n["leaders"] for n in f) == PARTITIONS + 1)
            led_s = time.monotonic() - began
            # Settled: every group quiet on every node, one leader per group, spread as the
            # preferred replicas are (the balancer's goal: it then starts no transfer).
            await _wait(session, servers, SETTLE_BOUND_S, "quiet and balanced", lambda f: (
                all(n["quiet"] >= PARTITIONS + 1 for n in f) and min(n["leaders"] for n in f) >= PARTITIONS // 3
                and sum(n["leaders"] for n in f) == PARTITIONS + 1))
            before = await _snapshot(session, servers)
            await asyncio.sleep(IDLE_WINDOW_S)
            after = await _snapshot(session, servers)
            for old, new in zip(before, after, strict=True):
                assert new["elections"] == old["elections"], f"elections while idle: {before} -> {after}"
                assert new["leader_changes"] == old["leader_changes"], f"leader changes while idle: {before} -> {after}"
                assert new["quiet"] >= PARTITIONS + 1, f"a group woke while idle: {after}"
            print(f"scale_idle: {PARTITIONS} partitions led after {led_s:.1f} s; idle {IDLE_WINDOW_S} s: "
                  f"no election, no leader change")
