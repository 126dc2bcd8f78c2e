"""Goal: records go in through any node and come out of any replica unchanged, in
every format (JSON and binary), keyed records land where Kafka would put them,
idempotent retries are deduplicated, long-polls wake on new data, and consumer
group offsets read the same from every node."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import time

import pytest

from multiraft.state.partitioner import partition_for_key
from raftlog.messages import Role
from storage.batch import Record, decode_batch, encode_batch
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
BATCH = "application/vnd.raftlog.batch"


async def test_json_formats_round_trip_through_every_node(cluster: Cluster) -> None:
    await cluster.create_topic("fmt", partitions=1)
    stamp = int(time.time() * 1000) - 5000
    records = [
        {"key": "k1", "value": {"a": [1, 2, None]}, "headers": [{"name": "h", "value": "v"}], "timestamp": stamp},
        {"value": "plain json string"},
        {"key": None, "value": None},
    ]
    status, body = await cluster.call("POST", 1, "/v1/topics/fmt/records", json={"records": records})
    assert status == 200, body
    assert body["offsets"] == [{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1},
                               {"partition": 0, "offset": 2}]
    status, body = await cluster.call("POST", 2, "/v1/topics/fmt/partitions/0/records",
                                      json={"format": "string", "records": [{"key": "s", "value": "héllo"}]})
    assert (status, body["base_offset"], body["count"], body["duplicate"]) == (200, 3, 1, False)
    raw = bytes(range(256))
    status, body = await cluster.call("POST", 0, "/v1/topics/fmt/records", json={"format": "binary", "records": [
        {"key": base64.b64encode(b"\x00k").decode(), "value": base64.b64encode(raw).decode()}]})
    assert status == 200 and body["offsets"] == [{"partition": 0, "offset": 4}]

    for i in range(3):  # followers serve reads too
        status, body = await cluster.call("GET", i, "/v1/topics/fmt/partitions/0/records",
                                          params={"offset": 0, "wait_ms": 2000})
        if len(body["records"]) < 5:  # a follower may apply a moment later: read on
            status, more = await cluster.call("GET", i, "/v1/topics/fmt/partitions/0/records",
                                              params={"offset": body["next_offset"], "wait_ms": 2000})
            body["records"] += more["records"]
            body["next_offset"] = more["next_offset"]
        assert status == 200
        got = body["records"]
        assert [r["offset"] for r in got] == [0, 1, 2, 3, 4]
        assert got[0]["key"] == "k1" and got[0]["value"] == {"a": [1, 2, None]}
        assert got[0]["headers"] == [{"name": "h", "value": "v"}] and got[0]["timestamp"] == stamp
        assert got[1]["value"] == "plain json string"
        assert got[2]["key"] is None and got[2]["value"] is None
        assert got[3]["value_b64"] == base64.b64encode("héllo".encode()).decode(), "string value is not JSON"
        assert body["next_offset"] == 5 and body["log_start_offset"] == 0
    status, body = await cluster.call("GET", 0, "/v1/topics/fmt/partitions/0/records",
                                      params={"offset": 3, "format": "string", "max_records": 1})
    assert [r["value"] for r in body["records"]] == ["héllo"] and body["next_offset"] == 4
    status, body = await cluster.call("GET", 0, "/v1/topics/fmt/partitions/0/records",
                                      params={"offset": 4, "format": "binary"})
    assert base64.b64decode(body["records"][0]["value"]) == raw
    assert base64.b64decode(body["records"][0]["key"]) == b"\x00k"


async def test_keyed_records_follow_murmur2_and_unkeyed_spread(cluster: Cluster) -> None:
    await cluster.create_topic("keyed", partitions=4)
    keys = [f"user-{i}" for i in range(20)]
    status, body = await cluster.call("POST", 0, "/v1/topics/keyed/records",
                                      json={"records": [{"key": k, "value": i} for i, k in enumerate(keys)]})
    assert status == 200
    assert [o["partition"] for o in body["offsets"]] == [partition_for_key(k.encode(), 4) for k in keys]
    status, body = await cluster.call("POST", 1, "/v1/topics/keyed/records",
                                      json={"records": [{"value": i} for i in range(8)]})
    assert sorted({o["partition"] for o in body["offsets"]}) == [0, 1, 2, 3], "round-robin over partitions"
    status, body = await cluster.call("POST", 1, "/v1/topics/keyed/records",
                                      json={"records": [{"value": 1, "partition": 3}]})
    assert body["offsets"][0]["partition"] == 3


async def test_a_request_mixing_keys_partitions_and_neither_places_each_record(cluster: Cluster) -> None:
    # Goal: the keys of one request are hashed at once (partitions_for_keys), and each keyed
    # record still lands where murmur2 puts it between explicit and unkeyed ones, a key past
    # the vector limit included.
    await cluster.create_topic("mixed", partitions=5)
    records: list[dict] = []
    for i in range(60):
        if i % 3 == 0:
            records.append({"key": f"user-{i}" * (1 if i % 9 else 20), "value": i})
        elif i % 3 == 1:
            records.append({"value": i, "partition": i % 5})
        else:
            records.append({"value": i})
    status, body = await cluster.call("POST", 2, "/v1/topics/mixed/records", json={"records": records})
    assert status == 200
    for record, offset in zip(records, body["offsets"], strict=True):
        if "key" in record:
            assert offset["partition"] == partition_for_key(record["key"].encode(), 5), record
        elif "partition" in record:
            assert offset["partition"] == record["partition"]
        else:
            assert 0 <= offset["partition"] < 5


async def test_long_keys_are_hashed_without_holding_the_loop(cluster: Cluster) -> None:
    # Goal (hostile input): keys of 1 MB each are hashed in a worker thread, not on the loop
    # (murmur2 is a Python loop over a key's words: 14 such keys held it most of a second),
    # and still land where murmur2 puts them.
    await cluster.create_topic("longkeys", partitions=5)
    keys = [chr(ord("a") + i) * 1_000_000 for i in range(14)]
    gaps: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:
        clock = asyncio.get_running_loop().time
        last = clock()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = clock()
            gaps.append(now - last)
            last = now

    watcher = asyncio.create_task(watch())
    try:
        document = json.dumps({"format": "string", "records": [{"key": k} for k in keys]}).encode()
        status, body = await cluster.call("POST", 0, "/v1/topics/longkeys/records", data=io.BytesIO(document),
                                          headers={"Content-Type": "application/json"})
    finally:
        stop.set()
        await watcher
    assert status == 200, body
    assert [o["partition"] for o in body["offsets"]] == [partition_for_key(k.encode(), 5) for k in keys]
    assert max(gaps) < 0.25, f"the loop was held {max(gaps) * 1000:.0f} ms"


async def test_binary_batch_in_and_out(cluster: Cluster) -> None:
    await cluster.create_topic("bin", partitions=1)
    batches = [encode_batch([Record(b"k%d" % i, b"v%d" % i) for i in range(j, j + 3)], first_timestamp_ms=7)
               for j in (0, 3)]
    for j, data in enumerate(batches):
        status, body = await cluster.call("POST", j + 1, "/v1/topics/bin/partitions/0/records", data=data,
                                          headers={"Content-Type": BATCH})
        assert (status, body["base_offset"], body["count"]) == (200, 3 * j, 3), body
    async with asyncio.timeout(20):
        async with cluster.session.get(cluster.url(0, "/v1/topics/bin/partitions/0/records"),
                                       params={"offset": 4, "wait_ms": 5000},  # node 0 may learn the
                                       headers={"Accept": BATCH}) as response:  # commit a little later
            assert response.status == 200 and response.content_type == BATCH
            payload = await response.read()
            assert response.headers["Raftlog-Next-Offset"] == "6"
            assert response.headers["Raftlog-High-Watermark"] == "6"
    frames, position = [], 0
    while position < len(payload):
        base, size = struct.unpack_from(">qI", payload, position)
        position += 12
        frames.append((base, payload[position : position + size]))
        position += size
    assert frames == [(3, batches[1])], "whole stored batches, byte for byte"
    assert [r.value for r in decode_batch(frames[0][1])[1]] == [b"v3", b"v4", b"v5"]


async def test_idempotent_json_produce_deduplicates(cluster: Cluster) -> None:
    await cluster.create_topic("idem", partitions=1)
    _, producer = await cluster.call("POST", 2, "/v1/producers")
    request = {"records": [{"value": "x"}, {"value": "y"}], "producer_id": producer["producer_id"],
               "producer_epoch": 0, "base_sequence": 0}
    status, first = await cluster.call("POST", 0, "/v1/topics/idem/partitions/0/records", json=request)
    assert status == 200 and not first["duplicate"]
    status, again = await cluster.call("POST", 1, "/v1/topics/idem/partitions/0/records", json=request)
    assert status == 200 and again["duplicate"] and again["base_offset"] == first["base_offset"]
    status, body = await cluster.call("POST", 0, "/v1/topics/idem/partitions/0/records",
                                      json={**request, "base_sequence": 9})
    assert (status, body["error_code"]) == (409, "OUT_OF_ORDER_SEQUENCE")
    status, body = await cluster.call("GET", 2, "/v1/topics/idem/partitions/0/records",
                                      params={"offset": 0, "wait_ms": 1000})
    assert [r["value"] for r in body["records"]] in (["x", "y"], [])


async def test_a_producer_id_never_allocated_is_refused_and_leaves_no_state(cluster: Cluster) -> None:
    # Goal: a produce naming a producer id above every id the cluster allocated, JSON or
    # binary, sent to the leader or forwarded by a follower, is 400 UNKNOWN_PRODUCER_ID: no
    # replica keeps producer state for it and nothing more is written. An id allocated
    # through one node is accepted at once through the others (a leader whose catalog has
    # not applied the allocation yet catches up before it decides).
    await cluster.create_topic("invented", partitions=1)
    path = "/v1/topics/invented/partitions/0/records"
    status, producer = await cluster.call("POST", 1, "/v1/producers")
    assert status == 200, producer
    for node_index in (2, 0):
        request = {"records": [{"value": "ok"}], "producer_id": producer["producer_id"], "producer_epoch": 0,
                   "base_sequence": 0}
        status, body = await cluster.call("POST", node_index, path, json=request)
        assert status == 200 and body["base_offset"] == 0, body  # the second is the first's duplicate
    invented = 2**62
    refused = encode_batch([Record(None, b"x")], first_timestamp_ms=1, producer_id=invented, producer_epoch=0,
                           base_sequence=0)
    for node_index in range(3):
        for kwargs in ({"json": {"records": [{"value": "x"}], "producer_id": invented, "producer_epoch": 0,
                                 "base_sequence": 0}},
                       {"data": refused, "headers": {"Content-Type": BATCH}}):
            status, body = await cluster.call("POST", node_index, path, **kwargs)
            assert (status, body["error_code"]) == (400, "UNKNOWN_PRODUCER_ID"), body
    group_id = cluster.nodes[0].catalog.topic("invented").partitions[0].group_id
    leader = next(n for n in cluster.nodes if n.groups[group_id].core.role is Role.LEADER)
    last = leader.groups[group_id].core.log.last_index()
    await until(lambda: all(n.groups[group_id].core.applied_index >= last for n in cluster.nodes), "replicas apply")
    for node in cluster.nodes:
        state = node.partitions[group_id].state
        assert [pid for pid, _ in state.producers.items()] == [producer["producer_id"]], "no state for the invented id"
        assert state.high_watermark == 1, "only the allocated producer's record"


async def test_long_poll_wakes_on_new_data(cluster: Cluster) -> None:
    await cluster.create_topic("poll", partitions=1)
    started = time.monotonic()
    poll = asyncio.create_task(cluster.call("GET", 1, "/v1/topics/poll/partitions/0/records",
                                            params={"offset": 0, "wait_ms": 10000}))
    await asyncio.sleep(0.3)  # let the poll start waiting (not a condition wait: timing of the test itself)
    assert not poll.done()
    status, _ = await cluster.call("POST", 2, "/v1/topics/poll/records", json={"records": [{"value": "wake"}]})
    assert status == 200
    status, body = await poll
    assert status == 200 and [r["value"] for r in body["records"]] == ["wake"]
    assert time.monotonic() - started < 8, "woken by the record, not by the timeout"
    started = time.monotonic()
    status, body = await cluster.call("GET", 0, "/v1/topics/poll/partitions/0/records",
                                      params={"offset": 1, "wait_ms": 300})
    assert status == 200 and body["records"] == [] and body["next_offset"] == 1
    assert 0.25 < time.monotonic() - started < 5, "an empty long-poll ends at wait_ms"


async def test_group_offsets_commit_anywhere_read_everywhere(cluster: Cluster) -> None:
    await cluster.create_topic("grp", partitions=2)
    await cluster.call("POST", 0, "/v1/topics/grp/records",
                       json={"records": [{"value": i, "partition": i % 2} for i in range(6)]})
    status, body = await cluster.call("POST", 1, "/v1/groups/readers/offsets", json={"offsets": [
        {"topic": "grp", "partition": 0, "offset": 2}, {"topic": "grp", "partition": 1, "offset": 3,
                                                         "metadata": "m"}]})
    assert status == 200, body
    for i in range(3):
        status, body = await cluster.call("GET", i, "/v1/groups/readers/offsets", params={"topic": "grp"})
        assert status == 200
        assert [(o["partition"], o["offset"]) for o in body["offsets"]] == [(0, 2), (1, 3)]
    status, body = await cluster.call("POST", 2, "/v1/groups/readers/offsets",
                                      json={"offsets": [{"topic": "grp", "partition": 0, "offset": 99}]})
    assert (status, body["error_code"]) == (416, "OFFSET_OUT_OF_RANGE")
    status, body = await cluster.call("GET", 0, "/v1/groups/nobody/offsets", params={"topic": "grp"})
    assert status == 200 and body["offsets"] == []


async def test_a_commit_that_fails_after_writing_some_offsets_says_its_outcome_is_unknown(cluster: Cluster) -> None:
    # Goal: offsets are written one partition after another; when a later one fails, the
    # answer must not be that partition's own refusal (which says nothing happened) but
    # OUTCOME_UNKNOWN, since the earlier ones are committed (the chaos group workload read
    # back an offset whose commit had been answered NOT_LEADER).
    await cluster.create_topic("partial", partitions=2)
    await cluster.call("POST", 0, "/v1/topics/partial/records",
                       json={"records": [{"value": i, "partition": i % 2} for i in range(4)]})
    status, body = await cluster.call("POST", 1, "/v1/groups/partial-readers/offsets", json={"offsets": [
        {"topic": "partial", "partition": 0, "offset": 1}, {"topic": "partial", "partition": 1, "offset": 99}]})
    assert (status, body["error_code"]) == (504, "OUTCOME_UNKNOWN"), body
    assert "1 of 2 offsets were committed" in body["message"]
    status, body = await cluster.call("GET", 2, "/v1/groups/partial-readers/offsets", params={"topic": "partial"})
    assert status == 200 and [(o["partition"], o["offset"]) for o in body["offsets"]] == [(0, 1)]
    status, body = await cluster.call("POST", 1, "/v1/groups/partial-readers/offsets", json={"offsets": [
        {"topic": "partial", "partition": 1, "offset": 99}, {"topic": "partial", "partition": 0, "offset": 2}]})
    assert (status, body["error_code"]) == (416, "OFFSET_OUT_OF_RANGE"), "the first failing: nothing was written"


async def test_forward_false_on_a_follower_names_the_leader(cluster: Cluster) -> None:
    created = await cluster.create_topic("fwd", partitions=1)
    _, body = await cluster.call("GET", 0, "/v1/topics/fwd")
    leader = body["partitions"][0]["leader"]
    follower = next(i for i in range(3) if i + 1 != leader)
    async with asyncio.timeout(20):
        async with cluster.session.post(cluster.url(follower, "/v1/topics/fwd/partitions/0/records"),
                                        params={"forward": "false"}, json={"records": [{"value": 1}]}) as response:
            body = await response.json()
            assert (response.status, body["error_code"]) == (421, "NOT_LEADER")
            assert response.headers["Raftlog-Leader-Id"] == str(leader)
            assert response.headers["Raftlog-Leader"] == str(cluster.nodes[leader - 1].config.http_addr)
    assert created["name"] == "fwd"


async def test_forward_false_on_the_topic_route_refuses_each_partition_not_led_here(cluster: Cluster) -> None:
    # Goal: the topic route honours forward=false per partition. A node stores the records
    # of the partitions it leads and answers NOT_LEADER with the leader for the others
    # (nothing of theirs is stored); when it leads none, the whole answer is a 421.
    await cluster.create_topic("fwd-topic", partitions=3)
    _, body = await cluster.call("GET", 0, "/v1/topics/fwd-topic")
    leaders = {p["partition"]: p["leader"] for p in body["partitions"]}
    records = {"records": [{"value": p, "partition": p} for p in range(3)]}
    for node in range(3):
        led = {p for p, leader in leaders.items() if leader == node + 1}
        status, body = await cluster.call("POST", node, "/v1/topics/fwd-topic/records",
                                          params={"forward": "false"}, json=records)
        if not led:
            assert (status, body["error_code"], body["leader_hint"]) == (421, "NOT_LEADER", leaders[0]), body
            continue
        assert status == 200, body
        for entry in body["offsets"]:
            p = entry["partition"]
            if p in led:
                assert entry["offset"] >= 0 and "error_code" not in entry, entry
            else:
                assert (entry["offset"], entry["error_code"], entry["leader_hint"]) == (None, "NOT_LEADER",
                                                                                        leaders[p]), entry
    for p, leader in leaders.items():  # each partition got its record once: from its leader's request
        status, body = await cluster.call("GET", leader - 1, f"/v1/topics/fwd-topic/partitions/{p}/records",
                                          params={"offset": 0})
        assert status == 200 and [r["value"] for r in body["records"]] == [p], body
