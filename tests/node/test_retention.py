"""Goal: retention deletes whole old segments and moves the log start, with the
partition's state carried in the new start point: reads below the start get
OFFSET_OUT_OF_RANGE naming it, reads from it are gapless up to the high
watermark, a follower that was down while the leader's log moved on catches up
by installing the leader's snapshot (and numbers records as the leader does),
and a restarted node restores its state from the start point instead of replaying
a log it no longer has (offsets continue where they were, the producer table
still deduplicates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiraft.node.node import Node
from raftlog.errors import ClientError
from storage.batch import Record, encode_batch
from tests.node.test_node_cluster import (
    leader_of,
    produce_retrying,
    restart_all,
    running_cluster,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
CONFIG = {"segment_bytes": 4096, "retention_bytes": 8192}


def fat(tag: int, records: int = 4) -> bytes:
    return encode_batch([Record(None, b"%06d-" % tag + b"x" * 200) for _ in range(records)], first_timestamp_ms=1)


def start_of(node: Node) -> int:
    return int(node.stores[node.partition_group("ret", 0)].log_start_offset)


async def read_all(node: Node, start: int) -> list[int]:
    offsets, position = [], start
    while True:
        read = await node.reads.consume("ret", 0, position, max_records=10_000, max_bytes=1 << 24)
        for base, count, _ in read.batches:
            offsets.extend(range(max(base, position), base + count))
        if read.next_offset >= read.high_watermark:
            return offsets
        position = read.next_offset


async def test_retention_moves_the_log_start_with_the_state(tmp_path: Path) -> None:
    async with running_cluster(tmp_path, timeout_s=120) as nodes:
        await nodes[0].create_topic("ret", 1, 3, CONFIG)
        for node in nodes:
            await node.wait_for_topic("ret")
        await until(lambda: leader_of(nodes, "ret", 0) is not None, "a leader")
        leader = leader_of(nodes, "ret", 0)
        assert leader is not None
        producer_id, epoch = await leader.allocate_producer_id()
        lagging = next(n for n in nodes if n is not leader)
        await lagging.stop()  # it will come back after the leader's log start moved past it
        live = [n for n in nodes if n is not lagging]

        idempotent = encode_batch([Record(None, b"once")], first_timestamp_ms=1, producer_id=producer_id,
                                  producer_epoch=epoch, base_sequence=0)
        first = await produce_retrying(leader, "ret", 0, idempotent)
        # ~380 KB in 400 appends: more than the leader sends ahead to a silent follower (its
        # in-flight window, queued until the follower is back), many 4 KiB segments, of which
        # retention keeps ~8 KiB: the follower must install the leader's snapshot.
        for tag in range(400):
            await produce_retrying(leader, "ret", 0, fat(tag))
        await until(lambda: all(start_of(n) > 0 for n in live), "retention moved the log start", 30)

        start = start_of(leader)
        with pytest.raises(ClientError) as below:
            await leader.reads.consume("ret", 0, 0)
        assert below.value.code == "OFFSET_OUT_OF_RANGE" and str(start) in below.value.message
        high_watermark = leader.partitions[leader.partition_group("ret", 0)].state.high_watermark
        assert await read_all(leader, start) == list(range(start, high_watermark)), "gapless from the start"

        # The lagging follower returns: its log starts where the leader's state says.
        index = nodes.index(lagging)
        nodes[index] = back = Node(lagging.config)
        await back.start()
        await back.wait_for_topic("ret")
        group = back.partition_group("ret", 0)
        await until(lambda: group in back.partitions
                    and back.partitions[group].state.high_watermark == high_watermark, "the follower caught up", 30)
        assert start_of(back) > 0, "it installed the leader's snapshot"
        assert await read_all(back, start_of(back)) == list(range(start_of(back), high_watermark))

        # Restart every node: state comes from the start point; dedup and offsets continue.
        await restart_all(nodes)
        for node in nodes:
            await node.wait_for_topic("ret")
        retried = await produce_retrying(nodes[0], "ret", 0, idempotent, timeout_s=30)
        assert (retried.base_offset, retried.duplicate) == (first.base_offset, True)
        after = await produce_retrying(nodes[0], "ret", 0, fat(999))
        assert after.base_offset == high_watermark, "offsets continue where they were"
