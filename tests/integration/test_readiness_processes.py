"""Goal (issue 26 B): against real `raftlog serve` processes, `raftlog cluster wait`
says "not ready" (exit 1, CLUSTER_NOT_READY naming the missing node) while a node of
the initial cluster has not started, and "ready" (exit 0) once every node is live;
a replication-factor-3 topic created the moment the last node is spawned (before it
answers anything) is created, not refused with "exceeds the 2 live nodes": the
create waits for the node during start-up. An unreachable server exits 3."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client import Client
from tests.integration.test_cli import _ports, raftlog

pytestmark = pytest.mark.integration


def _answers(address: str, timeout_s: float = 30.0) -> None:
    """Wait until `address` answers plain GET /v1/health (alive, not necessarily ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}/v1/health", timeout=1) as answer:
                json.loads(answer.read())
                return
        except OSError:
            assert time.monotonic() < deadline, f"{address} never answered"
            time.sleep(0.05)


def test_cluster_wait_and_a_create_right_after_start(tmp_path: Path) -> None:
    raft_port, http_port = _ports()
    cluster = LocalCluster(tmp_path / "ready", 3, raft_port=raft_port, http_port=http_port,
                           extra_args=("--tick-ms", "20"))
    first, servers = cluster.http_addresses[0], ",".join(cluster.http_addresses)
    try:
        cluster.start_node(1)
        cluster.start_node(2)
        _answers(first)
        waited = raftlog("cluster", "wait", "--timeout", "3", server=first)
        assert waited.returncode == 1, waited.stderr.decode()
        assert "CLUSTER_NOT_READY" in waited.stderr.decode() and "3" in waited.stderr.decode()

        cluster.start_node(3)  # and at once, before node 3 answers anything:
        started = time.monotonic()
        with Client(first, attempts=1, timeout_s=30) as client:
            topic = client.create_topic("early", partitions=3, replication_factor=3)
        assert topic["replication_factor"] == 3 and all(len(p["replicas"]) == 3 for p in topic["partitions"])
        print(f"created {time.monotonic() - started:.2f} s after node 3 was spawned")

        ready = raftlog("cluster", "wait", "--timeout", "60", server=servers)
        assert ready.returncode == 0, ready.stderr.decode()
        assert "cluster ready" in ready.stdout.decode() and "1, 2, 3" in ready.stdout.decode()
    finally:
        cluster.stop(grace_s=5)
        for node in cluster.nodes:  # never leave a child behind
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait(5)

    unreachable = raftlog("cluster", "wait", "--timeout", "1", server=first)
    assert unreachable.returncode == 3, unreachable.stderr.decode()
