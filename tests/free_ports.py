"""Fixed-port test clusters of real processes: ports checked first (a clash says what
it is), children stopped by PID on the way out."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from multiraft.cli.launcher import LocalCluster


def require_free_ports(hosts: Iterable[str], ports: Iterable[int], who: str) -> None:
    """Fail the test (not error deep in a server's log) when a port it needs is taken."""
    wanted = list(ports)
    for host in hosts:
        for port in wanted:
            with socket.socket() as probe:
                # as the servers bind (asyncio sets SO_REUSEADDR): TIME_WAIT from a previous run is no clash
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, port))
                except OSError as error:
                    pytest.fail(f"{host}:{port} is taken ({error}); {who} need it")


@contextlib.contextmanager
def process_cluster(directory: Path, hosts: list[str], raft_port: int, http_port: int, who: str,
                    startup_s: float = 30.0) -> Iterator[LocalCluster]:
    """A 3-process cluster on fixed ports (tick 20 ms), stopped by PID whatever happens."""
    require_free_ports(hosts, (raft_port, http_port), who)
    local = LocalCluster(directory, len(hosts), raft_port=raft_port, http_port=http_port,
                         extra_args=("--tick-ms", "20"))
    with running(local, startup_s):
        yield local


@contextlib.contextmanager
def running(cluster: LocalCluster, startup_s: float) -> Iterator[LocalCluster]:
    """Start `cluster` and wait until it is healthy; on the way out stop it, and kill by
    PID any child still running."""
    try:
        cluster.start()
        cluster.wait_healthy(startup_s)
        yield cluster
    finally:
        cluster.stop(grace_s=5)
        for node in cluster.nodes:  # never leave a child behind
            if node.process is not None and node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.process.pid, signal.SIGKILL)
                node.process.wait(5)
