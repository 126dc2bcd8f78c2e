"""Goal: the Python client's group member (multiraft/client/member.py) on the package's
in-process 3-node cluster: members split a topic; a newcomer gets partitions only after
their old owner's on_revoked ran and committed, so nothing is read twice; a member that
closes hands its partitions over at once; a member that goes silent is removed, loses
its partitions (on_lost) and joins again on its next poll; the blocking wrapper runs
its callbacks off the client's loop, so they may commit."""

from __future__ import annotations

import asyncio
import json
import struct
from collections import Counter
from typing import Any

import pytest

from multiraft.client import BATCH_CONTENT_TYPE, AsyncClient, AsyncGroupConsumer, Client
from storage.batch import decode_batch
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]
PARTITIONS = 6
TopicPartition = tuple[str, int]


def _servers(cluster: Cluster) -> list[str]:
    return [f"{s.host}:{s.port}" for s in cluster.servers]


async def _produce(cluster: Cluster, topic: str, first: int, count: int) -> None:
    for partition in range(PARTITIONS):
        status, body = await cluster.call("POST", partition % 3, f"/v1/topics/{topic}/partitions/{partition}/records",
                                          json={"records": [{"value": f"{partition}-{i}"}
                                                            for i in range(first, first + count)]})
        assert status == 200, body


class Recorder:
    """Every callback of every member, in order, and every record read."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, frozenset[TopicPartition]]] = []
        self.read: list[tuple[str, int, int]] = []

    def member(self, client: AsyncClient, name: str, topic: str, **options: Any) -> AsyncGroupConsumer:
        def note(kind: str):  # type: ignore[no-untyped-def]
            return lambda partitions: self.events.append((kind, name, frozenset(partitions)))

        return AsyncGroupConsumer(client, "members", topics=[topic], auto_offset_reset="earliest", wait_ms=100,
                                  on_assigned=note("assigned"), on_revoked=note("revoked"), on_lost=note("lost"),
                                  member_id=name, **options)

    async def drain(self, members: list[AsyncGroupConsumer], total: int, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.read) < total:
                for member in members:
                    self.read.extend((r.topic, r.partition, r.offset) for r in await member.poll())


async def _settle(members: list[AsyncGroupConsumer], partitions: int) -> None:
    """Poll until the members' holdings cover the topic once each, every member stable."""
    async with asyncio.timeout(30):
        while True:
            for member in members:
                await member.poll()
            held = [tp for m in members for tp in m.held]
            if len(held) == len(set(held)) == partitions and all(m.view["state"] == "stable" for m in members):
                return


async def test_members_split_hand_over_with_callbacks_and_rejoin_when_removed(cluster: Cluster) -> None:
    await cluster.create_topic("cg-client", partitions=PARTITIONS)
    await _produce(cluster, "cg-client", 0, 5)
    recorder = Recorder()
    async with AsyncClient(_servers(cluster), backoff_s=0.01) as client:
        first = recorder.member(client, "first", "cg-client", session_timeout_ms=2000)
        second = recorder.member(client, "second", "cg-client")
        members = [first, second]
        for member in members:
            await member.start()
        await recorder.drain(members, PARTITIONS * 5)
        await _settle(members, PARTITIONS)
        assert sorted(len(m.held) for m in members) == [3, 3]

        third = recorder.member(client, "third", "cg-client")
        await third.start()
        members.append(third)
        await _settle(members, PARTITIONS)
        assert sorted(len(m.held) for m in members) == [2, 2, 2]
        # Each partition the newcomer got was revoked from its old owner first (who committed).
        given = set().union(*[p for kind, name, p in recorder.events if (kind, name) == ("assigned", "third")])
        revoked = set().union(*[p for kind, _, p in recorder.events if kind == "revoked"])
        assert given <= revoked
        await _produce(cluster, "cg-client", 5, 3)
        await recorder.drain(members, PARTITIONS * 8)
        assert Counter(recorder.read).most_common(1)[0][1] == 1  # nothing read twice
        assert len(set(recorder.read)) == PARTITIONS * 8

        # A member that closes hands over at once: the others hold everything without
        # waiting for its session to time out.
        await second.close()
        members.remove(second)
        await _settle(members, PARTITIONS)

        # The first member goes silent (its heartbeats stop, it does not poll) past its
        # session: removed, its partitions move; its next poll loses them and joins again.
        await first._stop_heartbeats()  # a member whose process froze
        lost_before = set(first.held)
        async with asyncio.timeout(15):
            while third.held != {("cg-client", p) for p in range(PARTITIONS)}:
                await third.poll()
        await first.poll()
        assert ("lost", "first", frozenset(lost_before)) in recorder.events
        assert not first.held
        await first.close()
        await third.close()


