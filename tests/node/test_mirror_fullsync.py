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

The resync keeps the identical prefix (multiraft/node/mirror_prefix.py): the source topic
has 16 KiB segments (the mirror takes them), and the mirror copies it live, so its log
holds many entries in several files below the damage. Every sink replica builds the new
incarnation from its own copy up to the cut (each node's counter says so), the new
incarnation pulls only the records from the cut on from the source, and every replica
ends with the source's log. A second test rots a closed segment below the cut on one sink
follower, then on two: those replicas keep nothing (their check fails), start as new
replicas (at the kept prefix's term) and are caught up by the new leader; the others keep
the prefix; all end with the source's log.
A third stops a sink follower before the resync and starts it again after: its old
incarnation is no longer open there, so it keeps nothing, starts afresh and is caught up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from multiraft.http import HttpServer
from multiraft.http.mirror_openapi import PATHS
from multiraft.node import replicas
from multiraft.node.mirror_bootstrap import bootstrap_mirror
from multiraft.node.node import Node
from multiraft.node.registry import METADATA_GROUP
from storage.batch import Record, encode_batch
from storage.segments import SegmentStore
from storage.tictac import LEAF_OFFSETS
from tests.node.test_mirror import Side, _http, _log, _same, clusters  # noqa: F401 (the fixture)
from tests.node.test_node_cluster import produce_retrying, until

pytestmark = pytest.mark.asyncio(loop_scope="function")

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's validator (the fuzz pass's)
_STATUS_SCHEMA = jsonschema_rs.Draft202012Validator(
    PATHS["/v1/admin/mirrors/{name}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"])
RECORDS = 100  # per batch
BATCHES = 100  # per partition: 10,000 offsets, three leaves
SEGMENT_BYTES = 16384  # the source topic's (the mirror takes it): several closed files below the damage


def _batch(n: int, value: bytes = b"value") -> bytes:
    return encode_batch([Record(b"k%d" % n, b"%s-%d-%d" % (value, n, i)) for i in range(RECORDS)],
                        first_timestamp_ms=n + 1)


async def _verify(session: aiohttp.ClientSession, sink: Side, **body: object) -> dict[str, object]:
    status, report = await _http(session, sink.live()[-1], "POST", "/v1/admin/mirrors/dr/verify", json=body)
    assert status == 200, report
    assert report["next_start"] is None, report
    return report


async def _damaged_mirror(source: Side, sink: Side, session: aiohttp.ClientSession) -> tuple[int, int, int]:
    """Two mirror partitions copied live, in sync and identical; then partition 0's mirror holds a
    batch that differs from the source's at `end` and both copied on past it. (group, end, leaf)."""
    await source.nodes[0].api.create_topic("orders", 2, 3, {"segment_bytes": SEGMENT_BYTES})
    await source.nodes[0].api.wait_for_topic("orders")
    sources = [f"{n.config.http_addr.host}:{n.config.http_addr.port}" for n in source.nodes]
    status, link = await _http(session, sink.nodes[1], "POST", "/v1/admin/mirrors", json={
        "name": "dr", "sources": sources, "topics": "orders", "verify_interval_s": 3600})
    assert status == 201 and link["verify_interval_s"] == 3600, link
    await until(lambda: "orders" in sink.nodes[0].catalog.topics, "the mirror topic on the sink", 20)
    for n in range(2 * BATCHES):  # copied live: a few batches an entry, many entries
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
    groups = [p.group_id for p in source.nodes[0].catalog.topic("orders").partitions]
    await until(lambda: all(n.registry.partitions[g].state.high_watermark == BATCHES * RECORDS
                            for n in source.nodes for g in groups), "every source replica at its end", 10)
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

    # Resumed: the real-time path goes on past the damage.
    status, _ = await _http(session, sink.nodes[0], "POST", "/v1/admin/mirrors/dr/resume")
    assert status == 200
    for n in range(2000, 2010):
        await produce_retrying(source.nodes[n % 3], "orders", n % 2, _batch(n))
    await until(lambda: sink.nodes[0].registry.partitions[group].state.high_watermark == end + 6 * RECORDS,
                "the mirror copying past the damage", 20)
    other = sink.nodes[0].catalog.topic("orders").partitions[1].group_id
    await until(lambda: all(n.registry.partitions[other].state.high_watermark == end + 6 * RECORDS
                            for n in sink.nodes), "partition 1 caught up on every sink replica", 20)
    await until(lambda: all(n.registry.partitions[group].state.high_watermark == end + 6 * RECORDS
                            for n in sink.nodes), "partition 0 caught up on every sink replica", 20)
    return group, end, leaf


async def _resync_started(sink: Side, session: aiohttp.ClientSession, group: int, end: int, leaf: int) -> int:
    """A verify with repair resyncs partition 0 asking to keep its prefix, and the new incarnation is in
    every live catalog; the offset below which the old batches are kept."""
    report = await _verify(session, sink)
    damaged = report["partitions"][0]
    assert damaged["status"] == "different" and damaged["ranges"] == [[leaf, end + 6 * RECORDS]], damaged
    assert damaged["repair"] == "resync_started" and report["resyncs_started"] == 1, report
    assert report["partitions"][1]["status"] == "identical", report
    kept = damaged["kept_below"]
    assert 0 < kept <= leaf and kept % RECORDS == 0, damaged  # whole batches below the differing leaf
    await until(lambda: all(n.catalog.topic("orders").partitions[0].group_id != group for n in sink.live()),
                "the new incarnation in every catalog", 10)
    assert sink.live()[0].catalog.topic("orders").partitions[0].prefix[:1] == (group,)
    return int(kept)


async def _refilled(source: Side, sink: Side, session: aiohttp.ClientSession, group: int, end: int,
                    kept: int, restarted: frozenset[int] = frozenset()) -> None:
    """The new incarnation refilled from the source, only from the cut on: every sink replica holds the
    source's log, the old incarnation's files are gone (`restarted`: nodes down during the resync, which
    may keep them until a later restart), and a second verify is identical with one root each."""
    fresh = sink.nodes[0].catalog.topic("orders").partitions[0].group_id
    assert await _same(source, sink, "orders", 2) == [end + 6 * RECORDS] * 2
    for node in sink.nodes:  # every replica holds the source's log, not only the one read above
        await until(lambda node=node: fresh in node.registry.partitions and
                    node.registry.partitions[fresh].state.high_watermark == end + 6 * RECORDS,
                    f"node {node.id} refilled", 20)
        assert await _log(node, "orders", 0) == await _log(source.nodes[0], "orders", 0)
        if node.id not in restarted:
            assert not (node.config.data_dir / "groups" / str(group)).exists()  # the old incarnation's files
    # Only the records from the cut on came from the source again.
    pulled = sum(s.records_copied for n in sink.nodes if (s := n.mirror_pulls.status.get(fresh)) is not None)
    assert pulled == end + 6 * RECORDS - kept, (pulled, kept)
    report = await _verify(session, sink)
    assert report["all_identical"], report
    assert [v["nodes_compared"] for v in report["partitions"]] == [1, 1], report


async def test_a_full_sync_finds_the_damaged_range_resyncs_it_keeping_the_prefix_and_compares_one_root(
        clusters: tuple[Side, Side]) -> None:  # noqa: F811 (the fixture imported above)
    source, sink = clusters
    session = aiohttp.ClientSession()
    try:
        group, end, leaf = await _damaged_mirror(source, sink, session)
        kept = await _resync_started(sink, session, group, end, leaf)
        await _refilled(source, sink, session, group, end, kept)
        counts = [n.replicas.prefixes.counts for n in sink.nodes]
        assert [c["built"] for c in counts] == [1, 1, 1] and not any(c["fallbacks"] for c in counts), counts
        assert all(c["bytes_linked"] > 0 for c in counts), counts  # closed files kept whole, by a link
        print(f"prefix kept below offset {kept} of {end + 6 * RECORDS}: {counts}")

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


@pytest.mark.parametrize("rotten", [1, 2])
async def test_sink_replicas_whose_copy_fails_its_check_start_afresh_and_are_caught_up(
        clusters: tuple[Side, Side], rotten: int, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    source, sink = clusters
    session = aiohttp.ClientSession()
    started: dict[object, int] = {}  # store -> the term a new mirror replica was created at

    def bootstrap(store: SegmentStore, *arguments: Any) -> None:
        bootstrap_mirror(store, *arguments)
        started[store] = int(store.initial_state().hard_state.term)

    monkeypatch.setattr(replicas, "bootstrap_mirror", bootstrap)
    try:
        group, end, leaf = await _damaged_mirror(source, sink, session)
        # Rot in the first closed segment of `rotten` followers' copies (below any cut): the leader's
        # tree does not see it, each replica's check of what it would keep does. With two, the
        # replicas that keep nothing are a majority: they start at the kept prefix's term, so
        # whichever leads, the kept entries are replaced or committed, never taken for new ones.
        followers = [n for n in sink.nodes if n.registry.leading(group) is None][:rotten]
        for follower in followers:
            first = next(s for s in follower.registry.stores[group].segments if s.closed)
            with open(first.path, "r+b") as file:
                file.seek(first.size // 2)
                byte = file.read(1)
                file.seek(first.size // 2)
                file.write(bytes([byte[0] ^ 0xFF]))
        kept = await _resync_started(sink, session, group, end, leaf)
        await _refilled(source, sink, session, group, end, kept)
        for node in sink.nodes:
            counts = node.replicas.prefixes.counts
            want = (0, 1) if node in followers else (1, 0)
            assert (counts["built"], counts["fallbacks"]) == want, (node.id, counts)
        # Those that kept nothing were created at the kept prefix's term, not the bootstrap term.
        info = sink.nodes[0].catalog.topic("orders").partitions[0]
        created = [started[f.registry.stores[info.group_id]] for f in followers]
        assert created == [info.prefix[2]] * rotten and info.prefix[2] > 1, (created, info.prefix)
    finally:
        await session.close()


async def test_a_sink_replica_down_during_the_resync_starts_afresh_when_back_and_is_caught_up(
        clusters: tuple[Side, Side]) -> None:  # noqa: F811 (the fixture imported above)
    source, sink = clusters
    session = aiohttp.ClientSession()
    try:
        group, end, leaf = await _damaged_mirror(source, sink, session)
        # A follower of partition 0 (not the metadata leader) is down when the resync applies.
        position = next(i for i, n in enumerate(sink.nodes)
                        if n.registry.leading(group) is None and n.registry.leading(METADATA_GROUP) is None)
        away = sink.nodes[position]
        await sink.servers[position].stop()
        await away.stop()
        sink.stopped.add(away.id)
        kept = await _resync_started(sink, session, group, end, leaf)
        fresh = sink.live()[0].catalog.topic("orders").partitions[0].group_id
        await until(lambda: any(n.registry.leading(fresh) is not None for n in sink.live()),
                    "a leader of the new incarnation among the two that kept the prefix", 20)
        # Back: either its catalog learns of the resync before its reconciler opens the old
        # incarnation again (it keeps nothing, starts at the first start point and is caught up
        # by the new leader), or after (it keeps the prefix from the files it holds): which one
        # is the box's timing; both end byte-identical to the source (_refilled).
        back = Node(away.config)
        server = HttpServer(back.api, back.config.http_addr.host, back.config.http_addr.port)
        await back.start()
        await server.start()
        sink.nodes[position], sink.servers[position] = back, server
        sink.stopped.discard(away.id)
        await _refilled(source, sink, session, group, end, kept, restarted=frozenset({back.id}))
        assert (back.replicas.prefixes.counts["built"], back.replicas.prefixes.counts["fallbacks"]) in ((0, 1), (1, 0))
        assert all(n.replicas.prefixes.counts["built"] == 1 for n in sink.nodes if n is not back)
    finally:
        await session.close()
