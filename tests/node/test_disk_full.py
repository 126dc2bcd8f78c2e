"""Goal: a replica whose disk fills up fails cleanly and comes back by itself.

A full disk makes the leader's append fail: its group fails (the writes it held
are answered OUTCOME_UNKNOWN, none is acknowledged), the node closes it and opens
it again from disk a moment later, as a restart would, and once there is space
again the partition takes writes and every acknowledged record is still there.
ENOSPC comes from the write-behind files double (`free_bytes`), in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiraft.node.unsafe import ChaosHooks
from raftlog.errors import ClientError, NotLeader
from storage.write_behind import WriteBehindFiles
from tests.chaos_server.test_node_hooks import started
from tests.node.test_node_cluster import (
    batch,
    configs,
    produce_retrying,
    until,
    values_at,
    written_partition,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_full_disk_fails_the_group_which_reopens_when_space_returns(tmp_path: Path) -> None:
    hooks = ChaosHooks(write_behind_files=True)
    async with started(configs(tmp_path), hooks) as nodes:
        leader = await written_partition(nodes, "full", b"before")
        files = leader.files
        assert isinstance(files, WriteBehindFiles)
        files.free_bytes = 0  # the leader's disk is full from now on

        outcomes = []
        for _ in range(3):
            try:
                await leader.produce("full", 0, batch(b"refused"))
                outcomes.append("acknowledged")
            except ClientError as error:
                outcomes.append(error.code)
        assert "acknowledged" not in outcomes, outcomes
        group = leader.partition_group("full", 0)
        await until(lambda: group not in leader.groups or leader.groups[group].failed, "the group failed")

        files.free_bytes = None  # space returns
        await until(lambda: group in leader.groups and not leader.groups[group].failed, "reopened", 20)
        answer = await produce_retrying(nodes[0], "full", 0, batch(b"after"), timeout_s=30)
        assert answer.count == 1
        for node in nodes:
            await until(lambda n=node: values_at(n, "full", 0)[-1:] == [b"after"], "every replica", 20)
            values = values_at(node, "full", 0)
            assert values[0] == b"before" and b"after" in values


async def test_a_replica_closed_for_a_reopen_refuses_reads_instead_of_forwarding(tmp_path: Path) -> None:
    # Goal: while a node's replica is closed (between a failure and its reopen), reads on
    # that node are refused (retriable), not forwarded: the replica they would go to may
    # lag what this node served, and its reader would see the high watermark go back.
    async with started(configs(tmp_path), ChaosHooks()) as nodes:
        await written_partition(nodes, "reopen", b"one")
        replicas = nodes[0].catalog.topic("reopen").partitions[0].replicas
        node = next(n for n in nodes if n.id in replicas[1:])  # reads would go to replicas[0]
        group = node.partition_group("reopen", 0)
        await until(lambda: node.partitions[group].state.high_watermark >= 1, "node 2 applied the write")
        assert (await node.reads.consume("reopen", 0, 0)).high_watermark >= 1
        await node.replicas.close_group(group, delete=False)  # what reopen_failed does first
        with pytest.raises(NotLeader):
            await node.reads.consume("reopen", 0, 0)
        node.catalog_changed()  # ... and then: the reconciler opens it again
        await until(lambda: group in node.partitions, "reopened")
