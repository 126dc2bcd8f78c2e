"""The in-cluster scrubber (multiraft/node/scrubber.py): replicas compared by tictac trees.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from multiraft.node.node import Node
from raftlog.messages import Message, MessageType
from raftlog.types import Offset
from storage.batch import decode_batch
from storage.offsets import read_records
from storage.scrub import valid_sidecar
from tests.node.test_node_cluster import batch, leader_of, produce_retrying, running_cluster, until

RECORDS_PER_BATCH = 500


async def _written(nodes: list[Node], topic: str, batches: int) -> list[bytes]:
    await nodes[0].create_topic(topic, 2, 3, {"segment_bytes": 4096})
    for node in nodes:
        await node.wait_for_topic(topic)
    await until(lambda: all(leader_of(nodes, topic, p) is not None for p in (0, 1)), "leaders")
    values = [b"v%06d" % i for i in range(batches * RECORDS_PER_BATCH)]
    for partition in (0, 1):
        for i in range(0, len(values), RECORDS_PER_BATCH):
            await produce_retrying(nodes[0], topic, partition, batch(*values[i:i + RECORDS_PER_BATCH]))
    for node in nodes:
        for partition in (0, 1):
            await until(lambda n=node, p=partition: _holds(n, topic, p, values), "every replica holds every record")
    return values


def _holds(node: Node, topic: str, partition: int, values: list[bytes]) -> bool:
    with contextlib.suppress(Exception):
        return _values(node, topic, partition) == values
    return False


def _values(node: Node, topic: str, partition: int) -> list[bytes]:
    group = node.partition_group(topic, partition)
    result = read_records(node.stores[group], Offset(0), end_offset=node.partitions[group].state.high_watermark,
                          max_records=1 << 20, max_bytes=1 << 30)
    return [record.value for stored in result.batches for record in decode_batch(bytes(stored.payload))[1]]


def _flip_a_byte_at_offset(node: Node, topic: str, offset: int) -> None:
    store = node.stores[node.partition_group(topic, 0)]
    segment = next(s for s in store.segments if s.closed and s.first_offset <= offset < s.next_offset)
    with open(segment.path, "r+b") as file:  # inside the one data frame the segment holds
        file.seek(os.path.getsize(segment.path) // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_flipped_byte_in_a_follower_is_found_repaired_and_then_identical(tmp_path: Path) -> None:
    # Goal: identical replicas compare by one root each; a byte flipped in a follower's
    # committed closed segment after its tree sidecar was written is not seen by a fast
    # verify (closed segments from their sidecars: rot does not update them), and is
    # reported by a verify as it comes by default (deep) as exactly its partition and leaf
    # range; the follower's self-repair starts, and once refilled a second verify finds it
    # identical.
    async with running_cluster(tmp_path) as nodes:
        values = await _written(nodes, "scrub", batches=24)  # 12,000 offsets: three leaves of 4096

        report = (await nodes[0].api.verify(None, 0)).to_json()
        assert report["all_identical"] and report["total"] == 2 and report["next_start"] is None
        for partition in report["partitions"]:
            assert partition["high_watermark"] == len(values)
            assert [r["nodes_compared"] for r in partition["replicas"]] == [1, 1], "roots only"

        leader = leader_of(nodes, "scrub", 0)
        follower = next(n for n in nodes if n is not leader)
        group = follower.partition_group("scrub", 0)
        store = follower.stores[group]
        closed = [s for s in store.segments if s.closed and s.first_index >= store.first_index()]
        # The first verify wrote the sidecars of every closed segment inside its span (or the warmer did).
        assert closed and all(valid_sidecar(store, s) is not None for s in closed if s.first_offset > 0)
        _flip_a_byte_at_offset(follower, "scrub", 6000)

        report = (await nodes[1].api.verify(["scrub"], 0, deep=False)).to_json()
        assert report["all_identical"], "the rotten segment counted by its sidecar: not read"
        report = (await nodes[1].api.verify(["scrub"], 0)).to_json()
        first, second = report["partitions"]
        assert second["status"] == "identical"
        assert first["status"] == "different" and first["repair_started"]
        assert first["ranges"] == [[4096, 8192]]
        damaged = [r for r in first["replicas"] if r["status"] != "identical"]
        assert [r["node"] for r in damaged] == [follower.id]
        assert 1 < damaged[0]["nodes_compared"] <= 1 + 16, "the root, then one level of 16 (one is short)"

        await until(lambda: follower.stores.get(group) not in (None, store), "the follower reopened", 30)
        await until(lambda: _holds(follower, "scrub", 0, values), "the follower repaired from the leader", 30)
        report = (await nodes[2].api.verify(["scrub"], 0)).to_json()
        assert report["all_identical"], report
        counts = leader.api.scrub_counts if leader is not None else None
        assert counts is not None and counts.partitions_verified >= 2


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_follower_behind_is_reported_behind_and_compared_over_what_it_holds(tmp_path: Path) -> None:
    # Goal: a follower not given the newest entries yet is `behind`, not `different`:
    # compared over the prefix it applied, and no repair is started.
    async with running_cluster(tmp_path) as nodes:
        await _written(nodes, "lag", batches=2)
        leader = leader_of(nodes, "lag", 0)
        assert leader is not None
        group = leader.partition_group("lag", 0)
        slow = next(n for n in nodes if n is not leader)
        runtime = slow.groups[group]
        held: list[tuple[Any, Message]] = []

        def hold(message: Message, deliver: Any = runtime.deliver) -> None:
            if message.type is MessageType.APPEND and message.entries:
                held.append((deliver, message))
            else:
                deliver(message)

        runtime.deliver = hold  # type: ignore[method-assign]
        try:
            await produce_retrying(leader, "lag", 0, batch(b"more"))  # committed by the leader and the other one
            other = next(n for n in nodes if n not in (leader, slow))
            high = leader.partitions[group].state.high_watermark
            await until(lambda: other.partitions[group].state.high_watermark == high, "the other follower applied it")
            report = (await leader.api.verify(["lag"], 0)).to_json()
        finally:
            del runtime.deliver
            for deliver, message in held:
                deliver(message)
        first = report["partitions"][0]
        assert first["status"] == "behind" and not first["repair_started"] and first["ranges"] == []
        by_node = {r["node"]: r for r in first["replicas"]}
        assert by_node[slow.id]["status"] == "behind"
        assert by_node[slow.id]["hi"] == 2 * RECORDS_PER_BATCH < first["high_watermark"]
        assert [r["status"] for n, r in by_node.items() if n != slow.id] == ["identical"]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_leader_whose_read_fails_repairs_itself_and_touches_no_follower(tmp_path: Path) -> None:
    # Goal: the reference must be sound. A leader whose own segment fails its checks is
    # `leader_damaged`: its own repair starts (the reopen steps it down and refills it),
    # and no follower is compared or repaired against it.
    async with running_cluster(tmp_path) as nodes:
        values = await _written(nodes, "lead", batches=24)
        leader = leader_of(nodes, "lead", 0)
        assert leader is not None
        group = leader.partition_group("lead", 0)
        followers_stores = {n.id: n.stores[group] for n in nodes if n is not leader}
        store = leader.stores[group]
        _flip_a_byte_at_offset(leader, "lead", 6000)

        report = (await leader.api.verify(["lead"], 0)).to_json()
        first = report["partitions"][0]
        assert first["status"] == "leader_damaged" and first["repair_started"]
        assert [r["node"] for r in first["replicas"]] == [leader.id]
        await until(lambda: leader.stores.get(group) not in (None, store), "the leader reopened", 30)
        await until(lambda: _holds(leader, "lead", 0, values), "the old leader refilled", 30)
        assert all(n.stores[group] is followers_stores[n.id] for n in nodes if n is not leader), "followers untouched"
