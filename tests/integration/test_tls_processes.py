"""Goal: `raftlog cluster up --tls` as a user runs it: three `raftlog serve` processes
(uvloop) on 127.0.0.1-3 with a throwaway CA and certificates made in the cluster's
directory (keys 0600), serving HTTPS and speaking mutual TLS to each other. The real
`raftlog` command creates a topic, produces through one node and reads back through
another with `--ca` (or $RAFTLOG_CA): the cluster formed and replicated over mutual
TLS. Without the CA the command fails verification at once; plain HTTP is told the
node may serve HTTPS. Ctrl-C stops every child; a later `up` on the directory keeps TLS."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.client import Client
from tests.integration.test_cli import CLI_TIMEOUT_S, _ports

pytestmark = pytest.mark.integration


def _raftlog(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    environment = {k: v for k, v in os.environ.items() if k not in ("RAFTLOG_CA", "RAFTLOG_SERVER")}
    return subprocess.run([sys.executable, "-m", "multiraft.cli", *args], input=stdin, capture_output=True,
                          timeout=CLI_TIMEOUT_S, check=False, env=environment | (env or {}))


def _wait_ready(launcher: subprocess.Popen[bytes]) -> list[int]:
    """The children's PIDs, once the launcher says the cluster is ready."""
    assert launcher.stdout is not None
    pids: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = launcher.stdout.readline().decode()
        if not line:
            break
        if line.startswith("node ") and " pid " in line:
            assert "https://" in line, line
            pids.append(int(line.split(" pid ")[1].split()[0]))
        if line.startswith("ready"):
            break
    assert len(pids) == 3, launcher.stderr.read().decode() if launcher.stderr else "no output"
    return pids


def _values(server: str, ca: Path, expected: int) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        done = _raftlog("consume", "events", "--from-beginning", "--wait-ms", "500", "--server", server,
                        "--ca", str(ca))
        assert done.returncode == 0, done.stderr.decode()
        values = done.stdout.decode().split()
        if len(values) >= expected or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def test_cluster_up_tls_serves_https_and_replicates_over_mutual_tls(tmp_path: Path) -> None:
    raft_port, http_port = _ports()
    directory = tmp_path / "up"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "multiraft.cli", "cluster", "up", "--tls", "--nodes", "3", "--dir", str(directory),
         "--raft-port", str(raft_port), "--http-port", str(http_port), "--wait", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids: list[int] = []
    try:
        pids = _wait_ready(launcher)
        ca = directory / "tls" / "ca.pem"
        keys = [directory / "tls" / "ca.key", *(directory / f"node{i}" / "tls" / "node.key" for i in (1, 2, 3))]
        assert {stat.S_IMODE(key.stat().st_mode) for key in keys} == {0o600}
        node = [f"127.0.0.{i}:{http_port}" for i in (1, 2, 3)]

        done = _raftlog("topic", "create", "events", "--replication-factor", "3", "--server", node[1], "--ca", str(ca))
        assert done.returncode == 0, done.stderr.decode()
        lines = "".join(f"{i}\n" for i in range(1, 101)).encode()
        done = _raftlog("produce", "events", "--server", node[2], env={"RAFTLOG_CA": str(ca)}, stdin=lines)
        assert done.returncode == 0, done.stderr.decode()
        assert _values(node[0], ca, 100) == [str(i) for i in range(1, 101)], "replicated over mutual TLS"

        untrusting = _raftlog("topic", "list", "--server", node[0])
        assert untrusting.returncode == 3, untrusting.stderr.decode()  # plain HTTP: the node hangs up
        assert b"https://HOST:PORT or --ca" in untrusting.stderr
        untrusting = _raftlog("topic", "list", "--server", f"https://{node[0]}")
        assert untrusting.returncode == 1 and b"TLS_VERIFICATION_FAILED" in untrusting.stderr, untrusting.stderr

        with Client(node, ca_file=ca, attempts=3) as client:
            for address in node:
                _, body, _ = client.run(client.aio.request("GET", "/metrics", server=address))
                metrics = body.decode()
                assert "raftlog_transport_tls_handshakes_refused_total 0.0" in metrics, address
                assert "raftlog_transport_connections_inbound 2.0" in metrics, address

        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(60) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        again = LocalCluster(directory, 3)  # a later `up` on the directory, without --tls
        assert again.tls and "--peer-tls-ca" in again.command(again.nodes[0]), "the layout keeps TLS on"
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
