"""Goal: the full sync between clusters finds exactly the range where a mirror's committed
batches differ from its source's, repairs it, and costs one root per partition when the
copies are identical (issue 24, docs/mirror.md "Full sync").

Two real 3-node clusters in one event loop (tests/node/test_mirror.py's fixture): a mirror
in sync verifies identical with one root compared per partition; then, with the link
paused, the sink's partition-0 leader commits a batch that differs from the source's batch
at the same offsets (same record count, other values: a test hook straight into its Raft
group, which no client can reach), while partition 1 falls behind. A report-only verify
says `different` with exactly the damaged leaf's range for partition 0 and `behind` for
partition 1; after the link resumes, a verify with repair resyncs partition 0 (a new
incarnation, refilled from the source); the mirror then holds the source's exact log
again and a second verify is identical, one root each. The link's status shows the last
full sync per partition, and /metrics counts the verifies by verdict where they ran.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from multiraft.http.mirror_openapi import PATHS
from storage.batch import Record, encode_batch
from storage.tictac import LEAF_OFFSETS
from tests.node.test_mirror import Side, _http, _log, _same, clusters  # noqa: F401 (the fixture)
from tests.node.test_node_cluster import produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's validator (the fuzz pass's)
_STATUS_SCHEMA = jsonschema_rs.Draft202012Validator(
    PATHS["/v1/admin/mirrors/{name}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"])
RECORDS = 100  # per batch
BATCHES = 100  # per partition: 10,000 offsets, three leaves


def _batch(n: int, value: bytes = b"value") -> bytes:
    return encode_batch([Record(b"k%d" % n, b"%s-%d-%d" % (value, n, i)) for i in range(RECORDS)],
                        first_timestamp_ms=n + 1)


async def _verify(session: aiohttp.ClientSession, sink: Side, **body: object) -> dict[str, object]:
    status, report = await _http(session, sink.nodes[2], "POST", "/v1/admin/mirrors/dr/verify", json=body)
    assert status == 200, report
    assert report["next_start"] is None, report
    return report


async def test_a_full_sync_finds_the_damaged_range_resyncs_it_and_then_compares_one_root(
        clusters: tuple[Side, Side]) -> None:  # noqa: F811 (the fixture imported above)
    source, sink = clusters
    await source.nodes[0].api.create_topic("orders", 2, 3, {})
    await source.nodes[0].api.wait_for_topic("orders")
    for n in range(2 * BATCHES):
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
    session = aiohttp.ClientSession()
    try:
        sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
        status, link = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors", json={
            "name": "dr", "sources": sources, "topics": "orders", "verify_interval_s": 3600})
        assert status == 201 and link["verify_interval_s"] == 3600, link
        await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
        assert await _same(source, sink, "orders", 2) == [BATCHES * RECORDS] * 2

        # In sync: identical, one root per partition.
        began = time.monotonic()
        report = await _verify(session, sink)
        took = time.monotonic() - began
        assert report["all_identical"] and report["verified"] == 2, report
        for verdict in report["partitions"]:
            assert (verdict["status"], verdict["nodes_compared"], verdict["spans"]) == ("identical", 1, 1), verdict
            assert (verdict["lo"], verdict["hi"]) == (0, BATCHES * RECORDS), verdict
        print(f"\nfull sync of 2 identical partitions of {BATCHES * RECORDS} offsets: {took:.3f} s, "
              f"{sum(v['nodes_compared'] for v in report['partitions'])} digests fetched")

        # Paused; partition 0's mirror commits a batch the source holds otherwise; partition 1 falls behind.
        status, _ = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors/dr/pause")
        assert status == 200
        await asyncio.sleep(0.5)  # running pulls see the pause within a scan
        end = BATCHES * RECORDS
        assert (await produce_retrying(source.nodes[0], "orders", 0, _batch(1000))).base_offset == end
        await produce_retrying(source.nodes[0], "orders", 1, _batch(1001))
        group = sink.nodes[0].catalog.topic("orders").partitions[0].group_id
        leader = next(n for n in sink.nodes if n.registry.leading(group) is not None)
        await leader.registry.leading(group).propose([_batch(1000, b"tampered")])  # the test hook
        await until(lambda: all(n.registry.partitions[group].state.high_watermark == end + RECORDS
                                for n in sink.nodes), "the differing batch on every sink replica", 10)

        report = await _verify(session, sink, repair=False)
        damaged, behind = report["partitions"]
        leaf = end // LEAF_OFFSETS * LEAF_OFFSETS
        # The damaged batch's leaf, clipped to the span compared (the leaf is not full yet).
        assert damaged["status"] == "different" and damaged["ranges"] == [[leaf, end + RECORDS]], damaged
        assert leaf <= end < leaf + LEAF_OFFSETS
        assert damaged["repair"] == "" and damaged["hi"] == end + RECORDS, damaged
        assert damaged["nodes_compared"] == 1 + 3, damaged  # the root, then its three leaves
        assert behind["status"] == "behind" and behind["nodes_compared"] == 1, behind
        assert behind["source_high_watermark"] == end + RECORDS, behind

        # Resumed: the real-time path goes on past the damage; a verify with repair resyncs it.
        status, _ = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors/dr/resume")
        assert status == 200
        for n in range(2000, 2010):
            await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
        await until(lambda: sink.nodes[0].registry.partitions[group].state.high_watermark == end + 6 * RECORDS,
                    "the mirror copying past the damage", 20)
        other = sink.nodes[0].catalog.topic("orders").partitions[1].group_id
        await until(lambda: all(n.registry.partitions[other].state.high_watermark == end + 6 * RECORDS
                                for n in sink.nodes), "partition 1 caught up on every sink replica", 20)
        report = await _verify(session, sink)
        damaged = report["partitions"][0]
        assert damaged["status"] == "different" and damaged["ranges"] == [[leaf, end + 6 * RECORDS]], damaged
        assert damaged["repair"] == "resync_started" and report["resyncs_started"] == 1, report
        assert report["partitions"][1]["status"] == "identical", report

        # The new incarnation is refilled from the source: the same offsets and bytes again.
        await until(lambda: sink.nodes[0].catalog.topic("orders").partitions[0].group_id != group,
                    "the new incarnation in the catalog", 10)
        assert await _same(source, sink, "orders", 2) == [end + 6 * RECORDS] * 2
        for node in sink.nodes:  # every replica holds the source's log, not only the one read above
            assert await _log(node, "orders", 0) == await _log(source.nodes[0], "orders", 0)
        report = await _verify(session, sink)
        assert report["all_identical"], report
        assert [v["nodes_compared"] for v in report["partitions"]] == [1, 1], report

        status, shown = await _http(session, sink.nodes[0], "GET", "/v1/admin/mirrors/dr")
        assert status == 200, shown
        _STATUS_SCHEMA.validate(shown)  # the last verdicts in the document's shape
        last = [p["last_verify"] for p in shown["topics"][0]["partitions"]]
        assert [v["status"] for v in last] == ["identical", "identical"], shown
        assert all(v["nodes_compared"] == 1 and v["at_ms"] > 0 for v in last), shown

        # /metrics counts the verifies where they ran (each partition's sink leader): summed over
        # the sink's nodes, the four verifies of two partitions above, by verdict.
        figures: dict[str, float] = {}
        for node in sink.nodes:
            status, text = await _http(session, node, "GET", "/metrics")
            assert status == 200
            for family in text_string_to_metric_families(text.decode()):
                for sample in family.samples:
                    if sample.name.startswith("raftlog_mirror_") and sample.labels.get("link") == "dr":
                        key = sample.name + "".join(f",{k}={v}" for k, v in sorted(sample.labels.items())
                                                    if k not in ("link", "le"))
                        if "le" not in sample.labels:
                            figures[key] = figures.get(key, 0.0) + sample.value
        verifies = {verdict: figures[f"raftlog_mirror_verifies_total,verdict={verdict}"]
                    for verdict in ("identical", "behind", "different", "source_damaged", "sink_damaged",
                                    "unreachable")}
        assert verifies == {"identical": 5, "behind": 1, "different": 2, "source_damaged": 0,
                            "sink_damaged": 0, "unreachable": 0}, figures
        assert figures["raftlog_mirror_verify_differing_ranges_total"] == 2, figures
        assert figures["raftlog_mirror_resyncs_started_total"] == 1, figures
        assert figures["raftlog_mirror_verify_spans_total"] == 8, figures
        assert figures["raftlog_mirror_verify_digests_fetched_total"] >= 8 + 3, figures  # a root each, 3 leaves
        assert figures["raftlog_mirror_verify_bytes_hashed_total"] > 0, figures
        assert figures["raftlog_mirror_verify_seconds_count"] == 8, figures
    finally:
        await session.close()
