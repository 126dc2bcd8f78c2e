"""Goal: a cluster whose nodes speak only TLS (HTTPS and mutual TLS between nodes, a CA
the test makes itself) forms, replicates a produce forwarded between nodes, and admits
a fourth node that joins through the HTTPS API of the first (the joiner calls over
HTTPS, verifying the node against the cluster's peer CA); no handshake is refused.
Four real nodes in one event loop on 127.0.0.1-4."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from multiraft.http import HttpServer
from multiraft.node.config import Address, NodeConfig
from multiraft.node.node import Node
from raftlog.types import NodeId
from tests.node.test_node_cluster import (
    SECRET,
    batch,
    configs,
    free_port,
    leader_of,
    produce_retrying,
    until,
    values_at,
)
from tests.tls_pki import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _with_tls(config: NodeConfig, pki: Pki) -> NodeConfig:
    own = pki.nodes[config.raft_addr.host]
    return dataclasses.replace(config, tls_cert=own.cert, tls_key=own.key, peer_tls_ca=pki.ca.cert,
                               peer_tls_cert=own.cert, peer_tls_key=own.key)


async def test_a_tls_cluster_forms_replicates_and_admits_a_joiner_over_https(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    cfgs = [_with_tls(c, pki) for c in configs(tmp_path)]
    nodes = [Node(c) for c in cfgs]
    servers = [HttpServer(n.api, c.http_addr.host, free_port(c.http_addr.host)) for n, c in zip(nodes, cfgs, strict=True)]
    joiner: Node | None = None
    try:
        async with asyncio.timeout(90):
            for node, server in zip(nodes, servers, strict=True):
                await node.start()
                await server.start()
            assert all(s.url.startswith("https://") for s in servers)
            await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "registration over mutual TLS")

            await nodes[0].create_topic("secure", 1, 3, {})
            for node in nodes:
                await node.wait_for_topic("secure")
            await until(lambda: leader_of(nodes, "secure", 0) is not None, "a leader of secure")
            follower = next(n for n in nodes if n is not leader_of(nodes, "secure", 0))
            await produce_retrying(follower, "secure", 0, batch(b"over", b"tls"))  # forwarded to the leader
            await until(lambda: all(values_at(n, "secure", 0) == [b"over", b"tls"] for n in nodes),
                        "the batch on every replica")

            joining = pki.nodes["127.0.0.4"]
            joiner = Node(NodeConfig(
                node_id=NodeId(4), data_dir=tmp_path / "node4",
                raft_addr=Address("127.0.0.4", free_port("127.0.0.4")), http_addr=Address("127.0.0.4", 8004),
                join=Address(servers[0].host, servers[0].port), cluster_secret=SECRET, tick_ms=20,
                tls_cert=joining.cert, tls_key=joining.key, peer_tls_ca=pki.ca.cert,
                peer_tls_cert=joining.cert, peer_tls_key=joining.key))
            await joiner.start()  # returns once node 1 admitted it over HTTPS
            everyone = [*nodes, joiner]
            await until(lambda: all(len(n.catalog.nodes) == 4 for n in everyone), "4 nodes everywhere")
            for node in everyone:
                assert node.transport is not None
                stats = node.transport.stats()
                assert (stats.handshakes_refused, stats.tls_handshakes_refused) == (0, 0), node.id
    finally:
        for server in servers:
            await server.stop()
        for node in [*nodes, *([joiner] if joiner is not None else [])]:
            if node.db is not None:
                await node.stop()
