"""Goal: POST /v1/admin/verify answers the contract's shape from any node, bounds its
work and progress, and refuses what it cannot mean (the scrubber itself: tests/node/test_scrubber.py)."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.node.scrubber import PARTITIONS_PER_CALL
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def test_verify_reports_every_partition_and_goes_on_where_it_stopped(cluster: Cluster) -> None:
    await cluster.create_topic("verify-t", partitions=PARTITIONS_PER_CALL + 2, replication_factor=3)
    await cluster.create_topic_wait("verify-t")
    status, body = await cluster.call("POST", 0, "/v1/topics/verify-t/partitions/0/records",
                                      json={"format": "string", "records": [{"value": "hello"}]})
    assert status == 200, body
    status, first = await cluster.call("POST", 1, "/v1/admin/verify", json={"topics": ["verify-t"]})
    assert status == 200, first
    assert first["total"] == PARTITIONS_PER_CALL + 2 and first["verified"] == PARTITIONS_PER_CALL
    assert first["next_start"] == PARTITIONS_PER_CALL
    status, rest = await cluster.call("POST", 2, "/v1/admin/verify",
                                      json={"topics": ["verify-t"], "start": first["next_start"]})
    assert status == 200 and rest["next_start"] is None and rest["verified"] == 2
    partitions = first["partitions"] + rest["partitions"]
    assert [p["partition"] for p in partitions] == list(range(PARTITIONS_PER_CALL + 2))
    for partition in partitions:
        assert partition["status"] in ("identical", "behind"), partition
        assert partition["ranges"] == [] and not partition["repair_started"]
        assert len(partition["replicas"]) == 2
    assert partitions[0]["high_watermark"] == 1
    for deep in (True, False):  # true is the default; false takes closed segments' sidecars: the same answer
        status, again = await cluster.call("POST", 0, "/v1/admin/verify", json={"topics": ["verify-t"], "deep": deep})
        assert status == 200 and again["verified"] == PARTITIONS_PER_CALL, again
        assert all(p["status"] in ("identical", "behind") for p in again["partitions"])


async def test_verify_refuses_unknown_topics_and_fields(cluster: Cluster) -> None:
    status, body = await cluster.call("POST", 0, "/v1/admin/verify", json={"topics": ["no-such-topic"]})
    assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC")
    status, body = await cluster.call("POST", 0, "/v1/admin/verify", json={"topic": "x"})
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")
    status, body = await cluster.call("POST", 0, "/v1/admin/verify", json={"topics": []})
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")
    status, body = await cluster.call("POST", 0, "/v1/admin/verify", json={"deep": "yes"})
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")
    status, body = await cluster.call("POST", 0, "/v1/admin/verify", json={"start": 10_000})
    assert (status, body["error_code"]) == (416, "OFFSET_OUT_OF_RANGE")


async def test_metrics_count_what_the_scrubber_verified(cluster: Cluster) -> None:
    await cluster.create_topic("verify-m", partitions=1, replication_factor=3)
    status, _ = await cluster.call("POST", 0, "/v1/admin/verify", json={"topics": ["verify-m"]})
    assert status == 200
    verified = 0.0
    for i in range(3):
        status, text = await cluster.call("GET", i, "/metrics")
        lines = [line for line in text.decode().splitlines() if line.startswith("raftlog_scrub_partitions_verified_total")]
        assert lines, "every node exposes the scrubber's counters"
        verified += float(lines[0].split()[-1])
        names = {line.split()[0] for line in text.decode().splitlines() if line.startswith("raftlog_tree_sidecar_")}
        assert {f"raftlog_tree_sidecar_{name}_total" for name in (
            "written", "write_failures", "writes_dropped", "warmer_bytes_hashed", "segments_from_sidecars", "ignored",
            "mismatched")} <= names, "and the tree sidecars' (docs/mirror.md \"Incremental trees\")"
    assert verified >= 1, "the partition's leader counted its verify"


async def test_scrub_status_shows_each_nodes_schedule(cluster: Cluster) -> None:
    # Goal: GET /v1/admin/scrub answers each node's own scheduled scrubs (the default: a week,
    # 16 MiB/s) and its verdicts counted by status; within a sync period (5 s) the partitions
    # each node leads are on its schedule; another method is 405 (the fuzz pass does the rest).
    await cluster.create_topic("scrub-status-t", partitions=3, replication_factor=3)
    await cluster.create_topic_wait("scrub-status-t")
    async with asyncio.timeout(30):
        while True:
            bodies = []
            for node_index in range(3):
                status, body = await cluster.call("GET", node_index, "/v1/admin/scrub")
                assert status == 200, body
                bodies.append(body)
            if sum(b["partitions_scheduled"] for b in bodies) >= 3:
                break
            await asyncio.sleep(0.5)
    for node_index, body in enumerate(bodies):
        assert body["node"] == node_index + 1 and body["interval_s"] == 7 * 86_400
        assert body["bytes_per_s"] == 16 * 1024 * 1024
        assert set(body["verdicts"]) == {"identical", "behind", "different", "leader_damaged", "unreachable"}
        assert isinstance(body["latest_not_identical"], list)
        if body["partitions_scheduled"]:
            assert body["next_due_ms"] is not None
    status, body = await cluster.call("POST", 0, "/v1/admin/scrub")
    assert status == 405, body
