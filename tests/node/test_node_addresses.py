"""Goal (issue 21, family 4): the cluster map heals from a bad registration.

A node registered without ever speaking (what an unsigned admission could make
before admissions were signed) ages to dead and gets no replica; a node whose
addresses were rewritten puts its own back when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiraft.metadata.commands import NodeStatus, RegisterNode
from multiraft.node.node import Node
from raftlog.types import NodeId
from tests.chaos_server.test_node_hooks import started
from tests.node.test_node_cluster import configs, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_node_never_heard_from_ages_to_dead_and_gets_no_replica(tmp_path: Path) -> None:
    async with started(configs(tmp_path), None) as nodes:
        await nodes[0].propose_metadata(RegisterNode(node_id=NodeId(9), raft_addr="127.0.0.9:1",
                                                     http_addr="127.0.0.9:2", rack=None))
        await until(lambda: getattr(nodes[1].catalog.nodes.get(NodeId(9)), "status", None) is NodeStatus.DEAD,
                    "the silent node marked dead", timeout_s=15)
        await nodes[0].create_topic("placed", 6, 3, {})
        await nodes[0].wait_for_topic("placed")
        hosts = {r for p in nodes[0].catalog.topic("placed").partitions for r in p.replicas}
        assert hosts == {1, 2, 3}


async def test_a_node_whose_addresses_were_rewritten_restores_them_when_it_starts(tmp_path: Path) -> None:
    cfgs = configs(tmp_path)
    async with started(cfgs, None) as nodes:
        await nodes[0].propose_metadata(RegisterNode(node_id=NodeId(2), raft_addr="127.0.0.9:1",
                                                     http_addr="127.0.0.9:2", rack=None))
        await until(lambda: nodes[0].catalog.nodes[NodeId(2)].raft_addr == "127.0.0.9:1", "the damage applied")
        await nodes[1].stop()
        nodes[1] = Node(cfgs[1])
        await nodes[1].start()
        want = (str(cfgs[1].raft_addr), str(cfgs[1].http_addr))
        def restored(node: Node) -> bool:
            info = node.catalog.nodes.get(NodeId(2))
            return info is not None and (info.raft_addr, info.http_addr) == want and info.status is NodeStatus.ALIVE

        await until(lambda: all(restored(n) for n in nodes), "node 2's own addresses back in every catalog",
                    timeout_s=20)
