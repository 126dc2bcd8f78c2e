"""Decommissioning a live node of four, under a steady producer (issue 25).

Goal: `set_decommissioning` on a metadata voter that holds replicas and leads some
of them (its copies made through the move throttle) ends with the node holding no replica (its copies deleted), leading nothing,
out of the metadata group, and the learner promoted in its place (three voters
still); every partition keeps three copies on the staying nodes; every record
acknowledged before and during the moves is on every staying copy; the status walks
moving -> leaving -> done; and the cluster takes writes afterwards. Recommissioned
then, it joins the metadata group again as a learner. A decommission that would leave
a partition nowhere to go is refused up front. A copy that is no voter (a learner
catching up) refuses reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from multiraft.http.view import partition_view
from multiraft.metadata import SetClusterConfig
from multiraft.node.decommission import Stage
from multiraft.node.node import Node
from raftlog.errors import ClientError
from raftlog.messages import Membership, Role
from raftlog.types import GroupId, NodeId
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    produce_retrying,
    running_cluster,
    running_four_nodes,
    until,
    values_at,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PARTITIONS = 4


async def _produce_steadily(nodes: list[Node], acked: dict[int, list[bytes]], stop: asyncio.Event) -> None:
    """One record at a time, round robin over the partitions, through the staying nodes;
    what comes back acknowledged is recorded (a refusal is retried by produce_retrying)."""
    n = 0
    while not stop.is_set():
        partition = n % PARTITIONS
        value = b"during-%d" % n
        with contextlib.suppress(ClientError, TimeoutError):
            await produce_retrying(nodes[n % len(nodes)], "moving", partition, batch(value), timeout_s=20)
            acked[partition].append(value)
        n += 1
        await asyncio.sleep(0.02)


async def test_a_decommissioned_voter_leaves_with_nothing_lost(tmp_path: Path) -> None:
    async with running_four_nodes(tmp_path) as everyone:
        await everyone[0].create_topic("moving", PARTITIONS, 3, {})
        for node in everyone:
            await node.wait_for_topic("moving")
        await until(lambda: all(leader_of(everyone, "moving", p) for p in range(PARTITIONS)), "leaders", 30)
        leaving = everyone[1]  # node 2: a metadata voter
        assert leaving.id in everyone[0].groups[GroupId(0)].core.membership.voters
        assert sum(leaving.id in p.replicas for p in everyone[0].catalog.topics["moving"].partitions) >= 2
        acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            await produce_retrying(everyone[0], "moving", p, batch(b"before-%d" % p))
            acked[p].append(b"before-%d" % p)
        staying = [n for n in everyone if n is not leaving]
        # The copies are made through the move throttle (a rate they reach: ~2 MB/s).
        await everyone[0].propose_metadata(SetClusterConfig(key="replica_move_bytes_per_s", value=2_000_000))
        stop = asyncio.Event()
        producer = asyncio.create_task(_produce_steadily(staying, acked, stop))
        try:
            began = asyncio.get_running_loop().time()
            await everyone[2].set_decommissioning(leaving.id, True)  # asked through another node
            await until(lambda: staying[0].decommission_progress(leaving.id).stage is not None, "the mark", 10)
            stages = {staying[0].decommission_progress(leaving.id).stage}
            shown_leaving: set[int] = set()  # the partition views' `leaving` (cluster status: MOVING)

            def done() -> bool:
                stages.add(staying[0].decommission_progress(leaving.id).stage)
                for info in staying[0].catalog.topics["moving"].partitions:
                    shown_leaving.update(partition_view(staying[0].api, info)["leaving"])
                return staying[0].decommission_progress(leaving.id).stage is Stage.DONE

            await until(done, "the decommission done", 120)
            print(f"\ndecommission: done in {asyncio.get_running_loop().time() - began:.1f} s; stages "
                  f"{sorted(s.value for s in stages if s)}; {sum(map(len, acked.values()))} records acknowledged")
        finally:
            stop.set()
            await producer
        assert Stage.MOVING_REPLICAS in stages and Stage.DONE in stages, stages
        assert shown_leaving == {leaving.id}, "the moves showed in the partition views"
        assert sum(map(len, acked.values())) > PARTITIONS, "the producer got acknowledgements during the moves"
        assert sum(n.move_throttle.sent_bytes for n in everyone) > 0, "the copies went through the throttle"

        metadata = next(n for n in staying if n.groups[GroupId(0)].core.role is Role.LEADER)
        membership = metadata.groups[GroupId(0)].core.membership
        assert leaving.id not in membership.members
        assert membership.voters == {NodeId(n.id) for n in staying}, "the learner took the leaving vote"
        for info in metadata.catalog.topics["moving"].partitions:
            assert leaving.id not in info.hosts and len(info.replicas) == 3
        await until(lambda: not any(g != GroupId(0) for g in leaving.groups), "the copies closed and deleted", 30)
        assert not any((leaving.config.data_dir / "groups" / str(p.group_id)).exists()
                       for p in metadata.catalog.topics["moving"].partitions)

        for p in range(PARTITIONS):
            await produce_retrying(staying[0], "moving", p, batch(b"after-%d" % p))
            acked[p].append(b"after-%d" % p)
        for p in range(PARTITIONS):
            replicas = metadata.catalog.topics["moving"].partitions[p].replicas
            copies = [n for n in staying if n.id in replicas]

            def complete(p: int = p, copies: list[Node] = copies) -> bool:
                return all(set(acked[p]) <= set(values_at(n, "moving", p)) for n in copies)

            await until(complete, f"every acknowledged record of partition {p} on every copy", 30)
            logs = {tuple(values_at(n, "moving", p)) for n in copies}
            assert len(logs) == 1, f"partition {p}: the copies differ"

        # Recommissioned after it left: it joins the metadata group again, as a learner.
        await staying[1].set_decommissioning(leaving.id, False)

        def readmitted() -> bool:
            leader = next((n for n in staying if n.groups[GroupId(0)].core.role is Role.LEADER), None)
            return leader is not None and leaving.id in leader.groups[GroupId(0)].core.membership.learners

        await until(readmitted, "the recommissioned node back in the metadata group", 30)
        await until(lambda: leaving.decommission_progress(leaving.id).stage is None, "its own view", 30)


async def test_a_decommission_with_nowhere_to_go_is_refused(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("full", 1, 3, {})
        with pytest.raises(ClientError, match="replication factor") as refused:
            await nodes[1].set_decommissioning(nodes[2].id, True)
        assert refused.value.code == "CLUSTER_TOO_SMALL"
        assert not any(n.catalog.nodes[nodes[2].id].decommissioning for n in nodes)


async def test_a_copy_that_is_no_voter_refuses_reads(tmp_path: Path) -> None:
    # Goal: a copy catching up as a learner (after a move it starts empty, high watermark 0)
    # or one moved away answers no read, retriably, so a reader of that server never sees
    # its high watermark go back (chaos move runs: HW 3187, then 0 from the same server).
    # Made a learner here by hand: a move's learner window is too short to hit on purpose.
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic("reads", 1, 3, {})
        for node in nodes:
            await node.wait_for_topic("reads")
        await produce_retrying(nodes[0], "reads", 0, batch(b"one"))
        follower = next(n for n in nodes if n is not leader_of(nodes, "reads", 0))
        core = follower.groups[follower.partition_group("reads", 0)].core

        async def served() -> int:
            async with asyncio.timeout(10):
                while True:
                    result = await follower.reads.consume("reads", 0, 0)
                    if result.high_watermark > 0:
                        return result.high_watermark
                    await asyncio.sleep(0.05)

        assert await served() == 1
        as_voter = core.membership
        core.membership = Membership(voters=as_voter.voters - {follower.id}, learners=frozenset({follower.id}))
        try:
            with pytest.raises(ClientError) as refused:
                await follower.reads.consume("reads", 0, 0)
            assert refused.value.code == "NOT_LEADER" and refused.value.retriable
            assert "not a voter" in str(refused.value)
        finally:
            core.membership = as_voter
        assert await served() == 1
