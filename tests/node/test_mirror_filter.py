"""Goal: a mirror link with a record filter (docs/mirror.md "Record filters") keeps the source's
offsets and high watermark, holds exactly the matching records at their source offsets (the
others are gap batches, left out of reads), verifies identical against the filtered source, and
a verify finds a batch the mirror holds otherwise.

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's fixture).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from storage.batch import Record, decode_columns, encode_batch, is_gap
from tests.node.test_mirror import _http, clusters  # noqa: F401 (the fixture)
from tests.node.test_node_cluster import produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")
FILTER = [{"key_prefix": "eu-"}, {"header": "keep", "value": "yes"}]


def _batch(n: int) -> bytes:
    """Batch n: five records whose keys mix regions by n (all eu, none, or runs of both)."""
    keys = [[b"eu-%d" % i, b"eu-x", b"eu", b"us-%d" % i, None][(n + i * (n % 3)) % 5] for i in range(5)]
    headers = [(("keep", b"yes"),) if (n, i) == (7, 4) else () for i in range(5)]
    return encode_batch([Record(k, b"v-%d-%d" % (n, i), h, i) for i, (k, h) in enumerate(zip(keys, headers, strict=True))],
                        first_timestamp_ms=1_000 * n)


def _copied(key: bytes | None, headers: tuple) -> bool:
    return (key is not None and key.startswith(b"eu-")) or ("keep", b"yes") in headers


async def _records(node, topic: str) -> dict[int, tuple]:
    """Every record a plain read returns: offset -> (key, value, headers, timestamp)."""
    found, offset = {}, 0
    while True:
        result = await node.api.consume(topic, 0, offset, max_bytes=1 << 20)
        for base, _count, data in result.batches:
            decoded = decode_columns(data)
            for i, key in enumerate(decoded.keys):
                if base + i >= offset:
                    found[base + i] = (key, decoded.values[i], decoded.headers[i],
                                       decoded.header.first_timestamp_ms + decoded.timestamp_deltas_ms[i])
        if result.next_offset >= result.high_watermark:
            return found
        offset = result.next_offset


async def _verify(session: aiohttp.ClientSession, sink, **body: object) -> dict:
    status, report = await _http(session, sink.nodes[2], "POST", "/v1/admin/mirrors/dr/verify", json=body)
    assert status == 200 and report["next_start"] is None, report
    return report


async def test_a_filtered_mirror_keeps_offsets_holds_the_matching_records_and_verifies(clusters) -> None:  # noqa: F811
    source, sink = clusters
    await source.nodes[0].api.create_topic("orders", 1, 3, {})
    await source.nodes[0].api.wait_for_topic("orders")
    for n in range(12):
        await produce_retrying(source.nodes[n % 3], "orders", 0, _batch(n))
    async with aiohttp.ClientSession() as session:
        sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
        status, link = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors", json={
            "name": "dr", "sources": sources, "topics": "orders", "record_filter": FILTER})
        assert status == 201 and link["record_filter"] == FILTER, link
        await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
        for n in range(12, 20):  # and copied live
            await produce_retrying(source.nodes[n % 3], "orders", 0, _batch(n))
        group = sink.nodes[0].catalog.topic("orders").partitions[0].group_id
        await until(lambda: all(n.registry.partitions[group].state.high_watermark == 100 for n in sink.nodes),
                    "the mirror at the source's high watermark on every sink replica", 30)

        want = {o: r for o, r in (await _records(source.nodes[0], "orders")).items() if _copied(r[0], r[2])}
        assert 0 < len(want) < 100
        for node in sink.nodes:
            assert await _records(node, "orders") == want  # at their source offsets, with their timestamps
        status, answer = await _http(session, sink.nodes[0], "GET", "/v1/topics/orders/partitions/0/records",
                                     params={"offset": "0", "max_records": "1000", "format": "string"})
        assert status == 200 and [r["offset"] for r in answer["records"]] == sorted(want), answer
        raw = await sink.nodes[0].api.consume("orders", 0, 0, max_bytes=1 << 20, keep_skipped=True)
        assert any(is_gap(data) for _, _, data in raw.batches)  # the raw read serves the gaps as stored
        status, listed = await _http(session, sink.nodes[0], "GET", "/v1/admin/mirrors")
        assert listed["mirrors"][0]["record_filter"] == FILTER
        status, refused = await _http(session, sink.nodes[0], "PATCH", "/v1/admin/mirrors/dr",
                                      json={"record_filter": [{"key_prefix": "us-"}]})
        assert (status, refused["error_code"]) == (400, "INVALID_REQUEST") and "fixed" in refused["message"]

        report = await _verify(session, sink, repair=False)
        assert report["all_identical"], report
        assert (report["partitions"][0]["lo"], report["partitions"][0]["hi"]) == (0, 100), report

        # Paused; the mirror commits a batch the filtered source holds otherwise: verify finds it.
        status, _ = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors/dr/pause")
        assert status == 200
        await asyncio.sleep(0.5)  # running pulls see the pause within a scan
        await produce_retrying(source.nodes[0], "orders", 0, _batch(100))
        leader = next(n for n in sink.nodes if n.registry.leading(group) is not None)
        tampered = encode_batch([Record(b"eu-tampered", b"x")] * 5, first_timestamp_ms=1)
        await leader.registry.leading(group).propose([tampered])  # the test hook
        await until(lambda: all(n.registry.partitions[group].state.high_watermark == 105 for n in sink.nodes),
                    "the differing batch on every sink replica", 10)
        report = await _verify(session, sink, repair=False)
        verdict = report["partitions"][0]
        assert verdict["status"] == "different" and verdict["ranges"] == [[0, 105]], verdict
