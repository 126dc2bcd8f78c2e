"""Checkpoints at segment ends (storage/checkpoints.py): a restarted replica restores its
partition state from the newest one and replays only the entries after it.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from multiraft.node.node import Node
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    produce_retrying,
    restart_all,
    running_cluster,
    until,
    values_at,
)

TOPIC = "checkpointed"


def _holds(node: Node, values: list[bytes]) -> bool:
    with contextlib.suppress(Exception):
        return values_at(node, TOPIC, 0) == values
    return False


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_restart_starts_from_the_newest_checkpoint(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {"segment_bytes": 4096})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        values = [b"value-%04d-" % i + b"x" * 300 for i in range(150)]  # about 12 segments
        for value in values:
            await produce_retrying(nodes[0], TOPIC, 0, batch(value))
        for node in nodes:
            await until(lambda n=node: _holds(n, values), "every replica applied every record")
        group = nodes[0].partition_group(TOPIC, 0)
        last = nodes[0].stores[group].last_index()

        await restart_all(nodes)
        for node in nodes:
            await until(lambda n=node: group in n.stores, "the partition reopened", 30)
            point = node.stores[group].starts_from
            assert point is not None, "the state machine started from a checkpoint"
            assert last - 40 < point.snapshot.meta.index <= last, "a recent segment end"
        for node in nodes:
            await until(lambda n=node: _holds(n, values), "every record readable after the restart", 30)
        more = [b"after-%d" % i for i in range(5)]
        for value in more:
            await produce_retrying(nodes[1], TOPIC, 0, batch(value))
        for node in nodes:
            await until(lambda n=node: _holds(n, values + more), "and it takes writes again", 30)
