"""Goal: the real `raftlog` command against real `raftlog serve` processes on
127.0.0.1-3: produce through a follower, kill -9 the partition leader and keep
producing with every acknowledged record intact, restart the whole cluster from
its directory and read the same records (one generated secret, a 0600 copy in each
node's directory, kept across the restart), a readable `cluster status`, and
`cluster up` stopping its children on Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client import Client

pytestmark = pytest.mark.integration
CLI_TIMEOUT_S = 60


def common_free_port(hosts: list[str]) -> int:
    """A port free on every one of `hosts` (nodes share ports across loopback addresses)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue
    raise AssertionError("no common free port")


def raftlog(*args: str, server: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "multiraft.cli", *args, "--server", server], input=stdin,
                          capture_output=True, timeout=CLI_TIMEOUT_S, check=False)


def _ports() -> tuple[int, int]:
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    raft = common_free_port(hosts)
    http = common_free_port(hosts)
    assert raft != http
    return raft, http


def _leader(cluster: LocalCluster, topic: str) -> int:
    deadline = time.monotonic() + 30
    with Client(cluster.http_addresses, attempts=3, backoff_s=0.05) as client:
        while time.monotonic() < deadline:
            for server in cluster.http_addresses:
                try:
                    partition = client.describe_topic(topic, server=server)["partitions"][0]
                except Exception:  # a node still starting: ask the next
                    continue
                if partition.get("role") == "leader":
                    return int(partition["leader"])
            time.sleep(0.1)
    raise AssertionError("no partition leader")


def _values(cluster: LocalCluster, server: str) -> list[str]:
    done = raftlog("consume", "events", "--from-beginning", "--wait-ms", "1000", server=server)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().split()


def _values_eventually(cluster: LocalCluster, server: str, expected: list[str]) -> None:
    deadline = time.monotonic() + 30
    while (got := _values(cluster, server)) != expected:
        assert len(got) <= len(expected) and got == expected[: len(got)], "a prefix, never other records"
        assert time.monotonic() < deadline, f"{server} holds {len(got)} of {len(expected)} records"
        time.sleep(0.2)


def _secrets_held(cluster: LocalCluster, directory: Path) -> bytes:
    """The one secret `cluster up` gave every node: a 0600 copy in each node's directory
    (0700), none in the cluster's directory."""
    held = {node.secret_file.read_bytes() for node in cluster.nodes}
    assert len(held) == 1 and len(bytes.fromhex(held.copy().pop().decode())) == 32
    assert {stat.S_IMODE(n.secret_file.stat().st_mode) for n in cluster.nodes} == {0o600}
    assert {stat.S_IMODE(n.data_dir.stat().st_mode) for n in cluster.nodes} == {0o700}
    assert not (directory / "cluster.secret").exists()
    return held.pop()


