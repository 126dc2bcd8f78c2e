"""Goal: the Python client against a real cluster: batching (idempotent) producer,
consumers by partition and by group with commits, retries past a dead server,
and the blocking client giving the same answers from another thread."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.client import AsyncClient, AsyncConsumer, AsyncProducer, Client, RaftlogError
from multiraft.state.partitioner import partition_for_key
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


def _servers(cluster: Cluster) -> list[str]:
    dead = f"127.0.0.1:{free_port('127.0.0.1')}"  # nobody listens: the client must move on
    return [dead] + [f"{s.host}:{s.port}" for s in cluster.servers]


async def test_batching_idempotent_producer_and_group_consumer(cluster: Cluster) -> None:
    async with asyncio.timeout(60):
        async with AsyncClient(_servers(cluster), backoff_s=0.01) as client:
            await client.create_topic("cli-t", partitions=3, replication_factor=3)
            await cluster.create_topic_wait("cli-t")
            async with AsyncProducer(client, "cli-t", linger_ms=20, batch_records_max=50,
                                     idempotent=True) as producer:
                futures = [await producer.send(b"v%d" % i, key=b"k%d" % (i % 7)) for i in range(300)]
                await producer.flush()
                placed = [f.result() for f in futures]
            assert producer.producer_id >= 0
            for i, (partition, _) in enumerate(placed):
                assert partition == partition_for_key(b"k%d" % (i % 7), 3)
            per_partition: dict[int, list[int]] = {}
            for partition, offset in placed:
                per_partition.setdefault(partition, []).append(offset)
            for offsets in per_partition.values():
                assert offsets == list(range(len(offsets))), "in order and gapless per partition"

            consumer = AsyncConsumer(client, "cli-t", group="g1", max_records=100, wait_ms=200)
            await consumer.start()
            seen = []
            while len(seen) < 300:
                seen += await consumer.poll()
            assert sorted(r.value for r in seen) == sorted(b"v%d" % i for i in range(300))
            await consumer.commit()
            assert await client.fetch_offsets("g1", "cli-t") == {p: len(o) for p, o in per_partition.items()}

            again = AsyncConsumer(client, "cli-t", group="g1", wait_ms=50)
            await again.start()
            assert await again.poll() == [], "a group resumes after its committed offsets"
            latest = AsyncConsumer(client, "cli-t", partitions=[0], start="latest", wait_ms=50)
            await latest.start()
            assert latest.positions == {0: len(per_partition.get(0, []))}

            with pytest.raises(RaftlogError) as raised:
                await client.describe_topic("missing")
            assert (raised.value.code, raised.value.status) == ("UNKNOWN_TOPIC", 404)


async def test_blocking_client_from_a_thread(cluster: Cluster) -> None:
    def work() -> list[bytes]:
        with Client(",".join(_servers(cluster)), backoff_s=0.01) as client:
            client.create_topic("sync-t", partitions=1)
            for _ in range(100):  # the topic's leader may still be electing on a slow box
                try:
                    client.produce("sync-t", [{"value": "a"}, {"value": "b"}])
                    break
                except RaftlogError as error:
                    if not error.retriable:
                        raise
            with client.producer("sync-t", linger_ms=0) as producer:
                producer.send(b"c").result(30)
            consumer = client.consumer("sync-t")
            values: list[bytes] = []
            while len(values) < 3:
                values += [r.value for r in consumer.poll()]
            return values

    async with asyncio.timeout(60):
        assert await asyncio.to_thread(work) == [b'"a"', b'"b"', b"c"]
