"""Goal: the live operations of issue 25 on three real `raftlog serve` processes, under a
producer that never stops: `raftlog topic alter T --partitions 6` grows a 3-partition
topic, every new partition gets a leader on every node's view and takes the producer's
records, and a consumer group member subscribed before the growth is assigned all six;
`raftlog node drain N --wait` ends with node N leading no partition while writes go on;
`raftlog node undrain N` gives it leadership back; and every acknowledged record is
read back at its offset, with its value: nothing acknowledged was lost.

Its own ports (17250/18250), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from tests.free_ports import require_free_ports, running
from tests.group_member import Member, settle
from tests.integration.conftest import call, create_topic, read_values, until

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
RAFT_PORT, HTTP_PORT = 17250, 18250
TOPIC = "live"
# Balancing a second after a change, so undrain's leadership comes back within the test.
BALANCE_TOML = "leader_balance_settle_ms = 1000\nleader_balance_target_live_ms = 1000\n"
# Answers a client retries across a leadership change (a transfer refuses proposals for a
# moment) or, during the growth, at a node whose catalog has not the new partition yet.
RETRIED = ("NOT_LEADER", "LEADER_NOT_AVAILABLE", "PROPOSAL_DROPPED", "LEADERSHIP_TRANSFER_IN_PROGRESS",
           "NOT_ENOUGH_REPLICAS", "OVERLOADED", "TIMEOUT", "OUTCOME_UNKNOWN", "UNKNOWN_TOPIC")


@pytest.fixture(scope="module")
def live_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("live-ops-processes")
    settings = directory / "balance.toml"
    settings.write_text(BALANCE_TOML)
    require_free_ports(HOSTS, (RAFT_PORT, HTTP_PORT), "the live operations integration test")
    local = LocalCluster(directory / "data", len(HOSTS), raft_port=RAFT_PORT, http_port=HTTP_PORT,
                         extra_args=("--tick-ms", "20", "--config", str(settings)))
    with running(local, 30.0):
        yield local


def raftlog(*args: str, server: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multiraft.cli", *args, "--server", server], text=True,
                          capture_output=True, timeout=timeout_s, check=False)


class Producer:
    """Unkeyed records through the topic route (the server spreads them over every partition
    it knows), one request at a time, round the nodes; acknowledged offsets kept."""

    def __init__(self, session: aiohttp.ClientSession, servers: list[str]) -> None:
        self.session = session
        self.servers = servers
        self.acked: dict[tuple[int, int], str] = {}  # (partition, offset) -> value
        self.sent = 0
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            values = [f"v{self.sent + i}" for i in range(6)]
            self.sent += len(values)
            status, body = await call(self.session, self.servers[self.sent % len(self.servers)], "POST",
                                      f"/v1/topics/{TOPIC}/records",
                                      json={"format": "string", "records": [{"value": v} for v in values]})
            if status == 200:  # per record: an offset, or (that partition refused it) an error
                for value, acked in zip(values, body["offsets"], strict=True):
                    if acked["offset"] is None:
                        assert acked.get("error_code") in RETRIED, acked
                        continue
                    assert (acked["partition"], acked["offset"]) not in self.acked, "an offset given twice"
                    self.acked[(acked["partition"], acked["offset"])] = value
            else:
                assert body.get("error_code") in RETRIED, (status, body)  # a leadership change: not lost, unsure
                await asyncio.sleep(0.05)

    def partitions(self) -> set[int]:
        return {partition for partition, _ in self.acked}


async def _topic_views(session: aiohttp.ClientSession, cluster: LocalCluster) -> list[dict[str, Any]]:
    views = []
    for server in cluster.http_addresses:
        status, body = await call(session, server, "GET", f"/v1/topics/{TOPIC}")
        assert status == 200, body
        views.append(body)
    return views


async def _led_by(session: aiohttp.ClientSession, cluster: LocalCluster, node_id: int) -> int:
    """Partitions node `node_id` leads, by its own replicas' roles."""
    _, body = await call(session, cluster.http_addresses[node_id - 1], "GET", f"/v1/topics/{TOPIC}")
    return sum(1 for p in body["partitions"] if p.get("role") == "leader")