async def test_the_blocking_member_commits_from_its_callback(cluster: Cluster) -> None:
    await cluster.create_topic("cg-sync", partitions=2)
    for partition in range(2):
        status, body = await cluster.call("POST", 0, f"/v1/topics/cg-sync/partitions/{partition}/records",
                                          json={"records": [{"value": i} for i in range(4)]})
        assert status == 200, body

    def run() -> tuple[list[int], dict[int, int]]:
        revoked: list[set[TopicPartition]] = []
        with Client(_servers(cluster), backoff_s=0.01) as client:
            member = client.group_consumer("sync-members", topics=["cg-sync"], auto_offset_reset="earliest",
                                           auto_commit=False, wait_ms=100,
                                           on_revoked=lambda partitions: (revoked.append(partitions),
                                                                          member.commit(list(partitions))))
            read: list[int] = []
            while len(read) < 8:
                read.extend(r.offset for r in member.poll())
            member.close()  # on_revoked commits (auto_commit is off), then it leaves
            assert revoked == [{("cg-sync", 0), ("cg-sync", 1)}]
            return read, client.fetch_offsets("sync-members", "cg-sync")

    async with asyncio.timeout(60):
        read, committed = await asyncio.to_thread(run)
    assert sorted(read) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert committed == {0: 4, 1: 4}


async def test_a_binary_member_fetch_carries_the_stored_batches(cluster: Cluster) -> None:
    # Goal: with Accept: application/vnd.raftlog.batch a member's fetch answers a u32, the
    # JSON part (member, positions, errors, batches) and the stored batches' bytes, whole.
    await cluster.create_topic("cg-binary", partitions=1)
    status, body = await cluster.call("POST", 0, "/v1/topics/cg-binary/partitions/0/records",
                                      json={"records": [{"value": i, "key": f"k{i}"} for i in range(5)]})
    assert status == 200, body
    status, member = await cluster.call("POST", 1, "/v1/groups/binary/members", json={"topics": ["cg-binary"]})
    assert status == 200, member
    path = f"/v1/groups/binary/members/{member['member_id']}/records"
    status, payload = await cluster.call("POST", 2, path, headers={"Accept": BATCH_CONTENT_TYPE}, json={
        "member_epoch": member["member_epoch"], "positions": [{"topic": "cg-binary", "partition": 0, "offset": 2}],
        "wait_ms": 5000})  # node 2's replica may learn the high watermark a moment later: wait for it
    assert status == 200, payload
    (length,) = struct.unpack_from(">I", payload)
    header = json.loads(payload[4:4 + length])
    assert header["errors"] == [] and header["member"]["member_id"] == member["member_id"]
    assert header["positions"] == [{"topic": "cg-binary", "partition": 0, "offset": 2, "next_offset": 5,
                                    "high_watermark": 5}]
    ((topic, partition, base, size),) = header["batches"]  # the one stored batch, whole
    assert (topic, partition, base, size) == ("cg-binary", 0, 0, len(payload) - 4 - length)
    _, records = decode_batch(payload[4 + length:])
    assert [(r.key, r.value) for r in records] == [(f"k{i}".encode(), str(i).encode()) for i in range(5)]
    status, _ = await cluster.call("DELETE", 0, f"/v1/groups/binary/members/{member['member_id']}",
                                   params={"member_epoch": header["member"]["member_epoch"]})
    assert status == 204
