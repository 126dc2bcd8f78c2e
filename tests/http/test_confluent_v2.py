"""Goal: the Confluent REST v2 dialect on the package's in-process 3-node cluster answers
at Confluent's paths, in its media types and shapes, with its integer error codes; keyed
produce lands where the native produce puts the same key bytes; a consumer instance made
through one node is served by every node (subscribe, records, commit, offsets, seek,
manual assignment, delete), hopping node on every call."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
V2 = "application/vnd.kafka.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


async def call(cluster: Cluster, method: str, node: int, path: str, body: Any = None,
               content_type: str = V2, accept: str | None = None) -> tuple[int, Any, str]:
    """One request; status, decoded JSON (None for no body) and the answer's content type."""
    headers = {"Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    data = None if body is None else json.dumps(body).encode()
    async with asyncio.timeout(30):
        async with cluster.session.request(method, cluster.url(node, path), data=data, headers=headers) as answer:
            raw = await answer.read()
            return answer.status, json.loads(raw) if raw else None, answer.content_type


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_produce_and_metadata_shapes(cluster: Cluster) -> None:
    await cluster.create_topic("cv2-meta", partitions=3)
    status, body, kind = await call(cluster, "POST", 0, "/topics/cv2-meta", {"records": [
        {"key": b64("k1"), "value": b64("v1")}, {"value": b64("v2"), "partition": 2}]}, BINARY_V2)
    assert status == 200 and kind == V2, body
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    assert body["offsets"][1]["partition"] == 2 and body["offsets"][1]["error_code"] is None, body
    assert body["offsets"][0]["partition"] == 2  # murmur2("k1") % 3: both records in one batch
    assert [o["offset"] for o in body["offsets"]] == [0, 1]
    # The same key bytes through the native produce land on the same partition.
    status, native = await cluster.call("POST", 1, "/v1/topics/cv2-meta/records",
                                        json={"format": "binary", "records": [{"key": b64("k1"), "value": b64("x")}]})
    assert native["offsets"][0]["partition"] == body["offsets"][0]["partition"]
    status, body, _ = await call(cluster, "POST", 1, "/topics/cv2-meta/partitions/1",
                                 {"records": [{"value": {"a": [1, 2]}}, {"key": "k", "value": "s"}]}, JSON_V2)
    assert status == 200 and [o["partition"] for o in body["offsets"]] == [1, 1], body
    status, names, _ = await call(cluster, "GET", 2, "/topics")
    assert status == 200 and "cv2-meta" in names
    status, topic, _ = await call(cluster, "GET", 0, "/topics/cv2-meta")
    assert topic["name"] == "cv2-meta" and len(topic["partitions"]) == 3
    assert {r["broker"] for r in topic["partitions"][0]["replicas"]} == {1, 2, 3}
    status, partitions, _ = await call(cluster, "GET", 1, "/topics/cv2-meta/partitions")
    assert [p["partition"] for p in partitions] == [0, 1, 2]
    async with asyncio.timeout(15):  # a follower's high watermark trails the leader's a moment
        while True:
            _, offsets, _ = await call(cluster, "GET", 2, "/topics/cv2-meta/partitions/1/offsets")
            if offsets["end_offset"] == 2:
                break
            await asyncio.sleep(0.02)
    assert offsets == {"beginning_offset": 0, "end_offset": 2}
    status, brokers, _ = await call(cluster, "GET", 0, "/brokers")
    assert brokers == {"brokers": [1, 2, 3]}


@pytest.mark.parametrize(("method", "path", "body", "content_type", "accept", "status", "code"), [
    ("GET", "/topics/cv2-none", None, V2, None, 404, 40401),
    ("GET", "/topics/cv2-errors/partitions/7/offsets", None, V2, None, 404, 40402),
    ("POST", "/topics/cv2-errors/partitions/9", {"records": [{"value": "x"}]}, JSON_V2, None, 404, 40402),
    ("POST", "/topics/cv2-errors", {"records": [{"value": "x"}]}, "text/plain", None, 415, 415),
    ("POST", "/topics/cv2-errors", {"records": [{"value": "x"}]}, "application/json", None, 415, 415),
    ("POST", "/topics/cv2-errors", {"records": [{"value": "!"}]}, BINARY_V2, None, 422, 422),
    ("POST", "/topics/cv2-errors", {"recs": []}, JSON_V2, None, 422, 422),
    ("GET", "/topics", None, V2, "text/html", 406, 406),
    ("GET", "/consumers/g/instances/nobody/subscription", None, V2, None, 404, 40403),
    ("POST", "/consumers/cv2-g", {"format": "avro"}, V2, None, 422, 42204),
    ("POST", "/consumers/cv2-g", {"auto.offset.reset": "none"}, V2, None, 422, 42204),
    ("POST", "/consumers/cv2-g", {"nonsense": 1}, V2, None, 422, 42204),
    ("GET", "/topics/cv2-errors/nope", None, V2, None, 404, 404),
    # A record's own partition is checked even where the path's wins.
    ("POST", "/topics/cv2-errors/partitions/1", {"records": [{"value": "x", "partition": -1}]}, JSON_V2, None,
     422, 422),
])
async def test_errors_carry_confluents_codes(cluster: Cluster, method: str, path: str, body: Any,
                                             content_type: str, accept: str | None, status: int, code: int) -> None:
    if "cv2-errors" not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic("cv2-errors", partitions=2)
    got, answer, kind = await call(cluster, method, 1, path, body, content_type, accept)
    assert (got, answer["error_code"]) == (status, code), answer
    assert kind == V2 and isinstance(answer["message"], str)


async def test_an_instance_is_served_by_every_node(cluster: Cluster) -> None:
    await cluster.create_topic("cv2-inst", partitions=3)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-hop", {
        "name": "hopper", "format": "json", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
    assert status == 200 and made["instance_id"] == "hopper", made
    assert made["base_uri"] == cluster.url(0, "/consumers/cv2-hop/instances/hopper")
    status, again, _ = await call(cluster, "POST", 1, "/consumers/cv2-hop", {"name": "hopper"})
    assert (status, again["error_code"]) == (409, 40902)
    base = "/consumers/cv2-hop/instances/hopper"
    status, _, _ = await call(cluster, "POST", 1, f"{base}/subscription", {"topics": ["cv2-inst"]})
    assert status == 204
    status, sub, _ = await call(cluster, "GET", 2, f"{base}/subscription")
    assert sub == {"topics": ["cv2-inst"]}
    status, _, _ = await call(cluster, "POST", 0, f"{base}/assignments", {"partitions": [
        {"topic": "cv2-inst", "partition": 0}]})
    assert status == 409  # subscribed: manual assignment is refused (40903)
    for partition in range(3):
        await call(cluster, "POST", partition, "/topics/cv2-inst",
                   {"records": [{"value": {"n": partition * 10 + i}, "partition": partition} for i in range(4)]},
                   JSON_V2)
    seen: list[tuple[int, int]] = []
    for attempt in range(20):
        status, records, kind = await call(cluster, "GET", attempt % 3, f"{base}/records?timeout=200",
                                           accept=JSON_V2)
        assert status == 200 and kind == JSON_V2, records
        seen += [(r["partition"], r["offset"]) for r in records]
        if len(seen) >= 12:
            break
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(4)]  # each once, none skipped
    status, wrong, _ = await call(cluster, "GET", 1, f"{base}/records", accept=BINARY_V2)
    assert (status, wrong["error_code"]) == (406, 40601)
    status, _, _ = await call(cluster, "POST", 2, f"{base}/offsets",
                              {"offsets": [{"topic": "cv2-inst", "partition": 0, "offset": 1}]})
    assert status == 204
    status, _, _ = await call(cluster, "POST", 0, f"{base}/offsets")  # every position
    assert status == 204
    status, committed, _ = await call(cluster, "GET", 1, f"{base}/offsets", {"partitions": [
        {"topic": "cv2-inst", "partition": p} for p in range(3)]})
    assert [o["offset"] for o in committed["offsets"]] == [4, 4, 4], committed
    status, _, _ = await call(cluster, "POST", 2, f"{base}/positions",
                              {"offsets": [{"topic": "cv2-inst", "partition": 1, "offset": 2}]})
    assert status == 204
    status, records, _ = await call(cluster, "GET", 0, f"{base}/records?timeout=500", accept=JSON_V2)
    assert [(r["partition"], r["offset"], r["value"]) for r in records] == [(1, 2, {"n": 12}), (1, 3, {"n": 13})]
    status, _, _ = await call(cluster, "POST", 1, f"{base}/positions/beginning",
                              {"partitions": [{"topic": "cv2-inst", "partition": 2}]})
    assert status == 204
    status, records, _ = await call(cluster, "GET", 2, f"{base}/records?timeout=500", accept=JSON_V2)
    assert [r["offset"] for r in records if r["partition"] == 2] == [0, 1, 2, 3]
    status, _, _ = await call(cluster, "DELETE", 0, f"{base}/subscription")
    assert status == 204
    status, _, _ = await call(cluster, "POST", 1, f"{base}/assignments", {"partitions": [
        {"topic": "cv2-inst", "partition": 0}]})
    assert status == 204
    status, assigned, _ = await call(cluster, "GET", 2, f"{base}/assignments")
    assert assigned == {"partitions": [{"topic": "cv2-inst", "partition": 0}]}
    await call(cluster, "POST", 2, "/topics/cv2-inst/partitions/0", {"records": [{"value": 4}]}, JSON_V2)
    status, records, _ = await call(cluster, "GET", 0, f"{base}/records?timeout=2000", accept=JSON_V2)
    assert [(r["partition"], r["offset"]) for r in records] == [(0, 4)]  # from the committed 4 on
    status, _, _ = await call(cluster, "DELETE", 1, base)
    assert status == 204
    status, gone, _ = await call(cluster, "GET", 2, f"{base}/assignments")
    assert (status, gone["error_code"]) == (404, 40403)


