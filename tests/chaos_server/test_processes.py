"""Goal: the chaos hooks work in real `raftlog serve` processes, started as the chaos
runner starts them (environment variables through `LocalCluster(node_env=...)`), and
survive what the runner does to them: `kill -9` of every node at once.

- Write-behind files alone: the node says so (log line, /v1/health); after `kill -9` of
  all three nodes and a restart every quorum-acknowledged record is still there, the log
  holds nothing that was not sent, no replica needs repair, and replicas' committed
  prefixes are identical (debug digest). acks=leader/none records may be lost (their
  bytes were not yet fsynced everywhere): only what was never synced can go.
- Plus `RAFTLOG_UNSAFE=ack-before-fsync`: the same run loses quorum-acknowledged records,
  which is what that negative control exists to show.
- An unknown switch name refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.runtime.persistence import UNSAFE_SYNC_DELAY_S
from tests.free_ports import running
from tests.integration.conftest import call, until
from tests.integration.test_cli import common_free_port

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
STARTUP_TIMEOUT_S = 60.0
TOPIC = "durable"
QUORUM_RECORDS = 20


@contextlib.contextmanager
def processes(tmp_path: Path, env: dict[str, str]) -> Iterator[LocalCluster]:
    raft_port, http_port = common_free_port(HOSTS), common_free_port(HOSTS)
    assert raft_port != http_port
    cluster = LocalCluster(tmp_path / "data", 3, raft_port=raft_port, http_port=http_port,
                           extra_args=("--tick-ms", "20"), node_env=lambda _node: env)
    with running(cluster, STARTUP_TIMEOUT_S):
        yield cluster


def kill_all_and_restart(cluster: LocalCluster) -> None:
    for node in cluster.nodes:  # all signals first: no node outlives another by a reap
        cluster.signal_node(node.node_id, signal.SIGKILL)
    for node in cluster.nodes:
        assert node.process is not None
        node.process.wait(10)
    for node in cluster.nodes:
        cluster.start_node(node.node_id)
    cluster.wait_healthy(STARTUP_TIMEOUT_S)


async def produce(session: aiohttp.ClientSession, cluster: LocalCluster, value: str, acks: str) -> None:
    status, body = await call(session, cluster.http_addresses[0], "POST", f"/v1/topics/{TOPIC}/records",
                              json={"acks": acks, "records": [{"value": value, "partition": 0}]})
    assert status == 200 and "error_code" not in body["offsets"][0], body


async def settled_partition(session: aiohttp.ClientSession, cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every replica's debug view of the partition once a leader committed all it holds."""
    async def probe() -> list[dict[str, Any]] | None:
        views = []
        for server in cluster.http_addresses:
            status, body = await call(session, server, "GET", "/v1/debug/groups")
            assert status == 200, body
            views += [g for g in body["groups"] if g["topic"] == TOPIC]
        if len(views) != 3 or not any(v["role"] == "leader" for v in views):
            return None
        ends = {(v["commit_index"], v["applied_index"], v["last_index"]) for v in views}
        return views if len(ends) == 1 and next(iter(ends))[0] == next(iter(ends))[2] else None

    return await until(probe, "the partition settled after the restart", timeout_s=30)


async def values(session: aiohttp.ClientSession, server: str) -> list[str]:
    status, body = await call(session, server, "GET", f"/v1/topics/{TOPIC}/partitions/0/records",
                              params={"offset": 0, "max_records": 1000})
    assert status == 200, body
    assert [r["offset"] for r in body["records"]] == list(range(len(body["records"]))), "gapless"
    return [r["value"] for r in body["records"]]


async def digests_agree(session: aiohttp.ClientSession, cluster: LocalCluster, group_id: int, upto: int) -> None:
    found = set()
    for server in cluster.http_addresses:
        status, body = await call(session, server, "GET", f"/v1/debug/groups/{group_id}/digest",
                                  params={"upto": upto})
        assert status == 200 and body["committed"], body
        found.add(body["sha256"])
    assert len(found) == 1, f"group {group_id}: replicas differ at {upto}"


