"""Goal: decommissioning a real `raftlog serve` process of four under a producer that
never stops (issue 25). Three voters start, a fourth joins as a learner; a topic of
four partitions (RF 3) is spread over the four. `raftlog node decommission 2 --wait`
prints its progress and ends with node 2 holding no replica and out of the metadata
group, the learner voting in its place; every acknowledged record is read back at
its offset with its value; and once node 2 is stopped, the cluster still says it is
ready (it does not wait for a decommissioned node).

Its own ports (17270/18270), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from tests.free_ports import require_free_ports, running
from tests.integration.conftest import call, create_topic, read_values, until

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
RAFT_PORT, HTTP_PORT = 17270, 18270
TOPIC = "leaving"
PARTITIONS = 4
LEAVING = 2
RETRIED = ("NOT_LEADER", "LEADER_NOT_AVAILABLE", "PROPOSAL_DROPPED", "LEADERSHIP_TRANSFER_IN_PROGRESS",
           "NOT_ENOUGH_REPLICAS", "OVERLOADED", "TIMEOUT", "OUTCOME_UNKNOWN")


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("decommission-processes")
    require_free_ports(HOSTS, (RAFT_PORT, HTTP_PORT), "the decommission integration test")
    local = LocalCluster(directory / "data", 3, raft_port=RAFT_PORT, http_port=HTTP_PORT,
                         extra_args=("--tick-ms", "20"))
    with running(local, 30.0):
        local.add_joiner()
        local.wait_healthy(30.0, nodes=[4])
        yield local


def raftlog(*args: str, server: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multiraft.cli", *args, "--server", server], text=True,
                          capture_output=True, timeout=timeout_s, check=False)


class Producer:
    """Records for one partition at a time, round the partitions and the staying nodes;
    acknowledged (partition, offset) -> value kept."""

    def __init__(self, session: aiohttp.ClientSession, servers: list[str]) -> None:
        self.session = session
        self.servers = servers
        self.acked: dict[tuple[int, int], str] = {}
        self.sent = 0
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            partition, value = self.sent % PARTITIONS, f"v{self.sent}"
            self.sent += 1
            status, body = await call(self.session, self.servers[self.sent % len(self.servers)], "POST",
                                      f"/v1/topics/{TOPIC}/partitions/{partition}/records",
                                      json={"format": "string", "records": [{"value": value}]})
            if status == 200:
                offset = body["base_offset"]
                assert (partition, offset) not in self.acked, "an offset given twice"
                self.acked[(partition, offset)] = value
            else:
                assert body.get("error_code") in RETRIED, (status, body)
                await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_decommission_a_voter_under_a_live_producer(four_nodes: LocalCluster) -> None:
    servers = four_nodes.http_addresses
    staying = [s for i, s in enumerate(servers, start=1) if i != LEAVING]
    async with aiohttp.ClientSession() as session:

        async def four_alive() -> bool | None:
            _, view = await call(session, servers[0], "GET", "/v1/cluster")
            return True if sum(n["status"] == "alive" for n in view["nodes"]) == 4 else None

        await until(four_alive, "four live nodes", 30)
        await create_topic(session, four_nodes, TOPIC, PARTITIONS)
        _, described = await call(session, servers[0], "GET", f"/v1/topics/{TOPIC}")
        assert sum(LEAVING in p["replicas"] for p in described["partitions"]) >= 2, described

        producer = Producer(session, staying)
        writing = asyncio.create_task(producer.run())
        try:
            await until(_holds(lambda: len(producer.acked) >= 20), "the producer's first records")
            done = await asyncio.to_thread(raftlog, "node", "decommission", str(LEAVING), "--wait",
                                           "--timeout", "150", server=servers[2])
            assert done.returncode == 0, done.stdout + done.stderr
            assert "moving replicas" in done.stdout, done.stdout
            assert f"node {LEAVING} is decommissioned" in done.stdout, done.stdout
            acked_at_done = len(producer.acked)
            await until(_holds(lambda: len(producer.acked) >= acked_at_done + 20), "writes go on after")
        finally:
            producer.stopping = True
            await writing

        _, view = await call(session, servers[0], "GET", "/v1/cluster")
        assert sorted(view["metadata_voters"]) == [1, 3, 4], view
        assert {n["node_id"]: n["decommissioning"] for n in view["nodes"]}[LEAVING] is True
        _, described = await call(session, servers[0], "GET", f"/v1/topics/{TOPIC}")
        for partition in described["partitions"]:
            assert LEAVING not in partition["replicas"] and len(partition["replicas"]) == 3, partition
        print(f"\ndecommission: {len(producer.acked)} records acknowledged of {producer.sent} sent; "
              f"CLI output:\n{done.stdout}")

        for partition in range(PARTITIONS):
            offsets = sorted(o for p, o in producer.acked if p == partition)
            records = await read_values(session, staying[partition % 3], TOPIC, partition, offsets[-1] + 1)
            for offset in offsets:
                assert records[offset] == producer.acked[(partition, offset)], (partition, offset)

        four_nodes.kill_node(LEAVING)  # by PID

        async def ready() -> bool | None:
            status, _ = await call(session, servers[0], "GET", "/v1/health", params={"ready": "cluster"})
            return True if status == 200 else None

        await until(ready, "the cluster ready without the decommissioned node", 30)


def _holds(condition: Any) -> Any:
    async def probe() -> bool | None:
        return True if condition() else None

    return probe
