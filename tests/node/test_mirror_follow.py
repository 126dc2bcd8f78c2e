"""Goal: a mirror follows its source topic's partition increase, as a Kafka MirrorMaker 2
user expects: the source's 2 partitions altered to 4, the sink's mirror reaches 4
partitions, the new ones copied with the source's offsets and bytes (docs/mirror.md,
"Links and mirror topics").

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's fixture); the
increase is made through the source's HTTP API, as `raftlog topic alter --partitions`
makes it.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.node.test_mirror import Side, _batch, _http, _log, _same, clusters  # noqa: F401 (the fixture)
from tests.node.test_node_cluster import produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_a_mirror_follows_its_source_from_two_partitions_to_four(
        clusters: tuple[Side, Side]) -> None:  # noqa: F811 (the fixture imported above)
    source, sink = clusters
    await source.nodes[0].api.create_topic("orders", 2, 3, {})
    await source.nodes[0].api.wait_for_topic("orders")
    for n in range(6):
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
    async with aiohttp.ClientSession() as session:
        sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
        status, link = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors",
                                   json={"name": "dr", "sources": sources, "topics": "orders"})
        assert status == 201, link
        await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
        await _same(source, sink, "orders", 2)

        status, grown = await _http(session, source.nodes[1], "POST", "/v1/topics/orders/partitions",
                                    json={"count": 4})
        assert status == 200 and len(grown["partitions"]) == 4, grown
        for n in range(6, 18):  # every partition, the new ones from their first offset
            await produce_retrying(source.nodes[n % 3], "orders", n % 4, _batch(n, 3))

        await until(lambda: all(len(n.catalog.topic("orders").partitions) == 4 for n in sink.nodes),
                    "the mirror grown to 4 partitions on every sink node", 30)
        hws = await _same(source, sink, "orders", 4)  # log start, high watermark, every batch's offset and bytes
        assert all(hw > 0 for hw in hws), hws
        for node in sink.nodes:  # every replica of the new partitions, not only the one _same reads
            topic = node.catalog.topic("orders")
            assert topic.is_mirror and topic.mirror_partitions == 4
            for partition in (2, 3):
                assert node.registry.partitions[topic.partitions[partition].group_id].state.mirror
                want = await _log(source.nodes[0], "orders", partition)
                async with asyncio.timeout(20):  # a follower learns the last commit a heartbeat after the leader
                    while (got := await _log(node, "orders", partition)) != want and got[1] < want[1]:
                        await asyncio.sleep(0.05)
                assert got == want, (node.id, partition, got, want)

        status, report = await _http(session, sink.nodes[2], "GET", "/v1/admin/mirrors/dr")
        assert status == 200 and [len(t["partitions"]) for t in report["topics"]] == [4], report
        assert report["discovery"]["refused"] == [], report
        status, refused = await _http(session, sink.nodes[0], "POST", "/v1/topics/orders/partitions/3/records",
                                      json={"records": [{"value": "x"}]})
        assert status == 403 and refused["error_code"] == "MIRROR_READ_ONLY", refused

