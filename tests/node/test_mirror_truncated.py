"""Goal: a mirror partition whose source's retention deleted offsets it had not copied does what
its link's `on_source_truncated` says (docs/mirror.md "The source truncated past a mirror"):
with `resync` it starts again by itself at the source's log start and ends identical to the
source (log start, high watermark, every batch's offset and bytes), running, the resync counted
in the link's status (in the OpenAPI document's shape) and on /metrics, and a read below the new
start answered 416; with `stop` (the default) it stays `source_truncated` and keeps all it had,
until the policy is changed in place.

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's fixture). The source
topics have 4 KiB segments and no retention while the mirror topics are made (a mirror takes
its source's settings when it is made, so the sink keeps everything); both links are then
paused, the source's retention set to 8 KiB and some 100 KB written, so retention deletes past
the mirrors' positions; then the links are resumed. Each mirror partition records its source
partition's identity when made, and the resync checks it (a truncation is confirmed 5 s after
it is first seen, against the source's description of its replicas).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from multiraft.http.openapi import openapi_document
from storage.batch import Record, encode_batch
from tests.http.test_api_mirror_tls import _shape_problems
from tests.node.test_mirror import Side, _http, _log, _same, clusters  # noqa: F401 (the fixture)
from tests.node.test_node_cluster import produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")
SEGMENT = {"segment_bytes": 4096}
RETENTION = {"retention_bytes": 8192}


def _fat(tag: int) -> bytes:
    return encode_batch([Record(None, b"%06d-" % tag + b"x" * 200) for _ in range(4)], first_timestamp_ms=tag + 1)


def _replica_starts(source: Side, topic: str) -> list[int]:
    """Each live source replica's log start of `topic`/0 (retention runs per replica)."""
    return [int(n.stores[n.partition_group(topic, 0)].log_start_offset) for n in source.live()]


async def _retention_settled(source: Side, topics: dict[str, int]) -> None:
    """Wait until the source's retention deleted past each topic's mirror position (`topics`) on
    every replica (else a mirror resumed first could copy on before any truncation), and is done:
    every replica's log start unchanged over two compaction rounds (2 s each). A resync starts at
    the lowest log start over the replicas its confirmation reads (mirror_truncated.py); were
    retention still deleting then, a replica could delete past that start before the new
    incarnation copied it, and a second resync follow (correct, but this test counts one)."""
    def starts() -> list[list[int]]:
        return [_replica_starts(source, t) for t in topics]

    async with asyncio.timeout(60):
        while True:
            before = starts()
            await asyncio.sleep(4.5)
            now = starts()
            if now == before and all(min(s) > copied for s, copied in zip(now, topics.values(), strict=True)):
                return


async def _partition(session: aiohttp.ClientSession, sink: Side, link: str) -> dict[str, object]:
    status, report = await _http(session, sink.live()[0], "GET", f"/v1/admin/mirrors/{link}")
    assert status == 200, report
    return report["topics"][0]["partitions"][0]


async def _until_state(session: aiohttp.ClientSession, sink: Side, link: str, state: str) -> dict[str, object]:
    async with asyncio.timeout(30):
        while (partition := await _partition(session, sink, link))["state"] != state:
            await asyncio.sleep(0.2)
    return partition