@pytest.mark.asyncio
async def test_grow_drain_undrain_under_a_live_producer(live_cluster: LocalCluster) -> None:
    servers = live_cluster.http_addresses
    async with aiohttp.ClientSession() as session:
        await create_topic(session, live_cluster, TOPIC, 3)

        async def do(node: int, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
            for _ in range(50):
                status, body = await call(session, servers[node % 3], method, path, **kwargs)
                if status not in (421, 503):
                    return status, body
                await asyncio.sleep(0.1)
            return status, body

        member = Member(do, 3, "live-readers")
        await member.join([TOPIC], session_timeout_ms=30_000)
        await settle([member])
        assert len(member.owned) == 3

        producer = Producer(session, servers)
        writing = asyncio.create_task(producer.run())
        try:
            await until(holds(lambda: len(producer.acked) >= 30), "the producer's first records")

            grown = raftlog("topic", "alter", TOPIC, "--partitions", "6", server=servers[1])
            assert grown.returncode == 0, grown.stderr
            assert "6 partitions" in grown.stdout and "keyed records may now map" in grown.stdout

            async def every_partition_led() -> bool | None:
                for view in await _topic_views(session, live_cluster):
                    if len(view["partitions"]) != 6 or any(p["leader"] is None for p in view["partitions"]):
                        return None
                return True

            await until(every_partition_led, "a leader of every new partition on every node", 30)
            await until(holds(lambda: producer.partitions() >= set(range(6))), "records in every new partition", 30)
            for _ in range(30):  # the member is assigned the new partitions at its heartbeats
                await member.heartbeat()
                if len(member.owned) == 6:
                    break
                await asyncio.sleep(0.1)
            assert {p for _, p in member.owned} == set(range(6))

            # Drain the node leading most partitions (any node leads some once balanced).
            counts = {n: await _led_by(session, live_cluster, n) for n in (1, 2, 3)}
            drained = max(counts, key=lambda n: (counts[n], -n))
            assert counts[drained] > 0, counts
            acked_before = len(producer.acked)
            done = await asyncio.to_thread(raftlog, "node", "drain", str(drained), "--wait", "--timeout", "60",
                                           server=servers[drained % 3])
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"node {drained} leads no partition" in done.stdout, done.stdout
            await until(_probe_led(session, live_cluster, drained, 0), "the drained node leads nothing", 15)
            _, cluster_view = await call(session, servers[0], "GET", "/v1/cluster")
            assert {n["node_id"]: n["drained"] for n in cluster_view["nodes"]}[drained] is True
            await until(holds(lambda: len(producer.acked) >= acked_before + 60), "writes go on while drained")
            status = raftlog("cluster", "status", server=servers[0])
            assert status.returncode == 0 and "alive, drained" in status.stdout and "LEADS" in status.stdout, status
            await asyncio.sleep(2.0)  # balancing rounds pass: nothing goes back to a drained node
            assert await _led_by(session, live_cluster, drained) == 0

            undone = raftlog("node", "undrain", str(drained), server=servers[(drained + 1) % 3])
            assert undone.returncode == 0, undone.stderr
            await until(_probe_led(session, live_cluster, drained, 1), "leadership back on the undrained node", 60)
        finally:
            producer.stopping = True
            await writing

        print(f"\nlive ops: {len(producer.acked)} records acknowledged of {producer.sent} sent over 6 partitions; "
              f"node {drained} drained from {counts[drained]} led partitions and given leadership back")
        # Nothing acknowledged was lost: every acked offset holds its value, on the leader's view.
        assert len(producer.acked) > 100
        for partition in range(6):
            offsets = sorted(o for p, o in producer.acked if p == partition)
            records = await read_values(session, servers[partition % 3], TOPIC, partition, offsets[-1] + 1)
            for offset in offsets:
                assert records[offset] == producer.acked[(partition, offset)], (partition, offset)


def holds(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool | None]]:
    """A probe for `until`: True once `condition()` holds."""

    async def probe() -> bool | None:
        return True if condition() else None

    return probe


def _probe_led(session: aiohttp.ClientSession, cluster: LocalCluster, node_id: int, at_least: int) -> Any:
    """A probe: node `node_id` leads none (`at_least` 0), or at least `at_least` partitions."""

    async def probe() -> bool | None:
        led = await _led_by(session, cluster, node_id)
        return True if (led == 0 if at_least == 0 else led >= at_least) else None

    return probe
