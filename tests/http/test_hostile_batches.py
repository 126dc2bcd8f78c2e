"""Goal (issue 21, family 2): a binary batch cannot declare work beyond its size, a
record cannot dodge the record limit inside one, a read decodes only what it returns,
and a follower stores only batches it checked itself."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from raftlog.messages import Entry, EntryKind, Message, MessageType, Role
from raftlog.types import Index
from storage.batch import RECORD_BYTES_MAX, Compression, Record, encode_batch
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until
from tests.storage.helpers import max_compressed

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
BATCH = {"Content-Type": "application/vnd.raftlog.batch"}




class LoopLag:
    """The longest the test's event loop (which runs the nodes) went without a turn."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.worst_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.worst_s = max(self.worst_s, time.perf_counter() - before - self.period_s)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _topic(cluster: Cluster, name: str) -> None:
    if name not in cluster.nodes[0].catalog.topics:
        await cluster.create_topic(name, replication_factor=3)


async def test_an_inflating_batch_is_refused_without_stalling_the_node(cluster: Cluster) -> None:
    await _topic(cluster, "inflate")
    bomb = max_compressed([Record(None, None)] * 980_000)
    assert len(bomb) < 20_000
    path = "/v1/topics/inflate/partitions/0/records"
    async with LoopLag() as lag:
        status, body = await cluster.call("POST", 0, path, data=bomb, headers=BATCH)
    assert status == 400 and body["error_code"] == "INVALID_BATCH", body
    assert lag.worst_s < 0.1, f"the loop stalled {lag.worst_s * 1000:.0f} ms"
    status, body = await cluster.call("GET", 0, "/v1/topics/inflate/partitions/0/records?offset=0")
    assert status == 200 and body["records"] == [] and body["high_watermark"] == 0, body


async def test_a_record_over_the_limit_is_refused_inside_a_binary_batch(cluster: Cluster) -> None:
    await _topic(cluster, "big-record")
    batch = encode_batch([Record(b"k", b"v" * (2 * RECORD_BYTES_MAX))], first_timestamp_ms=1)
    status, body = await cluster.call("POST", 0, "/v1/topics/big-record/partitions/0/records", data=io.BytesIO(batch),
                                      headers=BATCH)
    assert status == 400 and body["error_code"] == "INVALID_BATCH" and "more than" in body["message"], body


async def test_reading_one_record_of_a_large_batch_decodes_one(cluster: Cluster) -> None:
    await _topic(cluster, "wide")
    count = 100_000
    batch = encode_batch([Record(b"k%d" % i, b"v%d" % i) for i in range(count)], first_timestamp_ms=1)
    status, body = await cluster.call("POST", 0, "/v1/topics/wide/partitions/0/records", data=io.BytesIO(batch),
                                      headers=BATCH)
    assert status == 200, body
    path = f"/v1/topics/wide/partitions/0/records?offset={count - 1}&max_records=1&format=string&wait_ms=5000"
    await cluster.call("GET", 0, path)  # warm: the batch is in the page cache and recent entries
    async with LoopLag() as lag:
        for _ in range(4):
            status, body = await cluster.call("GET", 0, path)
            assert status == 200 and [(r["key"], r["value"]) for r in body["records"]] == [
                (f"k{count - 1}", f"v{count - 1}")], body
    assert lag.worst_s < 0.1, f"the loop stalled {lag.worst_s * 1000:.0f} ms"


async def test_a_follower_drops_an_append_holding_an_invalid_batch(cluster: Cluster) -> None:
    await _topic(cluster, "checked")
    status, _ = await cluster.call("POST", 0, "/v1/topics/checked/records", json={"records": [{"value": 1}]})
    assert status == 200
    group_id = cluster.nodes[0].catalog.topic("checked").partitions[0].group_id
    runtimes = [n.groups[group_id] for n in cluster.nodes]
    leader = next(r for r in runtimes if r.core.role is Role.LEADER)
    follower = next(r for r in runtimes if r.core.role is Role.FOLLOWER)
    await until(lambda: follower.core.log.last_index() == leader.core.log.last_index(), "the follower caught up")
    last = follower.core.log.last_index()
    good = encode_batch([Record(None, b"x")], first_timestamp_ms=1)
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])  # CRC mismatch
    message = Message(type=MessageType.APPEND, source=leader.core.id, target=follower.core.id,
                      term=leader.core.term, log_term=follower.core.log.last_term(), index=last,
                      entries=(Entry(Index(last + 1), leader.core.term, EntryKind.DATA, bad),),
                      commit=follower.core.commit_index)
    refused = follower.status().appends_refused
    follower.deliver(message)
    await until(lambda: follower.status().appends_refused == refused + 1, "the append refused")
    assert follower.core.log.last_index() == last


async def test_a_forwarded_read_larger_than_a_frame_answers_in_parts(cluster: Cluster) -> None:
    # Goal: a follower forwards an uncommitted read to the leader asking for 64 MiB; the
    # answer must fit a transport frame (16 MiB), so the leader answers the part that
    # fits and the reader continues from next_offset (its serving task died before).
    await _topic(cluster, "wide-read")
    value = b"v" * (RECORD_BYTES_MAX - 100)
    batch = encode_batch([Record(None, value)] * 7, first_timestamp_ms=1)  # ~7 MiB
    for _ in range(3):
        status, body = await cluster.call("POST", 0, "/v1/topics/wide-read/partitions/0/records",
                                          data=io.BytesIO(batch), headers=BATCH)
        assert status == 200, body
    group_id = cluster.nodes[0].catalog.topic("wide-read").partitions[0].group_id
    follower = next(i for i, n in enumerate(cluster.nodes) if n.groups[group_id].core.role is not Role.LEADER)
    path = (f"/v1/topics/wide-read/partitions/0/records?offset=0&isolation=uncommitted&max_bytes={64 << 20}"
            "&max_records=100&format=binary")
    started = time.monotonic()
    status, body = await cluster.call("GET", follower, path)
    assert status == 200, body
    assert 7 <= len(body["records"]) < 21 and body["next_offset"] == len(body["records"]), body["next_offset"]
    assert time.monotonic() - started < 4, "the answer came at once, not after the call's timeout"


async def test_a_compressed_batch_renders_off_the_loop_and_right(cluster: Cluster) -> None:
    # Goal: a JSON read of a large compressed batch (rendered in a worker thread, since it
    # inflates first) answers the records it holds, and the loop keeps turning meanwhile.
    await _topic(cluster, "zipped")
    records = [Record(b"k%d" % i, (b"%08d" % i) * 100_000) for i in range(12)]  # ~9.6 MB inflated
    batch = encode_batch(records, first_timestamp_ms=1, compression=Compression.ZLIB)
    status, body = await cluster.call("POST", 0, "/v1/topics/zipped/partitions/0/records", data=io.BytesIO(batch),
                                      headers=BATCH)
    assert status == 200, body
    async with LoopLag() as lag:
        status, body = await cluster.call("GET", 0, "/v1/topics/zipped/partitions/0/records"
                                          "?offset=10&max_records=1&format=string&wait_ms=5000")
    assert status == 200 and [(r["key"], r["value"][:16]) for r in body["records"]] == [("k10", "0000001000000010")]
    assert lag.worst_s < 0.1, f"the loop stalled {lag.worst_s * 1000:.0f} ms"
