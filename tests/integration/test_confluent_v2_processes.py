"""Goal: the Confluent REST v2 dialect over three real `raftlog serve` processes, every
call hopping to the next node: an instance created through one node is subscribed,
polled, committed and read back through the others; then its creating node (also the
group coordinator, the metadata leader: the hardest case) is killed with SIGKILL, and
the instance goes on through the survivors from where it was. Every record produced is
delivered exactly once over the whole run (no failure struck inside a call, so none is
repeated), none skipped, and the committed offsets come back through any node.

Its own ports (17900/18900), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from tests.free_ports import process_cluster
from tests.integration.conftest import call, create_topic, until

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
PARTITIONS = 6
PER_PARTITION = 10
V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
RETRIED = {421, 503, 504}  # a leader or coordinator moving: retry, as a client would (never a 500: a crash)


@pytest.fixture(scope="module")
def v2_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("confluent-v2-processes")
    with process_cluster(directory, HOSTS, 17900, 18900, "the Confluent v2 integration test") as local:
        yield local


class Client:
    """A Confluent v2 client that sends each call to the next live node."""

    def __init__(self, session: aiohttp.ClientSession, cluster: LocalCluster, live: list[int]) -> None:
        self.session, self.cluster, self.live, self.turn = session, cluster, live, 0

    async def __call__(self, method: str, path: str, body: Any = None, content_type: str = V2,
                       accept: str | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
        data = None if body is None else json.dumps(body).encode()
        for _ in range(100):
            server = self.cluster.http_addresses[self.live[self.turn % len(self.live)]]
            self.turn += 1
            try:
                async with asyncio.timeout(30):
                    async with self.session.request(method, f"http://{server}{path}", data=data,
                                                    headers=headers) as answer:
                        raw = await answer.read()
                        status, decoded = answer.status, json.loads(raw) if raw else None
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
                continue
            if status not in RETRIED:
                return status, decoded
            await asyncio.sleep(0.1)
        raise AssertionError(f"{method} {path}: still {status} {decoded}")


async def _poll(client: Client, base: str, delivered: list[tuple[int, int, str]], until_count: int) -> None:
    async with asyncio.timeout(60):
        while len(delivered) < until_count:
            status, records = await client("GET", f"{base}/records?timeout=300", accept=BINARY_V2)
            assert status == 200, records
            delivered += [(r["partition"], r["offset"], base64.b64decode(r["value"]).decode()) for r in records]


@pytest.mark.asyncio
async def test_an_instance_survives_the_death_of_the_node_that_created_it(v2_cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, v2_cluster, "clicks", PARTITIONS)
        _, view = await call(session, v2_cluster.http_addresses[0], "GET", "/v1/cluster")
        creator = int(view["metadata_leader"])  # the coordinator: killing it moves the group state's leader
        everyone = Client(session, v2_cluster, [0, 1, 2])
        for partition in range(PARTITIONS):
            status, body = await everyone("POST", f"/topics/clicks/partitions/{partition}", {"records": [
                {"value": base64.b64encode(f"{partition}-{i}".encode()).decode()} for i in range(PER_PARTITION)]},
                BINARY_V2)
            assert status == 200, body

        status, made = await call(session, v2_cluster.http_addresses[creator - 1], "POST", "/consumers/analytics",
                                  data=json.dumps({"name": "dash", "format": "binary",
                                                   "auto.offset.reset": "earliest",
                                                   "auto.commit.enable": "false"}),
                                  headers={"Content-Type": V2})
        assert status == 200, made
        made = json.loads(made)
        assert made["base_uri"].startswith(f"http://{v2_cluster.http_addresses[creator - 1]}/")
        base = "/consumers/analytics/instances/dash"
        others = [i for i in range(3) if i != creator - 1]
        hopping = Client(session, v2_cluster, [*others, creator - 1])  # every call on the next node
        status, body = await hopping("POST", f"{base}/subscription", {"topics": ["clicks"]})
        assert status == 204, body

        delivered: list[tuple[int, int, str]] = []
        half = PARTITIONS * PER_PARTITION // 2
        await _poll(hopping, base, delivered, half)
        status, body = await hopping("POST", f"{base}/offsets")  # commit every position
        assert status == 204, body

        v2_cluster.kill_node(creator)
        survivors = Client(session, v2_cluster, others)

        async def new_coordinator() -> int | None:
            _, now = await call(session, v2_cluster.http_addresses[others[0]], "GET", "/v1/cluster")
            leader = now.get("metadata_leader")
            return leader if leader and leader != creator else None

        await until(new_coordinator, "a new metadata leader", timeout_s=20)
        status, assigned = await survivors("GET", f"{base}/assignments")
        assert status == 200 and len(assigned["partitions"]) == PARTITIONS, assigned
        await _poll(survivors, base, delivered, PARTITIONS * PER_PARTITION)
        status, body = await survivors("POST", f"{base}/offsets")
        assert status == 204, body

        # Exactly once each, in order per partition: nothing lost, skipped or repeated.
        assert len(delivered) == PARTITIONS * PER_PARTITION
        for partition in range(PARTITIONS):
            mine = [(o, v) for p, o, v in delivered if p == partition]
            assert mine == [(i, f"{partition}-{i}") for i in range(PER_PARTITION)], mine
        status, committed = await survivors("GET", f"{base}/offsets", {"partitions": [
            {"topic": "clicks", "partition": p} for p in range(PARTITIONS)]})
        assert [o["offset"] for o in committed["offsets"]] == [PER_PARTITION] * PARTITIONS, committed
        status, body = await survivors("DELETE", base)
        assert status == 204, body
        status, body = await survivors("GET", f"{base}/subscription")
        assert (status, body["error_code"]) == (404, 40403)
        v2_cluster.start_node(creator)
