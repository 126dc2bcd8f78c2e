"""Goal: the HTTP API behaves over real HTTP against real `raftlog serve`
processes as it does in-process (tests/http/): every node answers health and
cluster, a topic created on one node is described everywhere, JSON and binary
records go in through any node (followers forward) and come out of every
replica unchanged, keyed records land on murmur2 partitions, long-polls wake on
a produce, idempotent retries answer with the original offsets, group offsets
read the same from every node, and errors keep the `{error_code, message}` shape.

The 3-process cluster is the session fixture of tests/integration/conftest.py,
shared with test_http_errors_processes.py; each test uses its own topics."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient
from multiraft.metadata.features import SUPPORTED_LEVEL
from multiraft.state.partitioner import partition_for_key
from storage.batch import Record, decode_batch, encode_batch
from tests.integration.conftest import (
    CALL_TIMEOUT_S,
    call,
    create_topic,
    leader_of,
    read_all,
    until,
)

pytestmark = pytest.mark.integration


@pytest.mark.asyncio
async def test_health_and_cluster_on_every_node(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        for node in cluster.nodes:
            status, body = await call(session, node.http_addr, "GET", "/v1/health")
            levels = body.pop("feature_level")  # docs/node.md "Upgrading": finalized by the first leader at once
            assert status == 200 and body == {"status": "ok", "node_id": node.node_id, "registered": True}
            assert levels["supported"] == SUPPORTED_LEVEL and not levels["unsupported"], levels

        async def agreed() -> list[dict[str, Any]] | None:
            views = [(await call(session, server, "GET", "/v1/cluster"))[1] for server in cluster.http_addresses]
            leaders = {v["metadata_leader"] for v in views}
            if len(leaders) != 1 or None in leaders or any(len(v["nodes"]) != 3 for v in views):
                return None
            return views

        views = await until(agreed, "every node agreeing on the metadata leader")
        for node, view in zip(cluster.nodes, views, strict=True):
            assert view["node_id"] == node.node_id
            assert [(n["node_id"], n["http_addr"], n["raft_addr"], n["status"]) for n in view["nodes"]] == [
                (n.node_id, n.http_addr, n.raft_addr, "alive") for n in cluster.nodes]


@pytest.mark.asyncio
async def test_topic_created_on_one_node_is_described_and_listed_by_the_others(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        created = await create_topic(session, cluster, "p-topics", partitions=3, via=1)
        assert created["name"] == "p-topics" and len(created["partitions"]) == 3
        for server in cluster.http_addresses:
            status, described = await call(session, server, "GET", "/v1/topics/p-topics")
            assert status == 200 and described["name"] == "p-topics"
            assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
            assert all(sorted(p["replicas"]) == [1, 2, 3] for p in described["partitions"])
            status, listed = await call(session, server, "GET", "/v1/topics")
            assert status == 200 and "p-topics" in [t["name"] for t in listed["topics"]]
        status, body = await call(session, cluster.http_addresses[2], "POST", "/v1/topics",
                                  json={"name": "p-topics", "partitions": 1})
        assert (status, body["error_code"]) == (409, "TOPIC_EXISTS"), body


@pytest.mark.asyncio
async def test_json_formats_and_keyed_records_read_the_same_from_every_node(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-keyed", partitions=4)
        keys = [f"user-{i}" for i in range(20)]
        status, body = await call(session, cluster.http_addresses[2], "POST", "/v1/topics/p-keyed/records",
                                  json={"records": [{"key": k, "value": i} for i, k in enumerate(keys)]})
        assert status == 200, body
        assert [o["partition"] for o in body["offsets"]] == [partition_for_key(k.encode(), 4) for k in keys]

        await create_topic(session, cluster, "p-fmt", partitions=1)
        raw = bytes(range(256))
        produced = [
            (0, "json", {"key": "k1", "value": {"a": [1, 2, None]}, "headers": [{"name": "h", "value": "v"}]}),
            (1, "json", {"value": "plain json string"}),
            (2, "string", {"key": "s", "value": "héllo"}),
            (0, "binary", {"key": base64.b64encode(b"\x00k").decode(), "value": base64.b64encode(raw).decode()}),
        ]
        for offset, (via, fmt, record) in enumerate(produced):
            status, body = await call(session, cluster.http_addresses[via], "POST", "/v1/topics/p-fmt/records",
                                      json={"format": fmt, "records": [record]})
            assert status == 200 and body["offsets"] == [{"partition": 0, "offset": offset}], body

        seen = []
        for server in cluster.http_addresses:  # followers serve reads too
            got = await read_all(session, server, "p-fmt", 0, 4)
            assert got[0]["key"] == "k1" and got[0]["value"] == {"a": [1, 2, None]}
            assert got[0]["headers"] == [{"name": "h", "value": "v"}]
            assert got[1]["value"] == "plain json string"
            assert got[2]["value_b64"] == base64.b64encode("héllo".encode()).decode(), "string value is not JSON"
            as_binary = await read_all(session, server, "p-fmt", 0, 4, format="binary")
            assert base64.b64decode(as_binary[3]["value"]) == raw
            assert base64.b64decode(as_binary[3]["key"]) == b"\x00k"
            as_string = await read_all(session, server, "p-fmt", 0, 4, format="string")
            assert as_string[2]["value"] == "héllo"
            seen.append((got, as_binary))
        assert seen[0] == seen[1] == seen[2], "the same records, timestamps included, from every node"


@pytest.mark.asyncio
async def test_binary_batch_through_a_follower_reads_back_byte_for_byte(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-bin", partitions=1)
        leader = await leader_of(session, cluster, "p-bin", 0)
    followers = [n.http_addr for n in cluster.nodes if n.node_id != leader]
    batches = [encode_batch([Record(b"k%d" % i, b"v%d" % i) for i in range(j, j + 3)], first_timestamp_ms=7)
               for j in (0, 3)]
    async with AsyncClient(followers, attempts=3) as client:
        for j, data in enumerate(batches):
            async with asyncio.timeout(CALL_TIMEOUT_S):
                answer = await client.produce_batch("p-bin", 0, data)
            assert (answer["partition"], answer["base_offset"], answer["count"]) == (0, 3 * j, 3), answer

    async with AsyncClient(cluster.http_addresses, attempts=3) as client:
        for server in cluster.http_addresses:
            async def frames_of(server: str = server) -> Any:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    read = await client.consume_batches("p-bin", 0, 0, wait_ms=500, server=server)
                return read if read.next_offset == 6 else None

            read = await until(frames_of, f"both batches on {server}")
            assert read.batches == [(0, batches[0]), (3, batches[1])], "whole stored batches, byte for byte"
            assert read.high_watermark == 6 and read.log_start_offset == 0
            assert [r.value for r in decode_batch(read.batches[1][1])[1]] == [b"v3", b"v4", b"v5"]
            async with asyncio.timeout(CALL_TIMEOUT_S):
                as_json = await client.consume("p-bin", 0, 0, format="string", server=server)
            assert [(r["key"], r["value"]) for r in as_json["records"]] == [(f"k{i}", f"v{i}") for i in range(6)]


@pytest.mark.asyncio
async def test_long_poll_on_a_follower_wakes_on_a_produce(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-poll", partitions=1)
        leader = await leader_of(session, cluster, "p-poll", 0)
        follower = next(n.http_addr for n in cluster.nodes if n.node_id != leader)
        started = time.monotonic()
        poll = asyncio.create_task(call(session, follower, "GET", "/v1/topics/p-poll/partitions/0/records",
                                        params={"offset": 0, "wait_ms": 10000}))
        await asyncio.sleep(0.3)  # let the poll reach the server (timing of the test itself, not a condition)
        assert not poll.done()
        status, body = await call(session, cluster.http_addresses[leader - 1], "POST", "/v1/topics/p-poll/records",
                                  json={"records": [{"value": "wake"}]})
        assert status == 200, body
        async with asyncio.timeout(CALL_TIMEOUT_S):
            status, body = await poll
        assert status == 200 and [r["value"] for r in body["records"]] == ["wake"], body
        assert time.monotonic() - started < 8, "woken by the record, not by the timeout"
        started = time.monotonic()
        status, body = await call(session, follower, "GET", "/v1/topics/p-poll/partitions/0/records",
                                  params={"offset": 1, "wait_ms": 300})
        assert status == 200 and body["records"] == [] and body["next_offset"] == 1
        assert 0.25 < time.monotonic() - started < 5, "an empty long-poll ends at wait_ms"


@pytest.mark.asyncio
async def test_idempotent_duplicate_is_answered_with_the_original_offsets(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-idem", partitions=1)
        status, _ = await call(session, cluster.http_addresses[0], "POST", "/v1/topics/p-idem/records",
                               json={"records": [{"value": "before"}]})
        assert status == 200
        status, producer = await call(session, cluster.http_addresses[2], "POST", "/v1/producers")
        assert status == 200 and set(producer) >= {"producer_id", "producer_epoch"}, producer
        request = {"records": [{"value": "x"}, {"value": "y"}], "producer_id": producer["producer_id"],
                   "producer_epoch": producer["producer_epoch"], "base_sequence": 0}
        path = "/v1/topics/p-idem/partitions/0/records"
        status, first = await call(session, cluster.http_addresses[0], "POST", path, json=request)
        assert status == 200 and first == {"partition": 0, "base_offset": 1, "count": 2, "duplicate": False}
        for server in cluster.http_addresses[1:]:  # the retry arrives through other nodes
            status, again = await call(session, server, "POST", path, json=request)
            assert status == 200, again
            assert (again["duplicate"], again["base_offset"], again["count"]) == (True, 1, 2), again
        status, body = await call(session, cluster.http_addresses[1], "POST", path,
                                  json={**request, "base_sequence": 9})
        assert (status, body["error_code"]) == (409, "OUT_OF_ORDER_SEQUENCE"), body
        for server in cluster.http_addresses:
            got = await read_all(session, server, "p-idem", 0, 3)
            assert [r["value"] for r in got] == ["before", "x", "y"], "stored once"


@pytest.mark.asyncio
async def test_group_offsets_committed_on_one_node_read_the_same_everywhere(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-grp", partitions=2)
        status, _ = await call(session, cluster.http_addresses[0], "POST", "/v1/topics/p-grp/records",
                               json={"records": [{"value": i, "partition": i % 2} for i in range(6)]})
        assert status == 200
        status, body = await call(session, cluster.http_addresses[1], "POST", "/v1/groups/p-readers/offsets",
                                  json={"offsets": [{"topic": "p-grp", "partition": 0, "offset": 2},
                                                    {"topic": "p-grp", "partition": 1, "offset": 3}]})
        assert status == 200, body
        for server in cluster.http_addresses:
            async def committed(server: str = server) -> list[tuple[int, int]] | None:
                status, body = await call(session, server, "GET", "/v1/groups/p-readers/offsets",
                                          params={"topic": "p-grp"})
                assert status == 200, body
                got = [(o["partition"], o["offset"]) for o in body["offsets"]]
                return got if got else None

            assert await until(committed, f"the group's offsets on {server}") == [(0, 2), (1, 3)]
        async with AsyncClient(cluster.http_addresses, attempts=3) as client:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                assert await client.fetch_offsets("p-readers", "p-grp") == {0: 2, 1: 3}


@pytest.mark.asyncio
async def test_errors_keep_their_status_and_shape_on_every_node(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, "p-err", partitions=1)
        status, _ = await call(session, cluster.http_addresses[0], "POST", "/v1/topics/p-err/records",
                               json={"records": [{"value": "kept"}]})
        assert status == 200
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            ("GET", "/v1/topics/p-nope", {}, 404, "UNKNOWN_TOPIC"),
            ("POST", "/v1/topics/p-nope/records", {"json": {"records": [{"value": 1}]}}, 404, "UNKNOWN_TOPIC"),
            ("GET", "/v1/topics/p-nope/partitions/0/records", {"params": {"offset": "0"}}, 404, "UNKNOWN_TOPIC"),
            ("GET", "/v1/topics/p-err/partitions/0/records", {"params": {"offset": "99"}}, 416,
             "OFFSET_OUT_OF_RANGE"),
            ("POST", "/v1/topics", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
             "INVALID_REQUEST"),
            ("POST", "/v1/topics/p-err/records",
             {"data": b'{"records": [', "headers": {"Content-Type": "application/json"}}, 400, "INVALID_REQUEST"),
        ]
        for server in cluster.http_addresses:
            for method, path, kwargs, want_status, want_code in cases:
                status, body = await call(session, server, method, path, **kwargs)
                assert isinstance(body, dict) and set(body) == {"error_code", "message"}, (server, path, body)
                assert (status, body["error_code"]) == (want_status, want_code), (server, path, body)
                assert body["message"] and "Traceback" not in body["message"]
            status, body = await call(session, server, "GET", "/v1/health")
            assert status == 200 and body["status"] == "ok"
        for server in cluster.http_addresses:
            got = await read_all(session, server, "p-err", 0, 1)
            assert [r["value"] for r in got] == ["kept"], "the data is untouched"
        status, body = await call(session, cluster.http_addresses[0], "GET", "/v1/topics/p-err/partitions/0/records",
                                  params={"offset": "1"})
        assert status == 200 and body["records"] == [] and body["next_offset"] == 1, "the end itself is in range"
        assert json.dumps(body)  # a plain JSON body