def test_produce_failover_restart_and_status(tmp_path: Path) -> None:
    raft_port, http_port = _ports()
    cluster = LocalCluster(tmp_path / "data", 3, raft_port=raft_port, http_port=http_port,
                           extra_args=("--tick-ms", "20"))
    try:
        cluster.start()
        cluster.wait_healthy(60)
        held = _secrets_held(cluster, tmp_path / "data")
        everyone = ",".join(cluster.http_addresses)
        done = raftlog("topic", "create", "events", "--partitions", "1", "--replication-factor", "3",
                       server=cluster.http_addresses[1])
        assert done.returncode == 0, done.stderr.decode()
        done = raftlog("topic", "alter", "events", "--config", "retention_ms=86400000", "--delete-config",
                       "segment_bytes", server=cluster.http_addresses[2])
        assert done.returncode == 0 and b"retention_ms=86400000" in done.stdout, done.stderr.decode()
        assert raftlog("topic", "alter", "events", server=cluster.http_addresses[2]).returncode == 2, "nothing given"
        leader = _leader(cluster, "events")
        follower = next(n for n in cluster.nodes if n.node_id != leader)
        first = "".join(f"{i}\n" for i in range(1, 201)).encode()
        done = raftlog("produce", "events", "--idempotent", server=follower.http_addr, stdin=first)
        assert done.returncode == 0, done.stderr.decode()

        cluster.kill_node(leader)  # kill -9 by PID
        survivors = ",".join(n.http_addr for n in cluster.nodes if n.node_id != leader)
        second = "".join(f"{i}\n" for i in range(201, 401)).encode()
        done = raftlog("produce", "events", "--idempotent", server=survivors, stdin=second)
        assert done.returncode == 0, done.stderr.decode()
        assert _values(cluster, survivors) == [str(i) for i in range(1, 401)], "acknowledged data intact"

        cluster.start_node(leader)  # the killed node comes back and catches up
        cluster.wait_healthy(60, nodes=[leader])
        codes = cluster.stop()
        assert all(code == 0 for node, code in codes.items() if node != leader), codes

        cluster = LocalCluster(tmp_path / "data", 3)  # a second `up`: same layout, same data
        assert (cluster.raft_port, cluster.http_port) == (raft_port, http_port)
        cluster.start()
        cluster.wait_healthy(60)
        assert _secrets_held(cluster, tmp_path / "data") == held, "a restart keeps the secret"
        assert _values(cluster, everyone) == [str(i) for i in range(1, 401)]
        for node in cluster.nodes:  # every replica serves the same records once it applied them
            _values_eventually(cluster, node.http_addr, [str(i) for i in range(1, 401)])

        done = raftlog("cluster", "status", server=everyone)
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()
        assert "NODE" in out and "STATUS" in out and "alive" in out
        assert any(line.startswith("events") and "400" in line for line in out.splitlines()), out
    finally:
        cluster.stop()


def test_cluster_up_stops_its_children_on_ctrl_c(tmp_path: Path) -> None:
    raft_port, http_port = _ports()
    command = [sys.executable, "-m", "multiraft.cli", "cluster", "up", "--nodes", "3", "--dir",
               str(tmp_path / "up"), "--raft-port", str(raft_port), "--http-port", str(http_port)]
    # Started with SIGINT ignored, as some parents (and this test run's, sometimes) leave it:
    # Ctrl-C must still stop the cluster.
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    pids: list[int] = []
    try:
        assert launcher.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = launcher.stdout.readline().decode()
            if not line:
                break
            if line.startswith("node ") and " pid " in line:
                pids.append(int(line.split(" pid ")[1].split()[0]))
            if line.startswith("ready"):
                break
        assert len(pids) == 3, launcher.stderr.read().decode() if launcher.stderr else "no output"
        done = raftlog("cluster", "status", server=f"127.0.0.2:{http_port}")
        assert done.returncode == 0 and done.stdout.decode().count("alive") == 3, done.stderr.decode()

        launcher.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launcher
        assert launcher.wait(60) == 0  # graceful stops take seconds each on a busy box
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for stream in (launcher.stdout, launcher.stderr):
            if stream is not None:
                stream.close()


def test_serve_refuses_python_O_and_names_bad_settings(tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, "-O", "-m", "multiraft.cli", "serve"], capture_output=True,
                             timeout=CLI_TIMEOUT_S, check=False)
    assert refused.returncode == 2 and b"python -O" in refused.stderr
    bad = subprocess.run([sys.executable, "-m", "multiraft.cli", "serve", "--node-id", "1", "--data-dir",
                          str(tmp_path), "--raft-addr", "nonsense", "--http-addr", "127.0.0.1:1"],
                         capture_output=True, timeout=CLI_TIMEOUT_S, check=False)
    assert bad.returncode == 2 and b"raft_addr" in bad.stderr, bad.stderr
    unreachable = raftlog("topic", "list", server=f"127.0.0.1:{common_free_port(['127.0.0.1'])}")
    assert unreachable.returncode == 3 and b"cannot reach the cluster" in unreachable.stderr