async def test_binary_instances_and_latest_reset_skip_nothing_produced_after_the_first_get(cluster: Cluster) -> None:
    await cluster.create_topic("cv2-bin", partitions=1)
    await call(cluster, "POST", 0, "/topics/cv2-bin", {"records": [{"value": b64("old")}]}, BINARY_V2)
    status, made, _ = await call(cluster, "POST", 1, "/consumers/cv2-bin-g", {"format": "binary"})
    base = made["base_uri"].split(cluster.url(1, ""), 1)[1]
    await call(cluster, "POST", 2, f"{base}/subscription", {"topic_pattern": "cv2-bi?"})
    status, records, kind = await call(cluster, "GET", 0, f"{base}/records?timeout=300", accept=BINARY_V2)
    assert status == 200 and records == [] and kind == BINARY_V2  # latest: nothing old
    await call(cluster, "POST", 1, "/topics/cv2-bin", {"records": [{"key": b64("k"), "value": b64("new")}]},
               BINARY_V2)
    status, records, _ = await call(cluster, "GET", 2, f"{base}/records?timeout=2000")
    assert [(r["key"], r["value"], r["offset"]) for r in records] == [(b64("k"), b64("new"), 1)]
    status, sub, _ = await call(cluster, "GET", 0, f"{base}/subscription")
    assert sub == {"topics": ["cv2-bin"]}


