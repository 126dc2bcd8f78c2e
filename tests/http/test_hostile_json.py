"""Goal (issue 21, family 1): JSON in is standard and bounded, JSON out cannot fail.

One careless producer must not poison a partition for every JSON consumer; a body
nested 100,000 deep or holding NaN is a 400, never a 500; a topic setting nobody
knows is refused with INVALID_CONFIG naming the key.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from typing import Any

import pytest

from multiraft.http import params
from multiraft.http.jsontext import JSON_DEPTH_MAX
from multiraft.http.limits import JSON_BYTES_MAX
from storage.batch import Record, encode_batch
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
BATCH = "application/vnd.raftlog.batch"
JSON = {"Content-Type": "application/json"}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def _read_all(cluster: Cluster, topic: str, node: int = 0) -> tuple[int, Any]:
    return await cluster.call("GET", node, f"/v1/topics/{topic}/partitions/0/records"
                             "?offset=0&max_records=100&wait_ms=5000")


async def test_a_deeply_nested_value_is_refused_and_the_partition_stays_readable(cluster: Cluster) -> None:
    await cluster.create_topic("deep", replication_factor=3)
    path = "/v1/topics/deep/partitions/0/records"
    status, body = await cluster.call("POST", 0, path, data=f'{{"records":[{{"value":{_nested(300)}}}]}}',
                                      headers=JSON)
    assert status == 400 and body["error_code"] == "INVALID_REQUEST" and "nests deeper" in body["message"], body
    status, body = await cluster.call("POST", 0, "/v1/topics/deep/records",
                                      data=f'{{"records":[{{"value":{_nested(62)}}}]}}', headers=JSON)
    assert status == 400, body
    status, body = await cluster.call("POST", 0, path, json={"records": [{"value": {"ok": [1, 2]}}]})
    assert status == 200, body
    for node in range(3):
        status, body = await _read_all(cluster, "deep", node)
        assert status == 200 and [r["value"] for r in body["records"]] == [{"ok": [1, 2]}], body


async def test_values_a_binary_producer_stored_never_fail_a_json_read(cluster: Cluster) -> None:
    await cluster.create_topic("odd-values", replication_factor=3)
    huge_int = "123456789012345678901234567890"
    values = [_nested(300).encode(), b"NaN", b'{"n":1e400}', b'"\xed\xa0\x80"', huge_int.encode(), b'{"a": 1}']
    batch = encode_batch([Record(None, v) for v in values], first_timestamp_ms=1)
    status, body = await cluster.call("POST", 0, "/v1/topics/odd-values/partitions/0/records", data=batch,
                                      headers={"Content-Type": BATCH})
    assert status == 200, body
    status, raw = await cluster.call("GET", 0, "/v1/topics/odd-values/partitions/0/records?offset=0&wait_ms=5000")
    assert status == 200, raw
    records = raw["records"]
    for record, value in zip(records[:4], values[:4], strict=True):
        assert "value" not in record and base64.b64decode(record["value_b64"]) == value
    assert records[5]["value"] == {"a": 1}
    async with cluster.session.get(cluster.url(0, "/v1/topics/odd-values/partitions/0/records?offset=4")) as answer:
        text = await answer.text()
    assert f'"value":{huge_int}' in text  # embedded as stored: the integer keeps every digit
    assert json.loads(text)["records"][0]["value"] == int(huge_int)


@pytest.mark.parametrize("body", [
    _nested(100_000),
    '{"name":"t","x":' + _nested(5_000) + "}",
    '{"name":"t","x":' + _nested(JSON_DEPTH_MAX) + "}",
    '{"name":"t","partitions":NaN}',
    '{"name":"t","partitions":Infinity}',
    '{"name":"t","partitions":1e400}',
    '{"name":"t","partitions":' + "9" * 5000 + "}",
])
async def test_hostile_json_bodies_get_400(cluster: Cluster, body: str) -> None:
    status, answer = await cluster.call("POST", 1, "/v1/topics", data=body, headers=JSON)
    assert status == 400 and answer["error_code"] == "INVALID_REQUEST", answer
    status, _ = await cluster.call("GET", 1, "/v1/health")
    assert status == 200


async def test_topic_config_takes_only_known_keys_and_finite_numbers(cluster: Cluster) -> None:
    await cluster.create_topic("configs", replication_factor=3)
    for raw, code, named in [('{"config":{"x":NaN}}', "INVALID_REQUEST", None),
                             ('{"config":{"x":1}}', "INVALID_CONFIG", "'x'"),
                             ('{"config":{"retention_ms":1e400}}', "INVALID_REQUEST", None),
                             ('{"config":{"retention.ms":1000}}', "INVALID_CONFIG", "'retention.ms'")]:
        status, body = await cluster.call("PATCH", 0, "/v1/topics/configs", data=raw, headers=JSON)
        assert status == 400 and body["error_code"] == code, (raw, body)
        assert named is None or named in body["message"], body
    status, body = await cluster.call("POST", 0, "/v1/topics", json={"name": "configs2", "config": {"colour": "red"}})
    assert status == 400 and body["error_code"] == "INVALID_CONFIG" and "'colour'" in body["message"], body
    status, body = await cluster.call("PATCH", 0, "/v1/topics/configs", json={"config": {"retention_ms": 60_000}})
    assert status == 200 and body["config"] == {"retention_ms": 60_000}, body
    async with cluster.session.get(cluster.url(0, "/v1/topics/configs")) as answer:
        json.loads(await answer.text(), parse_constant=lambda name: pytest.fail(f"describe emitted {name}"))


@pytest.mark.parametrize(("record", "what"), [
    ({"key": "\ud800", "value": 1}, "key"),
    ({"value": "\udfff"}, "value"),
    ({"value": 1, "headers": [{"name": "\ud800", "value": "v"}]}, "headers name"),
])
async def test_a_lone_surrogate_is_400_not_500(cluster: Cluster, record: dict[str, Any], what: str) -> None:
    if "surrogates" not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic("surrogates", replication_factor=3)
    body = json.dumps({"records": [record]})  # ensure_ascii: the surrogate travels as \\udXXX
    status, answer = await cluster.call("POST", 0, "/v1/topics/surrogates/records", data=body, headers=JSON)
    assert status == 400 and answer["error_code"] == "INVALID_REQUEST" and what in answer["message"], answer


async def test_a_long_poll_on_a_topic_deleted_meanwhile_ends_cleanly(cluster: Cluster) -> None:
    # Goal: a reader waiting at the log end of a partition that is deleted gets a clean
    # answer (404 UNKNOWN_TOPIC, or an empty 200 if the delete came first) at once, not a 500.
    await cluster.create_topic("vanishing", replication_factor=3)
    path = "/v1/topics/vanishing/partitions/0/records?offset=0&wait_ms=20000"
    polls = [asyncio.create_task(cluster.call("GET", node, path)) for node in range(3)]
    await asyncio.sleep(0.3)  # the polls are waiting at the log end
    status, _ = await cluster.call("DELETE", 0, "/v1/topics/vanishing")
    assert status == 204
    async with asyncio.timeout(10):
        answers = await asyncio.gather(*polls)
    for status, body in answers:
        assert (status, body.get("error_code")) in ((404, "UNKNOWN_TOPIC"), (200, None)), body


def _empties(size: int) -> bytes:
    return b"[" + b",".join([b"[]"] * (size // 3)) + b"]"


async def _chunked(data: bytes) -> Any:
    """The body without a Content-Length (chunked transfer): the size is known only once read."""
    yield data


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_json_body_beyond_its_route_bound_is_413(cluster: Cluster, chunked: bool) -> None:
    # Goal: every JSON route but produce and offset commits takes at most JSON_BYTES_MAX
    # (1 MiB); on main a 15.7 MiB topic creation held the loop 3 s and grew memory by 749 MiB.
    assert JSON_BYTES_MAX <= 1 << 20
    body = b'{"name":"big","config":{},"x":"' + b"a" * (1 << 20) + b'"}'
    status, answer = await cluster.call("POST", 2, "/v1/topics", data=_chunked(body) if chunked else io.BytesIO(body),
                                        headers=JSON)
    assert status == 413 and answer["error_code"] == "REQUEST_TOO_LARGE", answer
    assert set(answer) >= {"error_code", "message"}


@pytest.mark.parametrize("path", ["/v1/topics", "/v1/topics/empties/records",
                                  "/v1/topics/empties/partitions/0/records", "/v1/groups/g/offsets"])
async def test_fifteen_mib_of_empty_arrays_is_413_and_stores_nothing(cluster: Cluster, path: str) -> None:
    # Goal: a body whose parse would build millions of objects is refused before parsing.
    if "empties" not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic("empties", replication_factor=3)
    records = b'{"records":[' + b",".join([b'{"value":' + _empties(1570) + b"}"] * 10_000) + b"]}"
    body = records if "records" in path else _empties(15 * 1024 * 1024)
    status, answer = await cluster.call("POST", 0, path, data=io.BytesIO(body), headers=JSON)
    assert status == 413 and answer["error_code"] == "REQUEST_TOO_LARGE", answer
    status, answer = await cluster.call("GET", 0, "/v1/topics/empties/partitions/0/records?offset=0")
    assert status == 200 and answer["records"] == [], answer


async def test_offset_commits_may_exceed_the_small_json_bound(cluster: Cluster) -> None:
    # Goal: 10,000 commits with their metadata outgrow 1 MiB; that route keeps the bulk bounds.
    if "committed" not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic("committed", replication_factor=3)
    commits = [{"topic": "committed", "partition": 0, "offset": 0, "metadata": "m" * 4000}] * 300
    body = json.dumps({"offsets": commits}).encode()
    assert len(body) > JSON_BYTES_MAX
    status, answer = await cluster.call("POST", 0, "/v1/groups/big-commit/offsets", data=io.BytesIO(body),
                                        headers=JSON)
    assert status == 200, answer


async def test_a_large_json_body_is_parsed_off_the_event_loop(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a body above JSON_INLINE_BYTES_MAX is parsed (and its depth walked) in the JSON
    # worker pool, whatever the route: on the loop, an offset commit of 125,000 empty arrays
    # (within its bounds) held it 65-100 ms; a small body stays on the loop.
    threads: list[str] = []
    parse = params._loads

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return parse(*args)

    monkeypatch.setattr(params, "_loads", recorded)
    large = b'{"offsets":[' + b",".join([b"[]"] * 124_990) + b"]}"
    assert len(large) > params.JSON_INLINE_BYTES_MAX
    for body in (large, b'{"offsets":[[]]}'):
        status, answer = await cluster.call("POST", 0, "/v1/groups/g/offsets", data=io.BytesIO(body), headers=JSON)
        assert status == 400 and answer["error_code"] == "INVALID_REQUEST", answer
    assert threads[0].startswith("raftlog-json") and threads[1] == threading.current_thread().name, threads
