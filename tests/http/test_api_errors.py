"""Goal: bad input of every kind gets a 4xx with the one error shape
`{"error_code", "message"}` (never a 500, never a traceback), and afterwards
the node is healthy and the data untouched."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import pytest

from multiraft.http import params
from multiraft.http.limits import RECORD_BYTES_MAX, RECORDS_PER_REQUEST_MAX, REQUEST_BYTES_MAX
from storage.batch import Record, encode_batch
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
BATCH = "application/vnd.raftlog.batch"
RECORDS = "/v1/topics/bad/partitions/0/records"
GOOD_BATCH = encode_batch([Record(b"k", b"v")], first_timestamp_ms=1)


def _corrupt(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


# (method, path, request kwargs, status, error code)
CASES: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("POST", "/v1/topics", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics", {"json": ["a", "list"]}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics", {"json": {"name": "bad name!"}}, 400, "INVALID_TOPIC"),
    ("POST", "/v1/topics", {"json": {"name": "x" * 250}}, 400, "INVALID_TOPIC"),
    ("POST", "/v1/topics", {"json": {"name": ".."}}, 400, "INVALID_TOPIC"),
    ("POST", "/v1/topics", {"json": {"name": "t", "partitions": 0}}, 400, "INVALID_PARTITIONS"),
    ("POST", "/v1/topics", {"json": {"name": "t", "partitions": "3"}}, 400, "INVALID_PARTITIONS"),
    ("POST", "/v1/topics", {"json": {"name": "t", "partitions": 10**9}}, 400, "INVALID_PARTITIONS"),
    ("POST", "/v1/topics", {"json": {"name": "t", "replication_factor": 9}}, 400, "INVALID_REPLICATION_FACTOR"),
    ("POST", "/v1/topics", {"json": {"name": "t", "replication_factor": 5}}, 400, "INVALID_REPLICATION_FACTOR"),
    ("POST", "/v1/topics", {"json": {"name": "t", "config": {"Bad Key": 1}}}, 400, "INVALID_CONFIG"),
    ("POST", "/v1/topics", {"json": {"name": "t", "surprise": 1}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics", {"data": b"name=t", "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
     415, "UNSUPPORTED_MEDIA_TYPE"),
    ("GET", "/v1/topics/nope", {}, 404, "UNKNOWN_TOPIC"),
    ("GET", "/v1/nowhere", {}, 404, "NOT_FOUND"),
    ("PUT", "/v1/topics", {}, 405, "METHOD_NOT_ALLOWED"),
    ("POST", "/v1/topics/nope/records", {"json": {"records": [{"value": 1}]}}, 404, "UNKNOWN_TOPIC"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": []}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": "x"}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [5]}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1, "extra": 2}]}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"key": 5, "value": 1}]}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"format": "xml", "records": [{"value": 1}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"format": "binary", "records": [{"value": "!!notb64"}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"acks": "some", "records": [{"value": 1}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1, "partition": 7}]}}, 404,
     "UNKNOWN_TOPIC"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1, "partition": -1}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1, "headers": {"a": "b"}}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1, "timestamp": -5}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"json": {"records": [{"value": 1}] * (RECORDS_PER_REQUEST_MAX + 1)}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/records", {"data": lambda: io.BytesIO(json.dumps({"format": "string", "records": [
        {"value": "x" * (RECORD_BYTES_MAX + 1)}]}).encode()), "headers": {"Content-Type": "application/json"}},
     413, "MESSAGE_TOO_LARGE"),
    ("POST", RECORDS, {"data": b"\x00" * 10, "headers": {"Content-Type": BATCH}}, 400, "INVALID_BATCH"),
    ("POST", RECORDS, {"data": _corrupt(GOOD_BATCH), "headers": {"Content-Type": BATCH}}, 400, "INVALID_BATCH"),
    ("POST", RECORDS, {"data": GOOD_BATCH[:-3], "headers": {"Content-Type": BATCH}}, 400, "INVALID_BATCH"),
    ("POST", RECORDS, {"data": b"", "headers": {"Content-Type": BATCH}}, 400, "INVALID_BATCH"),
    ("POST", RECORDS, {"data": GOOD_BATCH, "headers": {"Content-Type": "image/png"}}, 415,
     "UNSUPPORTED_MEDIA_TYPE"),
    ("POST", RECORDS, {"json": {"records": [{"value": 1}], "producer_id": 5}}, 400, "INVALID_REQUEST"),
    ("POST", RECORDS, {"json": {"records": [{"value": 1}], "producer_id": "a", "producer_epoch": 0,
                                "base_sequence": 0}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/partitions/9/records", {"json": {"records": [{"value": 1}]}}, 404, "UNKNOWN_TOPIC"),
    ("POST", "/v1/topics/bad/partitions/-1/records", {"json": {"records": [{"value": 1}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/topics/bad/partitions/x/records", {"json": {"records": [{"value": 1}]}}, 400,
     "INVALID_REQUEST"),
    ("GET", RECORDS, {}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "-1"}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "abc"}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "99"}}, 416, "OFFSET_OUT_OF_RANGE"),
    ("GET", RECORDS, {"params": {"offset": "0", "max_records": "0"}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "0", "max_bytes": str(2**40)}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "0", "wait_ms": "999999"}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "0", "isolation": "dirty"}}, 400, "INVALID_REQUEST"),
    ("GET", RECORDS, {"params": {"offset": "0", "format": "yaml"}}, 400, "INVALID_REQUEST"),
    ("GET", "/v1/topics/bad/partitions/3/records", {"params": {"offset": "0"}}, 404, "UNKNOWN_TOPIC"),
    ("POST", "/v1/groups/g/offsets", {"json": {"offsets": []}}, 400, "INVALID_REQUEST"),
    ("POST", "/v1/groups/g/offsets", {"json": {"offsets": [{"topic": "bad", "partition": 0, "offset": -1}]}}, 400,
     "INVALID_REQUEST"),
    ("POST", "/v1/groups/g/offsets", {"json": {"offsets": [{"topic": "nope", "partition": 0, "offset": 0}]}}, 404,
     "UNKNOWN_TOPIC"),
    ("POST", "/v1/groups/g/offsets", {"json": {"offsets": [{"topic": "bad", "partition": 0, "offset": 50}]}}, 416,
     "OFFSET_OUT_OF_RANGE"),
    ("POST", "/v1/groups/bad%20name/offsets", {"json": {"offsets": [{"topic": "bad", "partition": 0,
                                                                     "offset": 0}]}}, 400, "INVALID_REQUEST"),
    ("GET", "/v1/groups/g/offsets", {}, 400, "INVALID_REQUEST"),
    ("GET", "/v1/groups/g/offsets", {"params": {"topic": "nope"}}, 404, "UNKNOWN_TOPIC"),
    ("DELETE", "/v1/groups/never-committed", {}, 404, "UNKNOWN_GROUP"),
    ("DELETE", "/v1/groups/bad%20name", {}, 400, "INVALID_REQUEST"),
    ("POST", RECORDS, {"json": {"records": [{"value": 1}], "producer_id": 2**62, "producer_epoch": 0,
                                "base_sequence": 0}}, 400, "UNKNOWN_PRODUCER_ID"),
]



async def _ensure_bad_topic(cluster: Cluster) -> None:
    if "bad" not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic("bad", partitions=1)
        status, _ = await cluster.call("POST", 0, "/v1/topics/bad/records", json={"records": [{"value": "kept"}]})
        assert status == 200


async def _assert_untouched(cluster: Cluster, node_index: int) -> None:
    status, body = await cluster.call("GET", node_index, "/v1/health")
    assert status == 200 and body["status"] == "ok"
    status, body = await cluster.call("GET", 0, RECORDS, params={"offset": 0, "isolation": "uncommitted"})
    assert status == 200 and [r["value"] for r in body["records"]] == ["kept"], "the data is untouched"


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "code"), CASES,
                         ids=[f"{c[0]} {c[1]} -> {c[4]}#{i}" for i, c in enumerate(CASES)])
async def test_bad_input_gets_a_clear_4xx(cluster: Cluster, method: str, path: str, kwargs: dict[str, Any],
                                          status: int, code: str) -> None:
    await _ensure_bad_topic(cluster)
    node_index = len(path) % 3  # spread the cases over the nodes
    if callable(kwargs.get("data")):  # large bodies go as streams (aiohttp warns on large raw bytes)
        kwargs = {**kwargs, "data": kwargs["data"]()}
    got_status, body = await cluster.call(method, node_index, path, **kwargs)
    assert (got_status, body) != (got_status, b""), "an error always has a body"
    assert isinstance(body, dict) and set(body) == {"error_code", "message"}, body
    assert (got_status, body["error_code"]) == (status, code), body["message"]
    assert "Traceback" not in body["message"]
    await _assert_untouched(cluster, node_index)


async def test_oversized_body_is_refused_before_parsing(cluster: Cluster) -> None:
    await _ensure_bad_topic(cluster)
    big = io.BytesIO(b"\x00" * (REQUEST_BYTES_MAX + 1024))
    status, body = await cluster.call("POST", 1, RECORDS, data=big, headers={"Content-Type": BATCH})
    assert (status, body["error_code"]) == (413, "REQUEST_TOO_LARGE")
    await _assert_untouched(cluster, 1)


async def test_binary_values_invalid_as_json_and_text_come_back_as_b64(cluster: Cluster) -> None:
    await _ensure_bad_topic(cluster)
    await cluster.create_topic("raw", partitions=1)
    status, _ = await cluster.call("POST", 0, "/v1/topics/raw/records", json={
        "format": "binary", "records": [{"value": base64.b64encode(b"\xff\xfe").decode()}]})
    assert status == 200
    for fmt in ("json", "string"):
        status, body = await cluster.call("GET", 0, "/v1/topics/raw/partitions/0/records",
                                          params={"offset": 0, "format": fmt, "wait_ms": 2000})
        assert body["records"][0]["value_b64"] == base64.b64encode(b"\xff\xfe").decode()


async def test_slow_client_gets_408_and_the_node_stays_healthy(cluster: Cluster,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    await _ensure_bad_topic(cluster)
    monkeypatch.setattr(params, "BODY_READ_TIMEOUT_S", 0.5)
    server = cluster.servers[2]
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        body = json.dumps({"records": [{"value": 1}]}).encode()
        writer.write(b"POST /v1/topics/bad/records HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body)
        await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
    finally:
        writer.close()
        await writer.wait_closed()
    await _assert_untouched(cluster, 2)


async def test_abandoned_long_poll_leaves_the_node_healthy(cluster: Cluster) -> None:
    await _ensure_bad_topic(cluster)
    server = cluster.servers[0]
    _reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"GET " + RECORDS.encode() + b"?offset=1&wait_ms=20000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await _assert_untouched(cluster, 0)