async def test_an_idle_instance_expires_after_its_own_timeout(cluster: Cluster) -> None:
    status, made, _ = await call(cluster, "POST", 2, "/consumers/cv2-idle", {"consumer.instance.timeout.ms": 500})
    assert status == 200, made
    base = f"/consumers/cv2-idle/instances/{made['instance_id']}"
    status, _, _ = await call(cluster, "GET", 0, f"{base}/subscription")
    assert status == 200
    async with asyncio.timeout(15):
        while True:
            await asyncio.sleep(0.2)  # idle: nobody calls it
            status, gone, _ = await call(cluster, "GET", 1, f"{base}/assignments")
            if status == 404:
                break
            await asyncio.sleep(1)  # an answered call kept it alive: idle longer
    assert gone["error_code"] == 40403


async def test_an_instance_gives_back_at_its_next_get_what_a_native_member_joining_takes(cluster: Cluster) -> None:
    # An instance and a native member share a group: the member's join revokes half of the
    # instance's partitions; the instance's next records GETs commit what it read of them
    # (auto-commit) and give them back; the member then reads them from those commits on.
    await cluster.create_topic("cv2-mixed", partitions=2)
    for partition in range(2):
        await call(cluster, "POST", partition, f"/topics/cv2-mixed/partitions/{partition}",
                   {"records": [{"value": i} for i in range(3)]}, JSON_V2)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-mixed-g",
                                 {"name": "inst", "format": "json", "auto.offset.reset": "earliest"})
    assert status == 200, made
    base = "/consumers/cv2-mixed-g/instances/inst"
    await call(cluster, "POST", 1, f"{base}/subscription", {"topics": ["cv2-mixed"]})
    read: list[tuple[int, int]] = []
    async with asyncio.timeout(20):
        while len(read) < 6:
            status, records, _ = await call(cluster, "GET", 2, f"{base}/records?timeout=200", accept=JSON_V2)
            read += [(r["partition"], r["offset"]) for r in records]
    status, member = await cluster.call("POST", 1, "/v1/groups/cv2-mixed-g/members", json={"topics": ["cv2-mixed"]})
    assert status == 200, member
    owned: list = []
    async with asyncio.timeout(20):
        while not owned:
            for node in range(3):  # the instance's GETs: told of the revocation, then gives back
                status, records, _ = await call(cluster, "GET", node, f"{base}/records?timeout=1", accept=JSON_V2)
                assert status == 200 and records == [], records
            status, member = await cluster.call(
                "POST", 0, f"/v1/groups/cv2-mixed-g/members/{member['member_id']}/heartbeat",
                json={"member_epoch": member["member_epoch"], "owned": member["assignment"]})
            assert status == 200, member
            owned = member["assignment"]
    status, assigned, _ = await call(cluster, "GET", 1, f"{base}/assignments")
    assert len(assigned["partitions"]) == 1 and len(owned[0]["partitions"]) == 1
    taken = owned[0]["partitions"][0]
    status, committed = await cluster.call("GET", 2, "/v1/groups/cv2-mixed-g/offsets?topic=cv2-mixed")
    assert {o["partition"]: o["offset"] for o in committed["offsets"]}[taken] == 3, committed  # auto-committed
    await call(cluster, "DELETE", 2, base)


