"""A local development cluster: N `raftlog serve` child processes on 127.0.0.N.

Node i listens on 127.0.0.i (Raft and HTTP on the same ports on every address,
so nothing collides) with its data under `<dir>/node<i>`; the nodes share one
generated cluster secret, a copy in each node's directory (`<dir>/node<i>/cluster.secret`,
0600, where `raftlog serve` looks when no `--cluster-secret-file` is given; the
directories are 0700). The layout is remembered in
`<dir>/cluster.json`, so a second `up` on the same directory restarts the same
cluster at the same addresses. Children run in their own sessions: Ctrl-C
reaches only the launcher, which stops each child by its PID (SIGTERM, then
SIGKILL after a grace period). PID files let a second `up` refuse to start
over nodes that are still running.

With `tls=True` (`cluster up --tls`) the launcher makes a throwaway CA
(`<dir>/tls/ca.pem`, its key 0600 beside it) and a certificate per node
(`<dir>/node<i>/tls/node.pem` and `node.key`, 0600, naming 127.0.0.i and
localhost), and starts every node with HTTPS and mutual TLS between nodes, that
one certificate for both. The layout remembers it: a later `up` on the directory
keeps TLS on, with the same certificates.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from multiraft.cli.tls_certs import CertificateError, KeyPair, make_ca, make_certificate
from multiraft.net.secret_files import (
    SECRET_FILE_NAME,
    SecretFileError,
    create_private_file,
    generate_secret,
    read_private_file,
)
from multiraft.net.tls import client_context
from storage.files import make_private_dirs

NODES_MAX = 9  # 127.0.0.1-9 and the metadata group's 1, 3 or 5 voters leave room for learners
RAFT_PORT_DEFAULT = 7100
HTTP_PORT_DEFAULT = 8080
STOP_GRACE_S = 10.0


class LauncherError(Exception):
    """The cluster cannot be started or stopped as asked; the message says why."""


@dataclass
class LocalNode:
    node_id: int
    host: str
    raft_port: int
    http_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    joins_via: str | None = None  # the HTTP address it joins through (added by `add_joiner`)

    @property
    def raft_addr(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def http_addr(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "serve.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "node.log"

    @property
    def secret_file(self) -> Path:
        return self.data_dir / SECRET_FILE_NAME

    @property
    def tls_files(self) -> KeyPair:
        """This node's certificate and key, when the cluster runs TLS."""
        return KeyPair(self.data_dir / "tls" / "node.pem", self.data_dir / "tls" / "node.key")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _child_env(extra: dict[str, str] | None = None, code_root: Path | None = None) -> dict[str, str]:
    """The children import this checkout (or `code_root`) whatever their working directory is."""
    root = str(code_root or Path(__file__).resolve().parents[2])
    env = dict(os.environ) | (extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
    return env


class LocalCluster:
    def __init__(self, directory: Path, nodes: int = 3, *, raft_port: int = RAFT_PORT_DEFAULT,
                 http_port: int = HTTP_PORT_DEFAULT, python: str = sys.executable,
                 extra_args: tuple[str, ...] = (),
                 node_env: Callable[[int], dict[str, str]] | None = None,
                 code_root: Path | None = None, tls: bool = False, first_host: int = 1) -> None:
        """`first_host`: node i listens on 127.0.0.<first_host + i - 1> (a second cluster on
        the same host, on addresses of its own: the chaos runner's mirror sink)."""
        self.directory = directory.resolve()
        layout = self._load_layout()
        if layout is not None:
            tls = tls or bool(layout.get("tls", False))
            if nodes != len(layout["nodes"]):
                raise LauncherError(f"{self.directory} holds a {len(layout['nodes'])}-node cluster; "
                                    f"use --nodes {len(layout['nodes'])} or another --dir")
            raft_port, http_port = layout["raft_port"], layout["http_port"]
            nodes = len(layout["nodes"])
        if nodes not in (1, 3, 5):
            raise LauncherError("--nodes must be 1, 3 or 5 (the metadata group's voters)")
        self.python = python
        self.extra_args = extra_args
        self.node_env = node_env  # extra environment per node id (the chaos runner's hooks)
        self.code_root = code_root  # another checkout to run the nodes from (bench/interleaved.py)
        self.raft_port = raft_port
        self.http_port = http_port
        self.tls = tls  # HTTPS and mutual TLS between nodes, with certificates made here
        self.first_host = first_host
        self.nodes = [LocalNode(i, f"127.0.0.{first_host + i - 1}", raft_port, http_port, self.directory / f"node{i}")
                      for i in range(1, nodes + 1)]

    def _load_layout(self) -> dict | None:
        path = self.directory / "cluster.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise LauncherError(f"cannot read {path}: {error}") from error

    def _save_layout(self) -> None:
        layout = {"raft_port": self.raft_port, "http_port": self.http_port, "tls": self.tls,
                  "nodes": [{"node_id": n.node_id, "raft_addr": n.raft_addr, "http_addr": n.http_addr}
                            for n in self.nodes if not n.joins_via]}
        (self.directory / "cluster.json").write_text(json.dumps(layout, indent=2) + "\n")

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{n.node_id}={n.raft_addr}" for n in self.nodes if not n.joins_via)

    def add_joiner(self) -> LocalNode:
        """Start one more node (the next id, on 127.0.0.<id>) that joins through node 1's
        HTTP address, as a learner of the metadata group (tests and benches of live
        operations). It is not written into the layout: a later `up` on this directory
        starts the initial voters only."""
        node_id = len(self.nodes) + 1
        if node_id > NODES_MAX:
            raise LauncherError(f"at most {NODES_MAX} nodes")
        node = LocalNode(node_id, f"127.0.0.{self.first_host + node_id - 1}", self.raft_port, self.http_port,
                         self.directory / f"node{node_id}", joins_via=self.nodes[0].http_addr)
        self.nodes.append(node)
        self.start_node(node_id)
        return node

    @property
    def http_addresses(self) -> list[str]:
        return [n.http_addr for n in self.nodes]

    @property
    def ca(self) -> KeyPair:
        """The throwaway CA of a TLS cluster (clients pass `ca.cert` as --ca)."""
        return KeyPair(self.directory / "tls" / "ca.pem", self.directory / "tls" / "ca.key")

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def command(self, node: LocalNode) -> list[str]:
        tls: list[str] = []
        if self.tls:
            files = node.tls_files
            tls = ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--peer-tls-ca", str(self.ca.cert),
                   "--peer-tls-cert", str(files.cert), "--peer-tls-key", str(files.key)]
        cluster = ["--join", node.joins_via] if node.joins_via else ["--initial-cluster", self.initial_cluster]
        return [self.python, "-m", "multiraft.cli", "serve", "--node-id", str(node.node_id),
                "--data-dir", str(node.data_dir), "--raft-addr", node.raft_addr, "--http-addr", node.http_addr,
                *cluster, *tls, *self.extra_args]

    def start(self) -> None:
        make_private_dirs(self.directory)
        for node in self.nodes:
            if node.pid_file.exists():
                pid = int(node.pid_file.read_text().strip() or 0)
                if pid and _alive(pid):
                    raise LauncherError(f"node {node.node_id} is still running (pid {pid}) from an earlier "
                                        f"'cluster up' on {self.directory}; stop it first (kill {pid})")
                node.pid_file.unlink()
        self._save_layout()
        for node in self.nodes:
            self.start_node(node.node_id)

    def start_node(self, node_id: int) -> None:
        node = self.nodes[node_id - 1]
        make_private_dirs(node.data_dir)
        self._provide_secret(node)
        if self.tls:
            self._provide_certificate(node)
        log_fd = os.open(node.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with open(log_fd, "ab") as log:
            node.process = subprocess.Popen(self.command(node), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            env=_child_env(self.node_env(node_id) if self.node_env else None,
                                                           self.code_root))
        node.pid_file.write_text(f"{node.process.pid}\n")

    def _provide_secret(self, node: LocalNode) -> None:
        """The cluster's secret in `node`'s directory: a copy of another node's, or a new one."""
        if node.secret_file.exists():
            return
        try:
            secret = next((read_private_file(n.secret_file, "cluster secret") for n in self.nodes
                           if n.secret_file.exists()), None) or generate_secret()
        except SecretFileError as error:
            raise LauncherError(str(error)) from error
        create_private_file(node.secret_file, secret)

    def _provide_certificate(self, node: LocalNode) -> None:
        """The cluster's CA (made once) and a certificate it signs for `node`, unless both exist."""
        try:
            if not (self.ca.cert.exists() and self.ca.key.exists()):
                make_ca(self.ca.cert.parent, f"raftlog local CA ({self.directory.name})")
            if not (node.tls_files.cert.exists() and node.tls_files.key.exists()):
                make_certificate(self.ca, node.tls_files.cert.parent, "node", [node.host, "localhost"])
        except CertificateError as error:
            raise LauncherError(f"cannot make the TLS certificates: {error}") from error

    def wait_healthy(self, timeout_s: float = 30.0, nodes: list[int] | None = None) -> None:
        """Poll each node's /v1/health until it answers and has registered."""
        deadline = time.monotonic() + timeout_s
        context: ssl.SSLContext | None = client_context(self.ca.cert) if self.tls else None
        for node in self.nodes:
            if nodes is not None and node.node_id not in nodes:
                continue
            while True:
                if node.process is not None and node.process.poll() is not None:
                    raise LauncherError(f"node {node.node_id} exited with code {node.process.returncode}; "
                                        f"see {node.log_file}")
                try:
                    with urllib.request.urlopen(f"{self.scheme}://{node.http_addr}/v1/health", timeout=1,
                                                context=context) as answer:
                        if json.loads(answer.read()).get("registered"):
                            break
                except (OSError, urllib.error.URLError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise LauncherError(f"node {node.node_id} did not become healthy within {timeout_s:.0f} s; "
                                        f"see {node.log_file}")
                time.sleep(0.1)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Poll each node's /v1/health?ready=cluster until it answers 200: a metadata leader
        known and every node of the cluster live, so a topic of any replication factor up
        to the node count can be created at once."""
        deadline = time.monotonic() + timeout_s
        context: ssl.SSLContext | None = client_context(self.ca.cert) if self.tls else None
        for node in self.nodes:
            missing = "no answer"
            while True:
                if node.process is not None and node.process.poll() is not None:
                    raise LauncherError(f"node {node.node_id} exited with code {node.process.returncode}; "
                                        f"see {node.log_file}")
                try:
                    with urllib.request.urlopen(f"{self.scheme}://{node.http_addr}/v1/health?ready=cluster",
                                                timeout=1, context=context):
                        break
                except urllib.error.HTTPError as error:
                    with contextlib.suppress(ValueError):
                        missing = json.loads(error.read()).get("message", missing)
                except (OSError, urllib.error.URLError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise LauncherError(f"node {node.node_id}: the cluster was not ready within {timeout_s:.0f} s "
                                        f"({missing}); see {node.log_file}")
                time.sleep(0.1)

    def signal_node(self, node_id: int, signum: int) -> None:
        node = self.nodes[node_id - 1]
        if node.process is not None and node.process.poll() is None:
            os.kill(node.process.pid, signum)

    def kill_node(self, node_id: int) -> None:
        """kill -9 by PID, and reap it."""
        node = self.nodes[node_id - 1]
        if node.process is not None:
            self.signal_node(node_id, signal.SIGKILL)
            node.process.wait(STOP_GRACE_S)
            node.pid_file.unlink(missing_ok=True)

    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[int, int | None]:
        """SIGTERM every child by PID, SIGKILL those still running after `grace_s`; exit codes."""
        running = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        for node in running:
            self.signal_node(node.node_id, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for node in running:
            assert node.process is not None
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal_node(node.node_id, signal.SIGKILL)
                node.process.wait(STOP_GRACE_S)
        for node in self.nodes:
            node.pid_file.unlink(missing_ok=True)
        return {n.node_id: n.process.returncode if n.process else None for n in self.nodes}