async def test_a_source_truncated_past_the_mirror_resyncs_or_stops_as_the_link_says(
        clusters: tuple[Side, Side]) -> None:  # noqa: F811 (the fixture imported above)
    source, sink = clusters
    for topic in ("trunc-re", "trunc-stop"):
        await source.nodes[0].api.create_topic(topic, 1, 3, SEGMENT)
        await source.nodes[0].api.wait_for_topic(topic)
        for n in range(5):
            await produce_retrying(source.nodes[n % 3], topic, 0, _fat(n))
    sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
    session = aiohttp.ClientSession()
    try:
        for link, topic, policy in (("re", "trunc-re", {"on_source_truncated": "resync"}), ("st", "trunc-stop", {})):
            status, created = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors",
                                          json={"name": link, "sources": sources, "topics": topic, **policy})
            assert status == 201 and created["on_source_truncated"] == policy.get("on_source_truncated", "stop")
        copied = {}  # each mirror's position when paused
        for topic in ("trunc-re", "trunc-stop"):
            await until(lambda t=topic: t in sink.nodes[0].catalog.topics, f"the mirror of {topic}", 20)
            [copied[topic]] = await _same(source, sink, topic, 1)
            assert copied[topic] > 0
        old = {t: sink.nodes[0].catalog.topic(t).partitions[0].group_id for t in ("trunc-re", "trunc-stop")}
        # Each mirror partition records which source partition it copies: its group id at the source.
        identity = {t: int(source.nodes[0].catalog.topic(t).partitions[0].group_id) for t in old}
        assert {t: sink.nodes[1].catalog.topic(t).partitions[0].source_group for t in old} == identity
        for link in ("re", "st"):
            status, _ = await _http(session, sink.nodes[0], "POST", f"/v1/admin/mirrors/{link}/pause")
            assert status == 200
        await asyncio.sleep(0.5)  # the pulls see the pause within a scan

        # The source's retention deletes past what the mirrors copied while they are paused.
        for topic in ("trunc-re", "trunc-stop"):
            await source.nodes[0].api.alter_topic_config(topic, RETENTION)
            for n in range(100, 220):
                await produce_retrying(source.nodes[n % 3], topic, 0, _fat(n))
        await _retention_settled(source, copied)
        for link in ("re", "st"):
            status, _ = await _http(session, sink.nodes[1], "POST", f"/v1/admin/mirrors/{link}/resume")
            assert status == 200

        # resync: confirmed against the source's replicas and its identity, a new incarnation from
        # the lowest log start over them (all equal once retention settled), the identity kept.
        await _same(source, sink, "trunc-re", 1)
        source_start, _, _ = await _log(source.live()[0], "trunc-re", 0)
        assert min(_replica_starts(source, "trunc-re")) == source_start
        info = sink.nodes[2].catalog.topic("trunc-re").partitions[0]
        assert info.group_id != old["trunc-re"] and info.start_offset == source_start
        assert info.source_group == identity["trunc-re"]
        partition = await _until_state(session, sink, "re", "running")
        status, report = await _http(session, sink.nodes[1], "GET", "/v1/admin/mirrors/re")
        assert _shape_problems(openapi_document(), "/v1/admin/mirrors/{name}", "get", "200", report) == []
        assert partition["truncated_resyncs"] == 1, partition
        assert partition["last_truncated_resync"]["start_offset"] == source_start  # type: ignore[index]
        assert partition["last_truncated_resync"]["deleted"] == [copied["trunc-re"],  # type: ignore[index]
                                                                 source_start - 1]
        status, below = await _http(session, sink.nodes[0], "GET", "/v1/topics/trunc-re/partitions/0/records",
                                    params={"offset": "0"})
        assert status == 416 and below["error_code"] == "OFFSET_OUT_OF_RANGE", below
        assert str(source_start) in below["message"], below
        resyncs = 0.0
        for node in sink.live():
            status, text = await _http(session, node, "GET", "/metrics")
            for family in text_string_to_metric_families(text.decode()):
                resyncs += sum(s.value for s in family.samples if s.name == "raftlog_mirror_truncated_resyncs_total"
                               and s.labels == {"link": "re"})
        assert resyncs == 1

        # stop: it waits, keeping all it had, until the policy is changed in place.
        partition = await _until_state(session, sink, "st", "source_truncated")
        deleted = f"deleted offsets {copied['trunc-stop']}..{partition['source_log_start_offset'] - 1} "  # type: ignore[operator]
        assert deleted in str(partition["last_error"]) and "stop" in str(partition["last_error"]), partition
        await asyncio.sleep(1.0)
        assert sink.nodes[0].catalog.topic("trunc-stop").partitions[0].group_id == old["trunc-stop"]
        kept_start, kept_end, _ = await _log(sink.live()[0], "trunc-stop", 0)
        assert (kept_start, kept_end) == (0, copied["trunc-stop"]) and partition["truncated_resyncs"] == 0
        status, altered = await _http(session, sink.nodes[1], "PATCH", "/v1/admin/mirrors/st",
                                      json={"on_source_truncated": "resync"})
        assert status == 200 and altered["on_source_truncated"] == "resync", altered
        await _same(source, sink, "trunc-stop", 1)
        assert sink.nodes[0].catalog.topic("trunc-stop").partitions[0].group_id != old["trunc-stop"]
    finally:
        await session.close()
