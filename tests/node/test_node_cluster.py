"""Three real nodes in one event loop: real sockets on 127.0.0.1-3, real files, fsync.

Goal: the metadata group forms and every node registers; a topic created on one
node appears on all and its partition groups elect leaders; produce through any
node (followers forward to the leader) lands in order; stopping a partition
leader elects a new one and acknowledged data stays; a stopped node restarts and
catches up from its own log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from multiraft.metadata.features import SUPPORTED_LEVEL
from multiraft.node.config import Address, NodeConfig
from multiraft.node.node import Node
from multiraft.node.produce_result import ProduceResult
from multiraft.node.ticker import WAKE_SILENCE_PERIODS
from raftlog.errors import ClientError
from raftlog.messages import Message, MessageType, Role
from raftlog.types import NodeId
from storage.batch import Record, decode_batch, encode_batch
from storage.offsets import read_records

SECRET = b"test-secret-0123456789abcdef-0123456789abcdef"  # 45 base64url characters: 33 bytes


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def configs(tmp_path: Path, n: int = 3, **overrides: int) -> list[NodeConfig]:
    raft = {NodeId(i): Address(f"127.0.0.{i}", free_port(f"127.0.0.{i}")) for i in range(1, n + 1)}
    return [
        NodeConfig(
            node_id=NodeId(i), data_dir=tmp_path / f"node{i}", raft_addr=raft[NodeId(i)],
            http_addr=Address(f"127.0.0.{i}", 8000 + i), initial_cluster=raft, cluster_secret=SECRET,
            **({"tick_ms": 20, "node_dead_after_ms": 2000, "replica_lag_time_max_ms": 1000} | overrides),
        )
        for i in range(1, n + 1)
    ]


async def restart_all(nodes: list[Node]) -> None:
    """Stop every node, then start each again from its own data (`nodes` is updated)."""
    for node in nodes:
        await node.stop()
    for position, node in enumerate(list(nodes)):
        nodes[position] = Node(node.config)
    for node in nodes:
        await node.start()


@contextlib.asynccontextmanager
async def running_cluster_with_http(tmp_path: Path, timeout_s: float = 90,
                                    **overrides: int) -> AsyncIterator[tuple[list[Node], list]]:
    """Three started, registered nodes with an HTTP server each (a joiner needs one to join
    through); servers and every node still running are stopped on the way out."""
    from multiraft.http import HttpServer

    cfgs = configs(tmp_path, 3, **overrides)
    nodes = [Node(c) for c in cfgs]
    servers = [HttpServer(n.api, c.http_addr.host, free_port(c.http_addr.host)) for n, c in zip(nodes, cfgs, strict=True)]
    try:
        async with asyncio.timeout(timeout_s):
            for node, server in zip(nodes, servers, strict=True):
                await node.start()
                await server.start()
            await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "registration")
            yield nodes, servers
    finally:
        for server in servers:
            await server.stop()
        for node in nodes:
            if node.db is not None:
                await node.stop()


@contextlib.asynccontextmanager
async def running_four_nodes(tmp_path: Path, **overrides: int) -> AsyncIterator[list[Node]]:
    """Three voters with HTTP plus a fourth node joined through node 1's; every node still
    running is stopped on the way out (entries of the list may be replaced by a test)."""
    async with running_cluster_with_http(tmp_path, **overrides) as (nodes, servers):
        everyone = [*nodes, Node(joiner_config(tmp_path, servers[0].url))]
        try:
            await everyone[3].start()
            await until(lambda: all(len(n.catalog.nodes) == 4 for n in everyone), "4 nodes everywhere")
            yield everyone
        finally:
            for node in everyone[3:] + [n for n in everyone[:3] if n not in nodes]:
                if node.db is not None:
                    await node.stop()


def joiner_config(tmp_path: Path, via: str) -> NodeConfig:
    """Node 4 on 127.0.0.4, joining through the HTTP server at `via` (a URL)."""
    return NodeConfig(
        node_id=NodeId(4), data_dir=tmp_path / "node4", raft_addr=Address("127.0.0.4", free_port("127.0.0.4")),
        http_addr=Address("127.0.0.4", 8004), join=Address.parse(via.removeprefix("http://"), "join"),
        cluster_secret=SECRET, tick_ms=20,
    )


def batch(*values: bytes) -> bytes:
    return encode_batch([Record(None, v) for v in values], first_timestamp_ms=1)


async def until(condition, what: str, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def at_build_level(nodes: list[Node], timeout_s: float = 30.0) -> None:
    """Until every node's catalog is finalized at this build's feature level: a new cluster's
    first metadata leader proposes it moments after its election (multiraft/node/features.py).
    A fixture whose tests use a gated command (a kept prefix, an HTTPS link) waits for it."""
    await until(lambda: all(n.catalog.feature_level == SUPPORTED_LEVEL for n in nodes),
                f"feature level {SUPPORTED_LEVEL} on every node", timeout_s)


async def produce_retrying(node: Node, topic: str, partition: int, data: bytes, timeout_s: float = 15.0,
                           acks: str = "quorum") -> ProduceResult:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                return await node.produce(topic, partition, data, acks)
            except ClientError as error:
                if not error.retriable:
                    raise
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_cluster(tmp_path: Path, timeout_s: float = 90, **overrides: int) -> AsyncIterator[list[Node]]:
    """Three started, registered nodes; every node still running is stopped on the way out."""
    nodes = [Node(c) for c in configs(tmp_path, **overrides)]
    try:
        async with asyncio.timeout(timeout_s):
            for node in nodes:
                await node.start()
            await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "registration")
            yield nodes
    finally:
        for node in nodes:
            if node.db is not None:
                await node.stop()


async def written_partition(nodes: list[Node], topic: str, first: bytes) -> Node:
    """A new one-partition, three-replica `topic`, known to every node, with `first`
    written to it; its leader."""
    await nodes[0].create_topic(topic, 1, 3, {})
    for node in nodes:
        await node.wait_for_topic(topic)
    await until(lambda: leader_of(nodes, topic, 0) is not None, f"a leader of {topic}")
    await produce_retrying(nodes[0], topic, 0, batch(first))
    leader = leader_of(nodes, topic, 0)
    assert leader is not None
    return leader


def leader_of(nodes: list[Node], topic: str, partition: int) -> Node | None:
    for node in nodes:
        if topic in node.catalog.topics:
            group = node.partition_group(topic, partition)
            runtime = node.groups.get(group)
            if runtime is not None and runtime.core.role is Role.LEADER:
                return node
    return None


def values_at(node: Node, topic: str, partition: int) -> list[bytes]:
    group = node.partition_group(topic, partition)
    state = node.partitions[group].state
    result = read_records(node.stores[group], 0, end_offset=state.high_watermark, max_records=10_000, max_bytes=1 << 30)
    values = []
    for stored in result.batches:
        _, records = decode_batch(bytes(stored.payload))
        values += [r.value for r in records]
    return values


@pytest.mark.integration
@pytest.mark.asyncio
async def test_cluster_forms_produces_fails_over_and_restarts(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as nodes:
        await until(lambda: all(n.registered.is_set() for n in nodes), "every node registered")

        await nodes[1].create_topic("events", 2, 3, {})
        for node in nodes:
            await node.wait_for_topic("events")
        await until(lambda: all(leader_of(nodes, "events", p) for p in (0, 1)), "partition leaders")

        acknowledged = []
        for i in range(6):
            answer = await produce_retrying(nodes[i % 3], "events", 0, batch(b"v%d" % i))
            acknowledged.append((answer.base_offset, b"v%d" % i))
        assert [offset for offset, _ in acknowledged] == list(range(6)), "gapless offsets in order"
        await until(lambda: all(values_at(n, "events", 0) == [v for _, v in acknowledged] for n in nodes),
                    "every replica holds the acknowledged records")

        # Stop the partition leader: another replica takes over, data intact.
        old_leader = leader_of(nodes, "events", 0)
        assert old_leader is not None
        await old_leader.stop()
        survivors = [n for n in nodes if n is not old_leader]
        await until(lambda: leader_of(survivors, "events", 0) is not None, "a new partition leader")
        answer = await produce_retrying(survivors[0], "events", 0, batch(b"after"))
        assert answer.base_offset == 6
        acknowledged.append((6, b"after"))

        # Restart the stopped node from its data directory: it catches up.
        index = nodes.index(old_leader)
        nodes[index] = Node(old_leader.config)
        await nodes[index].start()
        await nodes[index].wait_for_topic("events")
        restarted = nodes[index]
        group = restarted.partition_group("events", 0)
        await until(lambda: group in restarted.partitions, "the restarted node reopened its replica")
        await until(lambda: values_at(restarted, "events", 0) == [v for _, v in acknowledged],
                    "the restarted node caught up")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_stopped_leader_is_replaced_before_any_election_timeout(tmp_path: Path) -> None:
    # Goal: a leader whose process is gone (its raft port refuses connections) is
    # replaced at once, not after an election timeout: here the timeouts are 3-6 s
    # (150 ticks of 20 ms, randomized), so a new leader within 2 s can only come from
    # the refused redial (Node._on_peer_refused -> GroupRuntime._leader_gone).
    async with running_cluster(tmp_path, election_timeout_ticks=150, heartbeat_interval_ticks=5) as nodes:
        old_leader = await written_partition(nodes, "fast", b"before")
        survivors = [n for n in nodes if n is not old_leader]
        await old_leader.stop()
        began = time.monotonic()
        await until(lambda: leader_of(survivors, "fast", 0) is not None, "a new partition leader", 10.0)
        took = time.monotonic() - began
        assert took < 2.0, f"a new leader after {took:.2f} s: an election timeout, not the refusal"
        assert all(not n.is_live(old_leader.id) for n in survivors), "the gone node counts as silent"
        answer = await produce_retrying(survivors[0], "fast", 0, batch(b"after"))
        assert answer.base_offset == 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_reads_offsets_producers_and_long_poll(tmp_path: Path) -> None:
    # Goal: follower and forwarded reads, consumer offset commit/fetch through the
    # partition group, idempotent retries answered with original offsets, fenced
    # epochs refused, long-poll woken by a produce.
    from multiraft.state.consumer_offsets import OffsetCommit

    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("solo", 1, 1, {})  # one replica: two nodes must forward
        for node in nodes:
            await node.wait_for_topic("solo")
        await until(lambda: leader_of(nodes, "solo", 0) is not None, "a leader for solo/0")
        host = leader_of(nodes, "solo", 0)
        others = [n for n in nodes if n is not host]

        producer_id, epoch = await others[0].allocate_producer_id()
        first = encode_batch([Record(None, b"a"), Record(None, b"b")], first_timestamp_ms=1,
                             producer_id=producer_id, producer_epoch=epoch, base_sequence=0)
        answer = await produce_retrying(others[0], "solo", 0, first)
        assert (answer.base_offset, answer.count, answer.duplicate) == (0, 2, False)
        retry = await produce_retrying(others[1], "solo", 0, first)
        assert (retry.base_offset, retry.duplicate) == (0, True), "a retry gets its original offsets"

        bumped = encode_batch([Record(None, b"e1")], first_timestamp_ms=1, producer_id=producer_id,
                              producer_epoch=epoch + 1, base_sequence=0)
        fenced = encode_batch([Record(None, b"old")], first_timestamp_ms=1, producer_id=producer_id,
                              producer_epoch=epoch, base_sequence=2)
        assert (await produce_retrying(others[0], "solo", 0, bumped)).base_offset == 2
        with pytest.raises(ClientError) as raised:
            await produce_retrying(others[1], "solo", 0, fenced)
        assert raised.value.code == "INVALID_PRODUCER_EPOCH", "an old epoch is fenced"

        waiting = asyncio.create_task(
            others[1].reads.consume("solo", 0, 3, wait_ms=5000)
        )
        await asyncio.sleep(0.2)
        assert not waiting.done(), "a read at the high watermark waits"
        await produce_retrying(others[0], "solo", 0, batch(b"c"))
        woken = await waiting
        assert [(b, n) for b, n, _ in woken.batches] == [(3, 1)] and woken.high_watermark == 4

        read = await others[0].reads.consume("solo", 0, 0)  # forwarded read
        assert [(b, n) for b, n, _ in read.batches] == [(0, 2), (2, 1), (3, 1)] and read.next_offset == 4

        commit = OffsetCommit(group="g1", topic="solo", partition=0, offset=2)
        await others[1].reads.commit_offsets("g1", [commit])
        fetched = await others[0].reads.fetch_offsets("g1", "solo")
        assert fetched == [{"topic": "solo", "partition": 0, "offset": 2, "metadata": ""}]
        with pytest.raises(ClientError) as raised:
            await host.reads.commit_offsets("g1", [OffsetCommit(group="g1", topic="solo", partition=0, offset=99)])
        assert raised.value.code == "OFFSET_OUT_OF_RANGE"
        with pytest.raises(ClientError) as raised:
            await others[0].reads.consume("solo", 0, 50)
        assert raised.value.code == "OFFSET_OUT_OF_RANGE" and raised.value.http_status == 416

        # Nodes without a replica learn the leader from the leader's pings (describe, forwarding).
        group = host.partition_group("solo", 0)
        await until(lambda: all(n.leader_of(group) == host.id for n in others), "the leader's pings")
        assert all(n.forward_target(group, [host.id]) == host.id for n in nodes if n is not host)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_acks_and_min_insync_replicas(tmp_path: Path) -> None:
    # Goal: every acks mode answers a ProduceResult, on the leader and forwarded from a
    # follower; with a replica down, acks=quorum still works at min_insync_replicas=2 but
    # is refused with NOT_ENOUGH_REPLICAS at 3.

    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("strict", 1, 3, {"min_insync_replicas": 3})
        await nodes[0].create_topic("relaxed", 1, 3, {"min_insync_replicas": 2})
        for node in nodes:
            await node.wait_for_topic("strict")
            await node.wait_for_topic("relaxed")
        await until(lambda: leader_of(nodes, "strict", 0) and leader_of(nodes, "relaxed", 0), "leaders")
        for acks in ("none", "leader", "quorum", "all"):
            for node in nodes:  # the leader answers locally, the others forward to it
                answer = await produce_retrying(node, "relaxed", 0, batch(acks.encode()), acks=acks)
                assert isinstance(answer, ProduceResult) and answer.count == 1 and not answer.duplicate
                assert (answer.base_offset == -1) == (acks == "none"), "only acks=none answers before an offset"
        # acks=leader answers with the offset the leader's log gave the batch (Kafka's acks=1).
        answer = await produce_retrying(nodes[0], "relaxed", 0, batch(b"offset"), acks="leader")
        assert answer.base_offset == 12, "after the twelve above"
        read = await nodes[0].reads.consume("relaxed", 0, 12, wait_ms=5000)
        assert [(base, count) for base, count, _ in read.batches] == [(12, 1)]
        await _uncommitted_reads_reach_the_leaders_log_end(nodes, "relaxed")
        answer = await produce_retrying(nodes[0], "strict", 0, batch(b"x"), timeout_s=15)
        assert answer.base_offset == 0
        # Take down a follower of both partitions; wait past the lag time (short here).
        leader = leader_of(nodes, "strict", 0)
        victim = next(n for n in nodes if n is not leader and n is not leader_of(nodes, "relaxed", 0))
        await victim.stop()
        survivors = [n for n in nodes if n is not victim]
        await asyncio.sleep(0.1)
        answer = await produce_retrying(survivors[0], "relaxed", 0, batch(b"ok"))
        assert answer.count == 1
        strict_leader = leader_of(survivors, "strict", 0)
        group = strict_leader.partition_group("strict", 0)
        core = strict_leader.groups[group].core
        await until(lambda: len(core.in_sync_replicas()) == 2, "the stopped follower left the ISR", 20)
        with pytest.raises(ClientError) as raised:
            await survivors[0].produce("strict", 0, batch(b"no"))
        assert raised.value.code == "NOT_ENOUGH_REPLICAS"


async def _uncommitted_reads_reach_the_leaders_log_end(nodes: list[Node], topic: str) -> None:
    # Goal: with the followers not given a new entry yet, a committed read through a
    # follower stops at the high watermark, and an uncommitted one reaches the leader's
    # log end (it is read on the leader), wherever it is asked.

    leader = leader_of(nodes, topic, 0)
    assert leader is not None
    group = leader.partition_group(topic, 0)
    held: list[tuple[Any, Message]] = []
    runtimes = [n.groups[group] for n in nodes if n is not leader]
    for runtime in runtimes:
        def hold(message: Message, deliver: Any = runtime.deliver) -> None:
            if message.type is MessageType.APPEND and message.entries:
                held.append((deliver, message))
            else:
                deliver(message)
        runtime.deliver = hold  # type: ignore[method-assign]
    try:
        ahead = (await leader.produce(topic, 0, batch(b"ahead"), "leader")).base_offset
        for node in nodes:
            committed = await node.reads.consume(topic, 0, ahead)
            assert committed.batches == [] and committed.high_watermark == ahead
            read = await node.reads.consume(topic, 0, ahead, isolation="uncommitted")
            assert [(base, count) for base, count, _ in read.batches] == [(ahead, 1)], node.id
    finally:
        for runtime in runtimes:
            del runtime.deliver  # the class's method again
        for deliver, message in held:
            deliver(message)


async def _quiesce_scenario(tmp_path: Path, partitions: int, timeout_s: float) -> None:
    async with running_cluster(tmp_path, timeout_s) as nodes:
        await nodes[0].create_topic("many", partitions, 3, {})
        for node in nodes:
            await node.wait_for_topic("many")
        total = partitions + 1  # and the metadata group
        await until(lambda: all(n.quiesced_groups() == total for n in nodes),
                    f"all {total} groups quiet on every node", timeout_s / 2)
        frames = [n.transport.stats().frames_out for n in nodes]
        await asyncio.sleep(1.0)
        sent = [n.transport.stats().frames_out - f for n, f in zip(nodes, frames, strict=True)]
        # Quiet groups send nothing; only node pings remain (2 peers x ~25 intervals/s).
        assert max(sent) < 150, f"frames per node while quiet: {sent}"
        answer = await produce_retrying(nodes[1], "many", partitions - 1, batch(b"wake"))
        assert answer.base_offset == 0, "a produce wakes its group"
        # A leader's node dies: its quiet groups wake on the other nodes and elect.
        victim = nodes[0]
        led = [p for p in range(partitions) if leader_of(nodes, "many", p) is victim]
        await victim.stop()
        survivors = nodes[1:]
        await until(lambda: all(leader_of(survivors, "many", p) for p in led),
                    f"new leaders for the {len(led)} partitions node 1 led", timeout_s / 2)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_idle_groups_quiesce_and_wake(tmp_path: Path) -> None:
    # Goal: idle groups go quiet on every node (no heartbeat traffic), a produce wakes
    # one, and the death of a leader's node wakes its groups elsewhere to elect.
    await _quiesce_scenario(tmp_path, partitions=60, timeout_s=90)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_stall_of_the_nodes_own_loop_wakes_no_quiet_group(tmp_path: Path) -> None:
    # Goal: a node whose own event loop stalled (a long GC pass, a starved CPU) does not
    # take its peers for silent when it resumes: their frames were only waiting for it.
    # Silence is counted in the ticks the node ran, and overdue ticks are dropped. Here
    # the three nodes share one loop, so none pinged while it was blocked.
    async with running_cluster(tmp_path, 60) as nodes:
        await nodes[0].create_topic("stall", 3, 3, {})
        for node in nodes:
            await node.wait_for_topic("stall")
        await until(lambda: all(n.quiesced_groups() == 4 for n in nodes), "all 4 groups quiet everywhere", 30)
        wake_after_s = nodes[0].liveness.silence_s * WAKE_SILENCE_PERIODS
        time.sleep(3 * wake_after_s)  # blocks the loop: no tick, no ping, no read
        for _ in range(10):
            await asyncio.sleep(0.05)
            assert [n.peer_silences for n in nodes] == [0, 0, 0], "a stall of our own is no silence of theirs"
            assert all(n.quiesced_groups() == 4 for n in nodes)

@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_node_joins_as_a_metadata_learner(tmp_path: Path) -> None:
    # Goal: a fourth node started with --join (an HTTP address) is admitted as a learner
    # of the metadata group, receives the catalog, and hosts replicas of new topics.
    joiner: Node | None = None
    async with running_cluster_with_http(tmp_path) as (nodes, servers):
        try:
            await nodes[0].create_topic("before", 1, 3, {})
            joiner = Node(joiner_config(tmp_path, servers[1].url))
            await joiner.start()
            await joiner.wait_for_topic("before")
            await until(lambda: all(len(n.catalog.nodes) == 4 for n in [*nodes, joiner]), "4 nodes everywhere")
            metadata_leader = next(n for n in nodes if n.groups[0].core.role is Role.LEADER)
            assert 4 in metadata_leader.groups[0].core.membership.learners
            await nodes[2].create_topic("after", 4, 1, {})  # one replica on each of the 4 nodes
            await joiner.wait_for_topic("after")
            await until(lambda: len(joiner.partitions) == 1, "the joiner hosts a replica")
        finally:
            if joiner is not None and joiner.db is not None:
                await joiner.stop()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_partition_without_a_leader_answers_503_leader_not_available(tmp_path: Path) -> None:
    # Goal: the contract's two refusals (DESIGN.md section 6). While another node leads,
    # forward=false is 421 NOT_LEADER naming it; with two of three replicas gone no leader
    # can be elected, and the survivor answers a produce (forwarded or not) and an
    # uncommitted read 503 LEADER_NOT_AVAILABLE without a hint, while it still serves
    # committed reads from its own replica.
    import aiohttp

    async with running_cluster_with_http(tmp_path) as (nodes, servers):
        leader = await written_partition(nodes, "orphan", b"before")
        position = next(i for i, n in enumerate(nodes) if n is not leader)
        records = servers[position].url + "/v1/topics/orphan/partitions/0/records"
        produce = {"json": {"records": [{"value": "x"}]}}
        await until(lambda: values_at(nodes[position], "orphan", 0) == [b"before"], "the survivor knows it committed")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            async with session.post(records, params={"forward": "false"}, **produce) as response:
                body = await response.json()
                assert (response.status, body["error_code"], body["leader_hint"]) == (421, "NOT_LEADER", leader.id)
            for node in nodes:
                if node is not nodes[position]:
                    await node.stop()

            async def answer(method: str, **kwargs: Any) -> tuple[int, dict]:
                async with session.request(method, records, **kwargs) as response:
                    return response.status, await response.json()

            async with asyncio.timeout(20):
                while (await answer("POST", **produce))[0] != 503:
                    await asyncio.sleep(0.05)  # until the survivor's replica gives up on the old leader
            for method, kwargs in [("POST", produce), ("POST", {**produce, "params": {"forward": "false"}}),
                                   ("GET", {"params": {"offset": "0", "isolation": "uncommitted"}})]:
                status, body = await answer(method, **kwargs)
                assert (status, body["error_code"]) == (503, "LEADER_NOT_AVAILABLE"), (method, kwargs, body)
                assert set(body) == {"error_code", "message"}, "no leader to name"
            status, body = await answer("GET", params={"offset": "0", "format": "string"})
            assert status == 200 and [r["value"] for r in body["records"]] == ["before"], body


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_dead_nodes_replica_moves_to_a_live_node(tmp_path: Path) -> None:
    # Goal: re-replication (DESIGN.md section 5). A node silent past replica_move_after_ms
    # loses its replica of a partition to the one live node without a copy: the catalog
    # names it, the partition leader adds it as a learner, promotes it once caught up,
    # removes the dead voter and reports it; the new copy holds every acknowledged record
    # and takes part in later writes.
    async with running_four_nodes(tmp_path, replica_move_after_ms=2000) as everyone:
        nodes = everyone[:3]
        await nodes[0].create_topic("moved", 1, 3, {})
        for node in everyone:
            await node.wait_for_topic("moved")
        group = nodes[0].partition_group("moved", 0)
        before = nodes[0].catalog.topics["moved"].partitions[0].replicas
        await until(lambda: leader_of(everyone, "moved", 0) is not None, "a partition leader")
        written = [b"r%d" % i for i in range(5)]
        for value in written:
            await produce_retrying(nodes[0], "moved", 0, batch(value))
        metadata_leader = next(n for n in nodes if n.groups[0].core.role is Role.LEADER)
        victim = next(n for n in everyone if n.id in before and n is not metadata_leader
                      and n is not leader_of(everyone, "moved", 0))
        newcomer = next(n for n in everyone if n.id not in before)
        await victim.stop()
        survivors = [n for n in everyone if n is not victim]

        def moved() -> bool:
            info = metadata_leader.catalog.topics["moved"].partitions[0]
            leader = leader_of(survivors, "moved", 0)
            if leader is None or victim.id in info.replicas or info.leaving:
                return False
            membership = leader.groups[group].core.membership
            return membership.voters == set(info.replicas) and not membership.learners

        await until(moved, "the replica moved off the dead node", 60)
        info = metadata_leader.catalog.topics["moved"].partitions[0]
        assert newcomer.id in info.replicas and info.replicas.index(newcomer.id) == before.index(victim.id)
        await until(lambda: values_at(newcomer, "moved", 0) == written, "the new copy holds every record")
        await produce_retrying(survivors[0], "moved", 0, batch(b"after"))
        await until(lambda: all(values_at(n, "moved", 0) == [*written, b"after"] for n in survivors
                                if n.id in info.replicas), "every copy takes the next write")
        # The dead node comes back: its copy is no longer the partition's, so it goes.
        returned = Node(victim.config)
        everyone[everyone.index(victim)] = returned
        await returned.start()
        await returned.wait_for_topic("moved")
        directory = victim.config.data_dir / "groups" / str(group)
        await until(lambda: group not in returned.groups and not directory.exists(), "the old copy deleted")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_replica_whose_read_meets_corruption_repairs_itself(tmp_path: Path) -> None:
    # Goal: a flipped bit in a follower's closed segment (trusted at open by its catalog
    # entry) is refused to the reader (421, never bad bytes) and then repaired without a
    # restart: the group reopens with a full check, recovery cuts the log before the bad
    # frame and marks it for repair, and the leader sends the rest again.

    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("rot", 1, 3, {"segment_bytes": 4096})
        for node in nodes:
            await node.wait_for_topic("rot")
        await until(lambda: leader_of(nodes, "rot", 0) is not None, "a leader")
        values = [b"value-%03d-" % i + b"x" * 100 for i in range(80)]
        for i in range(0, len(values), 8):
            await produce_retrying(nodes[0], "rot", 0, batch(*values[i:i + 8]))
        follower = next(n for n in nodes if n is not leader_of(nodes, "rot", 0))
        group = follower.partition_group("rot", 0)
        await until(lambda: values_at(follower, "rot", 0) == values, "the follower holds every record")
        store = follower.stores[group]
        closed = [s for s in store.segments if s.closed]
        assert len(closed) >= 2, "several segments"
        target = closed[1]
        with open(target.path, "r+b") as file:  # the middle of a segment full of data frames
            file.seek(os.path.getsize(target.path) // 2)
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 0x01]))

        with pytest.raises(ClientError) as raised:
            await follower.reads.consume("rot", 0, 0, max_records=10_000, max_bytes=1 << 24)
        assert raised.value.code == "NOT_LEADER"
        await until(lambda: follower.stores.get(group) not in (None, store), "the group reopened", 30)
        assert follower.stores[group].recovery.needs_repair, "the full check found the bad frame"

        def readable() -> bool:
            with contextlib.suppress(Exception):
                return values_at(follower, "rot", 0) == values
            return False

        await until(readable, "the follower repaired from the leader", 30)
        answer = await follower.reads.consume("rot", 0, 0, max_records=10_000, max_bytes=1 << 24)
        assert sum(count for _, count, _ in answer.batches) == len(values)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_survivors_even_out_the_leadership_of_a_dead_nodes_partitions(tmp_path: Path) -> None:
    # Goal: with a node gone, the partitions it preferred to lead cannot go home; when
    # one survivor leads them all (4 of 6), a balancing round hands one to the other
    # survivor (3 and 3), and the partitions preferred by the survivors stay at home.
    # Automatic rounds are held off (a long settle period) so the explicit one is seen.
    async with running_cluster(tmp_path, leader_balance_settle_ms=600_000, leader_balance_target_live_ms=0) as nodes:
        await nodes[0].create_topic("even", 6, 3, {})
        for node in nodes:
            await node.wait_for_topic("even")
        await until(lambda: all(leader_of(nodes, "even", p) for p in range(6)), "leaders")
        partitions = nodes[0].catalog.topics["even"].partitions
        gone = nodes[2]
        await gone.stop()
        survivors, heavy = nodes[:2], nodes[0]
        orphans = [p.partition for p in partitions if p.replicas[0] == gone.id]
        assert len(orphans) == 2, "placement spread the preferred leaders 2 / 2 / 2"
        await until(lambda: all(leader_of(survivors, "even", p) for p in range(6)), "leaders again", 20)
        for p in orphans:  # both of the dead node's partitions onto one survivor
            holder = leader_of(survivors, "even", p)
            if holder is not heavy:
                holder.groups[partitions[p].group_id].request_transfer(heavy.id)
        await until(lambda: all(leader_of(survivors, "even", p) is heavy for p in orphans), "4 / 2", 20)

        def led(node: Node) -> int:
            return sum(leader_of(survivors, "even", p) is node for p in range(6))

        # One transfer evens 4 / 2 out, once the other survivor has acknowledged heavy's last
        # entries (a transfer goes only to a target caught up with the leader's log).
        rounds = []
        await until(lambda: rounds.append(heavy.balancer.balance_now(explicit=True)) or sum(rounds) > 0,
                    "a transfer started")
        assert sum(rounds) == 1, "one transfer evens 4 / 2 out"
        await until(lambda: led(heavy) == 3 and led(nodes[1]) == 3, "3 / 3", 20)
        for p in partitions:
            if p.replicas[0] != gone.id:
                assert leader_of(survivors, "even", p.partition).id == p.replicas[0], "the others stay home"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_every_replica_of_a_dead_node_moves_with_every_record(tmp_path: Path) -> None:
    # Goal: the moves of many partitions at once (one step per partition per round, on
    # every partition leader) all finish: no copy on the dead node is left in the
    # catalog or in a group, and every copy of every partition holds every record.
    async with running_four_nodes(tmp_path, replica_move_after_ms=1500) as everyone:
        nodes = everyone[:3]
        partitions = 8
        await nodes[0].create_topic("many", partitions, 3, {})
        for node in everyone:
            await node.wait_for_topic("many")
        await until(lambda: all(leader_of(everyone, "many", p) for p in range(partitions)), "leaders")
        for p in range(partitions):
            for i in range(3):
                await produce_retrying(nodes[0], "many", p, batch(b"p%d-%d" % (p, i)))
        metadata_leader = next(n for n in nodes if n.groups[0].core.role is Role.LEADER)
        victim = next(n for n in nodes if n is not metadata_leader)
        hosted = [p.partition for p in metadata_leader.catalog.topics["many"].partitions if victim.id in p.replicas]
        assert hosted, "placement gave the victim some replicas"
        await victim.stop()
        survivors = [n for n in everyone if n is not victim]

        def settled() -> bool:
            for info in metadata_leader.catalog.topics["many"].partitions:
                leader = leader_of(survivors, "many", info.partition)
                if leader is None or victim.id in info.replicas or info.leaving:
                    return False
                membership = leader.groups[info.group_id].core.membership
                if membership.voters != set(info.replicas) or membership.learners:
                    return False
            return True

        await until(settled, f"partitions {hosted} moved off node {victim.id}", 90)
        def copies_complete() -> bool:
            return all(values_at(n, "many", info.partition) == [b"p%d-%d" % (info.partition, i) for i in range(3)]
                       for info in metadata_leader.catalog.topics["many"].partitions
                       for n in survivors if n.id in info.replicas)

        await until(copies_complete, "every copy of every partition holds its records")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_an_interval_flush_reaches_the_disk_without_a_later_write(tmp_path: Path) -> None:
    # Goal: under flush interval_ms=N a write inside the interval skips its fsync; the
    # fsync then comes when the interval is up even if nothing else is written, not at
    # the next write (an idle log's last records would wait for the OS otherwise).
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("lazy", 1, 3, {"flush": "interval_ms=400"})
        for node in nodes:
            await node.wait_for_topic("lazy")
        await until(lambda: leader_of(nodes, "lazy", 0) is not None, "a leader")
        group = nodes[0].partition_group("lazy", 0)
        for value in (b"first", b"second", b"third"):  # the later ones fall inside the interval
            await produce_retrying(nodes[0], "lazy", 0, batch(value))
        assert any(n.stores[group].unsynced_bytes > 0 for n in nodes), "some write skipped its fsync"
        await until(lambda: all(n.stores[group].unsynced_bytes == 0 for n in nodes), "fsynced when due", 5)