async def test_latest_over_two_partitions_skips_nothing_when_one_answers_first(cluster: Cluster) -> None:
    # The reviewer's probe: with `auto.offset.reset=latest` a GET answers as soon as one
    # partition has records, cancelling the others' reads; their starts (taken from
    # `latest`) must be pinned all the same, else the next GET takes `latest` again, past
    # what was produced in between, and (p1, 0) is never delivered.
    await cluster.create_topic("cv2-latest2", partitions=2)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-latest2-g", {"name": "l2", "format": "json"})
    assert status == 200, made
    base = "/consumers/cv2-latest2-g/instances/l2"
    one = {"partitions": [{"topic": "cv2-latest2", "partition": 0}]}
    assert (await call(cluster, "POST", 1, f"{base}/assignments", one))[0] == 204
    status, records, _ = await call(cluster, "GET", 2, f"{base}/records?timeout=100", accept=JSON_V2)
    assert status == 200 and records == [], records
    await call(cluster, "POST", 0, "/topics/cv2-latest2/partitions/0", {"records": [{"value": i} for i in range(3)]},
               JSON_V2)
    both = {"partitions": [{"topic": "cv2-latest2", "partition": p} for p in range(2)]}
    assert (await call(cluster, "POST", 1, f"{base}/assignments", both))[0] == 204
    status, records, _ = await call(cluster, "GET", 2, f"{base}/records?timeout=3000", accept=JSON_V2)
    assert [(r["partition"], r["offset"]) for r in records] == [(0, 0), (0, 1), (0, 2)], records
    await call(cluster, "POST", 0, "/topics/cv2-latest2/partitions/1", {"records": [{"value": "p1"}]}, JSON_V2)
    seen: list[tuple[int, int]] = []
    for attempt in range(4):
        status, records, _ = await call(cluster, "GET", attempt % 3, f"{base}/records?timeout=500", accept=JSON_V2)
        assert status == 200, records
        seen += [(r["partition"], r["offset"]) for r in records]
        if seen:
            break
    assert seen == [(1, 0)]
    await call(cluster, "DELETE", 0, base)


