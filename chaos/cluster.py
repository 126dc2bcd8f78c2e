"""The cluster under test: real `raftlog serve` processes the runner starts, kills,
pauses and restarts by PID, each remembered with an incarnation number.

An incarnation ("n2#3": node 2, third start) names a server's lifetime: a node
that restarts re-applies its log, so the high watermark it reports may go back
across incarnations but never within one (the checker's `nonmonotonic-hw` rule).
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path

from multiraft.cli.launcher import LocalCluster

RAFT_PORT = 7100
HTTP_PORT = 8080
TICK_MS = 50  # election timeout 10 ticks = 500 ms: pauses of 1-6 s outlast it
# Every node's (the source's and a mirror's sink cluster's): no scheduled scrubs (on by default,
# docs/mirror.md "Scheduled scrubs"), whose random first due times and repairs would make a run,
# a negative control above all, depend on more than its seed and its faults.
NODE_ARGS = ("--tick-ms", str(TICK_MS), "--scrub-interval-s", "0")


class ChaosCluster:
    def __init__(self, directory: Path, nodes: int, node_env: Callable[[int], dict[str, str]],
                 extra_args: tuple[str, ...] = (), first_host: int = 1, name: str = "n") -> None:
        """`extra_args`: more `raftlog serve` flags for every node (e.g. `--config FILE`);
        `first_host`: node 1's address is 127.0.0.<first_host> (a mirror's sink cluster:
        chaos/mirror.py); `name`: what labels start with (`n2#3`; the sink's `s2#1`)."""
        self.local = LocalCluster(directory, nodes, raft_port=RAFT_PORT, http_port=HTTP_PORT,
                                  extra_args=(*NODE_ARGS, *extra_args), node_env=node_env,
                                  first_host=first_host)
        self.name = name
        self.ids = [n.node_id for n in self.local.nodes]
        self.incarnation = dict.fromkeys(self.ids, 0)
        self.down: set[int] = set()
        self.paused: set[int] = set()

    # -- addresses ------------------------------------------------------------

    def host(self, node: int) -> str:
        return self.local.nodes[node - 1].host

    def http(self, node: int) -> str:
        return self.local.nodes[node - 1].http_addr

    def data_dir(self, node: int) -> Path:
        return self.local.nodes[node - 1].data_dir

    def log_file(self, node: int) -> Path:
        return self.local.nodes[node - 1].log_file

    def label(self, node: int) -> str:
        return f"{self.name}{node}#{self.incarnation[node]}"

    def serving(self) -> list[int]:
        return [n for n in self.ids if n not in self.down and n not in self.paused]

    # -- process control (by PID) -------------------------------------------

    def start_all(self, timeout_s: float = 60.0) -> None:
        self.local.directory.mkdir(parents=True, exist_ok=True)
        for node in self.ids:
            self.start(node)
        self.local.wait_healthy(timeout_s)

    def start(self, node: int) -> None:
        self.incarnation[node] += 1
        self.local.start_node(node)
        self.down.discard(node)

    def kill(self, node: int) -> None:
        if node in self.paused:
            self.resume(node)  # SIGKILL works on a stopped process; keep the books straight
        self.local.kill_node(node)
        self.down.add(node)

    def pause(self, node: int) -> None:
        if node in self.down or node in self.paused:
            return
        self.local.signal_node(node, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: int) -> None:
        if node in self.paused:
            self.local.signal_node(node, signal.SIGCONT)
            self.paused.discard(node)

    def pid(self, node: int) -> int | None:
        process = self.local.nodes[node - 1].process
        return process.pid if process is not None and process.poll() is None else None

    def exited(self) -> dict[int, int]:
        """Nodes that exited on their own (not killed by us): a crash is a finding."""
        found = {}
        for node in self.ids:
            process = self.local.nodes[node - 1].process
            if node not in self.down and process is not None and process.poll() is not None:
                found[node] = process.returncode
        return found

    def stop(self) -> None:
        for node in list(self.paused):
            self.resume(node)
        self.local.stop(grace_s=10)

    def wait_healthy(self, timeout_s: float) -> None:
        self.local.wait_healthy(timeout_s, nodes=self.serving())

    # -- views ------------------------------------------------------------------

    def get_json(self, node: int, path: str, timeout_s: float = 2.0) -> object:
        with urllib.request.urlopen(f"http://{self.http(node)}{path}", timeout=timeout_s) as answer:
            return json.loads(answer.read())

    def leader_of(self, topic: str, partition: int) -> int | None:
        for node in self.serving():
            try:
                description = self.get_json(node, f"/v1/topics/{topic}")
            except (OSError, ValueError):
                continue
            leader = description["partitions"][partition].get("leader")  # type: ignore[index]
            if leader:
                return int(leader)
        return None

    def metadata_leader(self) -> int | None:
        for node in self.serving():
            try:
                view = self.get_json(node, "/v1/cluster")
            except (OSError, ValueError):
                continue
            if view.get("metadata_leader"):  # type: ignore[union-attr]
                return int(view["metadata_leader"])  # type: ignore[index]
        return None


def copy_logs(cluster: ChaosCluster, out: Path, prefix: str = "") -> None:
    for node in cluster.ids:
        source = cluster.log_file(node)
        if source.exists():
            (out / f"{prefix}node{node}.log").write_bytes(source.read_bytes())

