"""A topic produce spread over partitions led by other nodes: one forward per leader node.

Goal (issue 26): three real nodes with their HTTP servers. A request to node 1 whose
records spread over six partitions (leaders on all three nodes) lands every record
exactly once, in its partition, with per-partition offsets in the answer, and node 1
sends one `partition.produce_many` call to each other leader node (no call per
partition). Then with a destination down (a one-replica topic whose partitions sit
two per node, node 3 stopped) the same request answers 200: the records of node 3's
partitions carry the standard retriable error (NOT_LEADER), the others are stored
once each. And a leader served a call holding one batch for a partition it leads and
one for a partition it does not answers each on its own: a result and a NOT_LEADER.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.node import forwarding
from multiraft.node.acks import Acks
from multiraft.node.forwarding import ForwardItem
from multiraft.node.node import Node
from multiraft.node.produce_result import ProduceResult
from raftlog.errors import NotLeader
from raftlog.types import GroupId
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    running_cluster_with_http,
    until,
    values_at,
)

PARTITIONS = 6
PER_PARTITION = 3


def counting_calls(node: Node) -> collections.Counter[tuple[int, str]]:
    """Count the RPC calls `node` makes, by (peer, method)."""
    calls: collections.Counter[tuple[int, str]] = collections.Counter()
    call: Callable[..., Awaitable[bytes]] = node.rpc.call

    async def counted(peer: int, method: str, body: bytes, timeout_s: float) -> bytes:
        calls[(peer, method)] += 1
        return await call(peer, method, body, timeout_s)

    node.rpc.call = counted  # type: ignore[method-assign]
    return calls


def spread_records(tag: str) -> list[dict[str, Any]]:
    return [{"value": f"{tag}-{p}-{i}", "partition": p} for i in range(PER_PARTITION) for p in range(PARTITIONS)]


async def produce(session: aiohttp.ClientSession, url: str, topic: str, records: list[dict[str, Any]]) -> list[dict]:
    async with session.post(f"{url}/v1/topics/{topic}/records", json={"records": records, "format": "string"}) as r:
        body = await r.json()
        assert r.status == 200, body
        return body["offsets"]


def _ready(nodes: list[Node], topic: str, partition: int) -> bool:
    """A leader that has applied its own term's first entry: it takes writes (a leader
    elected a moment ago answers PROPOSAL_DROPPED, retriable, and the test counts calls)."""
    leader = leader_of(nodes, topic, partition)
    if leader is None:
        return False
    core = leader.groups[leader.partition_group(topic, partition)].core
    return core.applied_index >= core.commit_index and core.log.term_or_none(core.commit_index) == core.term


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_spread_produce_is_forwarded_once_per_leader_node(tmp_path: Path) -> None:
    async with running_cluster_with_http(tmp_path, timeout_s=120) as (nodes, servers):
        await nodes[0].create_topic("spread", PARTITIONS, 3, {})
        await nodes[0].create_topic("single", PARTITIONS, 1, {})
        for node in nodes:
            await node.wait_for_topic("spread")
            await node.wait_for_topic("single")
        await until(lambda: all(_ready(nodes, t, p) for t in ("spread", "single") for p in range(PARTITIONS)),
                    "a leader for every partition, ready for writes", 30)
        leaders = {p: leader_of(nodes, "spread", p) for p in range(PARTITIONS)}
        assert len({n.id for n in leaders.values() if n is not None}) == 3, "the first leaders are spread"
        calls = counting_calls(nodes[0])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            records = spread_records("a")
            offsets = await produce(session, servers[0].url, "spread", records)
            assert [o["partition"] for o in offsets] == [r["partition"] for r in records]
            for p in range(PARTITIONS):  # each partition's records at consecutive offsets from 0, in order
                assert [o["offset"] for o in offsets if o["partition"] == p] == list(range(PER_PARTITION))
            assert set(calls) == {(2, "partition.produce_many"), (3, "partition.produce_many")}, calls
            assert all(count == 1 for count in calls.values()), calls
            for p, leader in leaders.items():  # exactly once, on every replica
                expected = [f"a-{p}-{i}".encode() for i in range(PER_PARTITION)]
                assert leader is not None
                await until(lambda p=p, expected=expected: all(values_at(n, "spread", p) == expected for n in nodes),
                            f"partition {p} everywhere")

            await _each_batch_of_a_call_is_answered_on_its_own(nodes, leaders)
            await _a_silent_destination_fails_only_its_partitions(nodes, servers[0].url, session)


async def _each_batch_of_a_call_is_answered_on_its_own(nodes: list[Node], leaders: dict[int, Node | None]) -> None:
    server = nodes[1]
    led = next(p for p, n in leaders.items() if n is server)
    other = next(p for p, n in leaders.items() if n is not server)
    items = [ForwardItem(group_id=GroupId(server.partition_group("spread", p)), batch=batch(b"c")) for p in (led, other)]
    status, body = await server.producer.serve_many(1, forwarding.encode_request(Acks.QUORUM, items))
    assert status == 0
    stored, refused = forwarding.decode_answer(body, 2)
    assert stored == ProduceResult(base_offset=PER_PARTITION, count=1, duplicate=False)
    assert isinstance(refused, NotLeader) and refused.retriable and refused.leader_hint == leaders[other].id


async def _a_silent_destination_fails_only_its_partitions(nodes: list[Node], url: str,
                                                          session: aiohttp.ClientSession) -> None:
    hosts = {p: leader_of(nodes, "single", p) for p in range(PARTITIONS)}
    victim = nodes[2]
    down = {p for p, host in hosts.items() if host is victim}
    assert down and len(down) < PARTITIONS
    await victim.stop()
    await until(lambda: not nodes[0].liveness.is_live(victim.id), "node 1 counts node 3 gone")
    records = spread_records("b")
    offsets = await asyncio.wait_for(produce(session, url, "single", records), 20)
    for record, offset in zip(records, offsets, strict=True):
        p = record["partition"]
        if p in down:
            assert offset["offset"] is None and offset["error_code"] == "NOT_LEADER", offset
        else:
            assert offset["offset"] is not None and "error_code" not in offset, offset
    for p, host in hosts.items():
        if p not in down:
            assert host is not None
            assert values_at(host, "single", p) == [f"b-{p}-{i}".encode() for i in range(PER_PARTITION)]