async def test_an_answer_the_client_never_got_is_read_again(cluster: Cluster) -> None:
    # A records GET whose client went away (here: its own timeout, mid long-poll) must not
    # save its positions: the answer was lost, so the next GET reads the same records
    # (saved, they were skipped, and with auto-commit skipped for the whole group).
    await cluster.create_topic("cv2-lost", partitions=1)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-lost-g",
                                 {"name": "lost", "format": "json", "auto.offset.reset": "earliest"})
    assert status == 200, made
    base = "/consumers/cv2-lost-g/instances/lost"
    await call(cluster, "POST", 1, f"{base}/subscription", {"topics": ["cv2-lost"]})
    status, records, _ = await call(cluster, "GET", 1, f"{base}/records?timeout=100", accept=JSON_V2)
    assert status == 200 and records == [], records
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):  # gives up while the node still long-polls
            await call(cluster, "GET", 1, f"{base}/records?timeout=10000", accept=JSON_V2)
    await call(cluster, "POST", 2, "/topics/cv2-lost", {"records": [{"value": "once"}]}, JSON_V2)
    # The abandoned handler wakes on that record and answers into a closed connection. Give
    # it a moment to finish first: were the next GET quicker, it would read the record
    # whatever the abandoned one saved (this wait can only hide the bug, never fake it).
    await asyncio.sleep(1.0)
    status, records, _ = await call(cluster, "GET", 0, f"{base}/records?timeout=3000", accept=JSON_V2)
    assert [(r["offset"], r["value"]) for r in records] == [(0, "once")], records
    await call(cluster, "DELETE", 0, base)


async def test_kafka_rest_defaults_and_spellings_are_understood(cluster: Cluster) -> None:
    # kafka-rest's clients send `timeout=-1` and `max_bytes=-1` (its defaults), huge values
    # (clamped, not refused), the bare v2 type as Accept (its binary reader; here the
    # instance's format), `id` for the name, the format in any case; a name of 0 or "" is
    # refused (42204), not replaced by a drawn one.
    await cluster.create_topic("cv2-kr", partitions=1)
    await call(cluster, "POST", 0, "/topics/cv2-kr", {"records": [{"value": "a"}, {"value": "b"}]}, JSON_V2)
    status, made, _ = await call(cluster, "POST", 1, "/consumers/cv2-kr-g",
                                 {"id": "kr", "format": "JSON", "auto.offset.reset": "earliest"})
    assert status == 200 and made["instance_id"] == "kr", made
    base = "/consumers/cv2-kr-g/instances/kr"
    await call(cluster, "POST", 2, f"{base}/subscription", {"topics": ["cv2-kr"]})
    status, records, kind = await call(cluster, "GET", 0, f"{base}/records?timeout=-1&max_bytes=-1", accept=V2)
    assert status == 200 and kind == JSON_V2 and [r["value"] for r in records] == ["a", "b"], records
    await call(cluster, "POST", 0, "/topics/cv2-kr", {"records": [{"value": "c"}]}, JSON_V2)
    status, records, _ = await call(cluster, "GET", 1, f"{base}/records?timeout=99999999&max_bytes=99999999999",
                                    accept=JSON_V2)
    assert status == 200 and [r["value"] for r in records] == ["c"], records
    status, wrong, _ = await call(cluster, "GET", 1, f"{base}/records?timeout=soon", accept=JSON_V2)
    assert (status, wrong["error_code"]) == (422, 422)
    for name in (0, "", False):
        status, refused, _ = await call(cluster, "POST", 2, "/consumers/cv2-kr-g", {"name": name})
        assert (status, refused["error_code"]) == (422, 42204), (name, refused)
    await call(cluster, "DELETE", 0, base)


