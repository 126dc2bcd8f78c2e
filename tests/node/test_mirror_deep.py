"""Goal: a mirror's full sync is fast by default (closed segments count by their tree
sidecars on both sides, docs/mirror.md "Incremental trees"), and `deep` has the sink and
the source read every segment: the source's replicas hash the whole partition for a deep
verify only, and rot in the source's closed segments under their sidecars is not seen by a
default verify and is by a deep one (`source_damaged`).

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's fixture).
"""

from __future__ import annotations

import pytest

from tests.node.test_mirror import _http, _same, clusters  # noqa: F401 (the fixture)
from tests.node.test_mirror_fullsync import RECORDS, _batch, _verify
from tests.node.test_node_cluster import produce_retrying, until
from tests.node.test_scrubber import _flip_a_byte_at_offset

pytestmark = pytest.mark.asyncio(loop_scope="function")
BATCHES = 60


async def _warm(nodes: list) -> None:
    for node in nodes:
        while await node.sidecar_warmer.pass_once():
            pass


@pytest.mark.integration
async def test_a_deep_mirror_verify_reads_both_sides_and_finds_rot_under_a_sidecar(clusters) -> None:  # noqa: F811
    import aiohttp

    source, sink = clusters
    async with aiohttp.ClientSession() as session:
        await source.nodes[0].api.create_topic("orders", 1, 3, {"segment_bytes": 8192})
        await source.nodes[0].api.wait_for_topic("orders")
        sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
        status, _ = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors",
                                json={"name": "dr", "sources": sources, "topics": "orders"})
        assert status == 201
        await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
        for n in range(BATCHES):
            await produce_retrying(source.nodes[n % 3], "orders", 0, _batch(n))
        assert await _same(source, sink, "orders", 1) == [BATCHES * RECORDS]
        await _warm(source.nodes + sink.nodes)

        def source_hashed() -> int:
            return sum(n.scrubber.trees.bytes_hashed for n in source.nodes)

        before = source_hashed()
        report = await _verify(session, sink, repair=False)
        fast = source_hashed() - before
        assert report["all_identical"], report
        before = source_hashed()
        report = await _verify(session, sink, repair=False, deep=True)
        deep = source_hashed() - before
        assert report["all_identical"], report
        assert deep > 4 * fast and deep >= BATCHES * RECORDS * 5, (fast, deep)  # every batch read on the source

        for node in source.nodes:  # every source replica: the tree route answers from any of them
            _flip_a_byte_at_offset(node, "orders", 1000)
        report = await _verify(session, sink, repair=False)
        assert report["all_identical"], "the rotten segments counted by their sidecars: not read"
        report = await _verify(session, sink, repair=False, deep=True)
        assert report["partitions"][0]["status"] == "source_damaged", report