async def write_then_kill_all(cluster: LocalCluster, extra_acks: tuple[str, ...],
                              quiet_s: float = 0.0) -> tuple[list[str], list[str]]:
    """Quorum-acknowledged records (then others), kill -9 of every node, restart; what reads back.
    `quiet_s`: a pause between creating the topic and writing to it."""
    async with aiohttp.ClientSession() as session:
        status, body = await call(session, cluster.http_addresses[0], "POST", "/v1/topics",
                                  json={"name": TOPIC, "partitions": 1, "replication_factor": 3})
        assert status == 201, body
        await settled_partition(session, cluster)
        await asyncio.sleep(quiet_s)
        acknowledged = [f"quorum-{i}" for i in range(QUORUM_RECORDS)]
        for value in acknowledged:
            await produce(session, cluster, value, "quorum")
        for acks in extra_acks:
            for i in range(10):
                await produce(session, cluster, f"{acks}-{i}", acks)
        await asyncio.to_thread(kill_all_and_restart, cluster)
        views = await settled_partition(session, cluster)
        assert not any(v["needs_repair"] for v in views), "a clean restart: nothing to repair"
        read = [await values(session, server) for server in cluster.http_addresses]
        assert read[0] == read[1] == read[2], "every replica serves the same records"
        await digests_agree(session, cluster, views[0]["group_id"], views[0]["commit_index"])
        return acknowledged, read[0]


def test_write_behind_keeps_every_quorum_ack_through_kill_all(tmp_path: Path) -> None:
    env = {"RAFTLOG_CHAOS_FILES": "write-behind", "RAFTLOG_CHAOS_DEBUG": "1"}
    with processes(tmp_path, env) as cluster:
        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                _, health = await call(session, cluster.http_addresses[0], "GET", "/v1/health")
            assert health["chaos_files"] == "write-behind" and "unsafe" not in health
            acknowledged, survived = await write_then_kill_all(cluster, ("leader", "none"))
            assert survived[:QUORUM_RECORDS] == acknowledged, "every quorum ack survives, in order"
            sent_after = [f"{acks}-{i}" for acks in ("leader", "none") for i in range(10)]
            rest = survived[QUORUM_RECORDS:]
            assert rest == [v for v in sent_after if v in rest], "only sent records, in order"

        asyncio.run(run())
        log = cluster.nodes[0].log_file.read_text()
        assert log.count('"chaos_write_behind_files"') == 2, "one warning line per start"
        assert "unsafe_switches_enabled" not in log


def test_ack_before_fsync_loses_quorum_acks_through_kill_all(tmp_path: Path) -> None:
    env = {"RAFTLOG_CHAOS_FILES": "write-behind", "RAFTLOG_CHAOS_DEBUG": "1", "RAFTLOG_UNSAFE": "ack-before-fsync"}
    with processes(tmp_path, env) as cluster:
        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                _, health = await call(session, cluster.http_addresses[0], "GET", "/v1/health")
            assert health["unsafe"] == ["ack-before-fsync"]
            # The topic's creation must outlive the kill: wait for the deferred sync of the
            # metadata group (acknowledged, it could be lost too). Then write and kill at once.
            acknowledged, survived = await write_then_kill_all(cluster, (), quiet_s=UNSAFE_SYNC_DELAY_S + 1)
            assert survived == acknowledged[: len(survived)], "a prefix, never other records"
            assert len(survived) < len(acknowledged), "acknowledged records were lost"

        asyncio.run(run())
        assert '"unsafe_switches_enabled"' in cluster.nodes[0].log_file.read_text()


def test_unknown_unsafe_switch_refuses_to_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "multiraft.cli", "serve", "--node-id", "1", "--data-dir", str(tmp_path / "n1"),
               "--raft-addr", "127.0.0.1:1", "--http-addr", "127.0.0.1:2", "--initial-cluster", "1=127.0.0.1:1"]
    env = {**os.environ, "RAFTLOG_UNSAFE": "no-dedup,skip-crcs"}
    done = subprocess.run(command, env=env, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"RAFTLOG_UNSAFE: unknown switches ['skip-crcs']" in done.stderr