async def test_unsubscribe_ends_a_manual_assignment(cluster: Cluster) -> None:
    # Kafka's unsubscribe() clears assign() too: DELETE .../subscription on an instance
    # assigned by hand answers 204 and it then holds nothing.
    await cluster.create_topic("cv2-unassign", partitions=1)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-unassign-g", {"name": "u"})
    assert status == 200, made
    base = "/consumers/cv2-unassign-g/instances/u"
    await call(cluster, "POST", 1, f"{base}/assignments", {"partitions": [{"topic": "cv2-unassign", "partition": 0}]})
    status, body, _ = await call(cluster, "DELETE", 2, f"{base}/subscription")
    assert status == 204, body
    status, assigned, _ = await call(cluster, "GET", 0, f"{base}/assignments")
    assert assigned == {"partitions": []}
    await call(cluster, "DELETE", 0, base)


async def test_commit_metadata_is_kept_and_read_back(cluster: Cluster) -> None:
    # A commit's `metadata` is stored beside the offset, as a native commit's is (it was
    # accepted and dropped), and GET .../offsets answers it; a non-string is 422.
    await cluster.create_topic("cv2-meta-commit", partitions=1)
    await call(cluster, "POST", 0, "/topics/cv2-meta-commit", {"records": [{"value": 1}]}, JSON_V2)
    status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-meta-commit-g", {"name": "mc"})
    assert status == 200, made
    base = "/consumers/cv2-meta-commit-g/instances/mc"
    await call(cluster, "POST", 1, f"{base}/assignments", {"partitions": [{"topic": "cv2-meta-commit", "partition": 0}]})
    offsets = [{"topic": "cv2-meta-commit", "partition": 0, "offset": 0, "metadata": "batch 7"}]
    status, body, _ = await call(cluster, "POST", 2, f"{base}/offsets", {"offsets": offsets})
    assert status == 204, body
    status, committed, _ = await call(cluster, "GET", 0, f"{base}/offsets",
                                      {"partitions": [{"topic": "cv2-meta-commit", "partition": 0}]})
    assert committed == {"offsets": [{"topic": "cv2-meta-commit", "partition": 0, "offset": 1,
                                      "metadata": "batch 7"}]}, committed
    status, refused, _ = await call(cluster, "POST", 1, f"{base}/offsets", {"offsets": [{**offsets[0], "metadata": 7}]})
    assert (status, refused["error_code"]) == (422, 422), refused
    await call(cluster, "DELETE", 0, base)


async def test_a_pattern_subscription_lists_every_topic_it_matches(cluster: Cluster) -> None:
    # GET .../subscription for a pattern answers what the pattern matches (Kafka's
    # subscription()), not only the topics this instance holds or waits for: here two
    # instances share two one-partition topics, so the second targets one of them.
    for topic in ("cv2-pat-a", "cv2-pat-b"):
        await cluster.create_topic(topic, partitions=1)
    for name in ("pa", "pb"):
        status, made, _ = await call(cluster, "POST", 0, "/consumers/cv2-pat-g", {"name": name})
        assert status == 200, made
        status, body, _ = await call(cluster, "POST", 1, f"/consumers/cv2-pat-g/instances/{name}/subscription",
                                     {"topic_pattern": "cv2-pat-?"})
        assert status == 204, body
    status, held, _ = await call(cluster, "GET", 2, "/consumers/cv2-pat-g/instances/pb/assignments")
    assert len(held["partitions"]) <= 1, held
    status, sub, _ = await call(cluster, "GET", 2, "/consumers/cv2-pat-g/instances/pb/subscription")
    assert sub == {"topics": ["cv2-pat-a", "cv2-pat-b"]}, sub
    for name in ("pa", "pb"):
        await call(cluster, "DELETE", 0, f"/consumers/cv2-pat-g/instances/{name}")


async def test_a_405_names_the_allowed_methods(cluster: Cluster) -> None:
    # Goal: the dialect's 405 carries Allow (RFC 9110), as the native routes' does.
    async with cluster.session.request("DELETE", cluster.url(0, "/brokers")) as answer:
        assert answer.status == 405 and answer.headers.get("Allow") == "GET", answer.headers
        assert answer.content_type == V2 and (await answer.json(content_type=None))["error_code"] == 405
