"""Goal: a consumer group's admin routes on the package's in-process 3-node cluster:
reset-offsets (to earliest, latest, an offset, a time, or shifted; dry run first; only
without members; every target clamped to the log) writes through the partitions'
groups so every node reads the new offsets; describe shows each partition's lag in
records and in seconds; /metrics shows the group's state, members, committed offsets
and lag, each series from one node only."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from tests.group_member import Member
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
PARTITIONS = 4
RECORDS = 10
STEP_MS = 1000


def _call(cluster: Cluster):  # type: ignore[no-untyped-def]
    return lambda node, method, path, **kwargs: cluster.call(method, node, path, **kwargs)


async def _produce(cluster: Cluster, topic: str, base_ms: int) -> None:
    """RECORDS per partition; record i stamped base_ms + i seconds."""
    for partition in range(PARTITIONS):
        records = [{"value": i, "timestamp": base_ms + i * STEP_MS} for i in range(RECORDS)]
        status, body = await cluster.call("POST", partition % 3, f"/v1/topics/{topic}/partitions/{partition}/records",
                                          json={"records": records})
        assert status == 200, body


async def _committed(cluster: Cluster, node: int, group: str, topic: str) -> dict[int, int]:
    status, body = await cluster.call("GET", node, f"/v1/groups/{group}/offsets", params={"topic": topic})
    assert status == 200, body
    return {o["partition"]: o["offset"] for o in body["offsets"]}


async def _reset(cluster: Cluster, node: int, group: str, **body: object) -> tuple[int, dict]:
    return await cluster.call("POST", node, f"/v1/groups/{group}/offsets/reset", json=body)


async def test_reset_offsets_plans_then_writes_and_only_without_members(cluster: Cluster) -> None:
    base_ms = int(time.time() * 1000) - 3_600_000
    await cluster.create_topic("cg-reset", partitions=PARTITIONS)
    await _produce(cluster, "cg-reset", base_ms)
    topics = [{"topic": "cg-reset"}]

    member = Member(_call(cluster), 3, "resets")
    await member.join(["cg-reset"])
    status, body = await _reset(cluster, 1, "resets", strategy="earliest", topics=topics, execute=True)
    assert (status, body["error_code"]) == (409, "NON_EMPTY_GROUP"), body
    await member.leave()

    status, plan = await _reset(cluster, 2, "resets", strategy="offset", value=5, topics=topics)
    assert status == 200, plan
    assert plan["executed"] is False
    assert [(r["partition"], r["committed_offset"], r["new_offset"]) for r in plan["offsets"]] == [
        (p, None, 5) for p in range(PARTITIONS)]
    assert await _committed(cluster, 0, "resets", "cg-reset") == {}  # a dry run writes nothing

    status, done = await _reset(cluster, 2, "resets", strategy="offset", value=5, topics=topics, execute=True)
    assert status == 200 and done["executed"] is True, done
    for node in range(3):  # replicated through each partition's group: every node reads it
        assert await _committed(cluster, node, "resets", "cg-reset") == dict.fromkeys(range(PARTITIONS), 5)

    cases = [  # (body, partitions named, expected new offset of each)
        ({"strategy": "shift", "value": -2}, None, 3),
        ({"strategy": "shift", "value": 100}, None, RECORDS),  # clamped to the high watermark
        ({"strategy": "earliest"}, [1, 3], 0),
        ({"strategy": "timestamp", "value": base_ms + 7 * STEP_MS}, [2], 7),
        ({"strategy": "timestamp", "value": base_ms + 7 * STEP_MS - 1}, [0], 7),
        ({"strategy": "timestamp", "value": base_ms + 3_600_000 * 2}, [3], RECORDS),  # all older: the end
        ({"strategy": "offset", "value": 10**12}, [0], RECORDS),
        ({"strategy": "latest"}, None, RECORDS),
    ]
    for body, partitions, expected in cases:
        chosen = [{"topic": "cg-reset", **({"partitions": partitions} if partitions else {})}]
        before = await _committed(cluster, 0, "resets", "cg-reset")
        status, done = await _reset(cluster, 1, "resets", topics=chosen, execute=True, **body)
        assert status == 200, (body, done)
        named = partitions or list(range(PARTITIONS))
        assert [r["partition"] for r in done["offsets"]] == named
        assert all(r["new_offset"] == expected for r in done["offsets"]), (body, done)
        after = await _committed(cluster, 0, "resets", "cg-reset")
        assert after == {**before, **dict.fromkeys(named, expected)}, body

    # A topic named twice is named once: its partitions together (all of them if either says so).
    for named, expected in (([[3, 1], [1, 0]], [0, 1, 3]), ([[2], None], list(range(PARTITIONS)))):
        chosen = [{"topic": "cg-reset", **({"partitions": p} if p else {})} for p in named]
        status, plan = await _reset(cluster, 1, "resets", strategy="earliest", topics=chosen)
        assert status == 200 and sorted(r["partition"] for r in plan["offsets"]) == expected, plan

    # Without members the group is described by its offsets in the topics named.
    status, body = await cluster.call("GET", 2, "/v1/groups/resets")
    assert (status, body["error_code"]) == (404, "UNKNOWN_GROUP"), body
    status, described = await cluster.call("GET", 2, "/v1/groups/resets", params={"topic": "cg-reset"})
    assert status == 200, described
    assert (described["state"], described["members"]) == ("empty", [])
    assert [(r["partition"], r["committed_offset"], r["lag"], r["lag_ms"]) for r in described["partitions"]] == [
        (p, RECORDS, 0, 0) for p in range(PARTITIONS)]
    for params, expected in (({"topic": "cg-lag-none"}, (404, "UNKNOWN_TOPIC")),
                             ({"topic": "a/b"}, (400, "INVALID_REQUEST"))):
        status, body = await cluster.call("GET", 0, "/v1/groups/resets", params=params)
        assert (status, body["error_code"]) == expected, body
    await cluster.create_topic("cg-reset-other", partitions=1)
    status, body = await cluster.call("GET", 0, "/v1/groups/resets", params={"topic": "cg-reset-other"})
    assert (status, body["error_code"]) == (404, "UNKNOWN_GROUP"), body

    refusals = [
        ({"strategy": "offset", "topics": topics}, 400, "INVALID_REQUEST"),  # no value
        ({"strategy": "earliest", "value": 3, "topics": topics}, 400, "INVALID_REQUEST"),
        ({"strategy": "sideways", "topics": topics}, 400, "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": []}, 400, "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": [{"topic": "cg-reset", "partitions": []}]}, 400, "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": [{"topic": "cg-reset", "partitions": [1, 1]}]}, 400,
         "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": topics, "execute": "yes"}, 400, "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": topics, "extra": 1}, 400, "INVALID_REQUEST"),
        ({"strategy": "earliest", "topics": [{"topic": "cg-nope"}]}, 404, "UNKNOWN_TOPIC"),
        ({"strategy": "earliest", "topics": [{"topic": "cg-reset", "partitions": [PARTITIONS]}]}, 404,
         "UNKNOWN_TOPIC"),
    ]
    for body, status_expected, code in refusals:
        status, answer = await cluster.call("POST", 0, "/v1/groups/resets/offsets/reset", json=body)
        assert (status, answer.get("error_code")) == (status_expected, code), (body, answer)


async def test_describe_and_metrics_show_lag_in_records_and_seconds(cluster: Cluster) -> None:
    base_ms = int(time.time() * 1000) - 600_000  # ten minutes old, so the lag in seconds is large
    await cluster.create_topic("cg-lag", partitions=PARTITIONS)
    await _produce(cluster, "cg-lag", base_ms)
    status, body = await _reset(cluster, 0, "lagging", strategy="offset", value=4,
                                topics=[{"topic": "cg-lag", "partitions": [0]}], execute=True)
    assert status == 200, body
    member = Member(_call(cluster), 3, "lagging")
    await member.join(["cg-lag"])
    status, described = await cluster.call("GET", 1, "/v1/groups/lagging")
    assert status == 200, described
    assert described["partitions_total"] == PARTITIONS and described["partitions_truncated"] is False
    rows = {r["partition"]: r for r in described["partitions"]}
    assert rows[0]["committed_offset"] == 4 and rows[0]["lag"] == RECORDS - 4
    assert rows[1]["committed_offset"] is None and rows[1]["lag"] == RECORDS
    # The oldest unconsumed record of partition 0 is record 4: base + 4 s, about 596 s ago.
    assert 590_000 <= rows[0]["lag_ms"] <= 700_000, rows[0]
    assert 595_000 <= rows[1]["lag_ms"] <= 700_000, rows[1]

    every = ""

    def series(name: str, **labels: str) -> list[float]:
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as the client writes them
        pattern = rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$" if labels else rf"^{name} (\S+)$"
        return [float(m) for m in re.findall(pattern, every, re.M)]

    # A partition's leader shows the group once its own copy of group 0 has the join
    # (it trails the coordinator by an apply): scrape until every partition is there.
    async with asyncio.timeout(10):
        while not all(len(series("raftlog_consumer_group_lag_records", group="lagging", topic="cg-lag",
                                 partition=str(p))) == 1 for p in range(PARTITIONS)):
            texts = []
            for node in range(3):
                status, text = await cluster.call("GET", node, "/metrics")
                assert status == 200
                texts.append(text.decode())
            every = "\n".join(texts)
            await asyncio.sleep(0.05)
    # Each series from one node only: the metadata leader (group) or the partition's leader.
    assert series("raftlog_consumer_group_members", group="lagging") == [1.0]
    assert series("raftlog_consumer_group_state", group="lagging", state="stable") in ([1.0], [0.0])
    assert series("raftlog_consumer_group_committed_offset", group="lagging", topic="cg-lag", partition="0") == [4.0]
    assert series("raftlog_consumer_group_committed_offset", group="lagging", topic="cg-lag", partition="1") == []
    assert series("raftlog_consumer_group_lag_records", group="lagging", topic="cg-lag", partition="0") == [6.0]
    assert series("raftlog_consumer_group_lag_records", group="lagging", topic="cg-lag", partition="1") == [10.0]
    (seconds,) = series("raftlog_consumer_group_lag_seconds", group="lagging", topic="cg-lag", partition="0")
    assert 590 <= seconds <= 700
    assert series("raftlog_consumer_group_series_truncated") == [0.0, 0.0, 0.0]
    await member.leave()
