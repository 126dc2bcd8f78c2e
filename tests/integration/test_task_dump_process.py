"""Goal: a running `raftlog serve` answers SIGUSR1 by logging every task's await chain
and its peer links, and keeps serving (a diagnostic, never a stop)."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest

from multiraft.cli.launcher import LocalCluster

pytestmark = pytest.mark.integration

DUMP_TIMEOUT_S = 15.0


def dump_lines(cluster: LocalCluster, node_id: int) -> list[dict[str, object]]:
    lines = []
    for line in cluster.nodes[node_id - 1].log_file.read_text(errors="replace").splitlines():
        if '"task_dump' in line:
            lines.append(json.loads(line))
    return lines


def test_sigusr1_logs_the_tasks_and_the_node_keeps_serving(cluster: LocalCluster) -> None:
    before = len(dump_lines(cluster, 3))
    cluster.signal_node(3, signal.SIGUSR1)
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    while not any(line["event"] == "task_dump_end" for line in dump_lines(cluster, 3)[before:]):
        assert time.monotonic() < deadline, "no task dump in node 3's log"
        time.sleep(0.1)
    dump = dump_lines(cluster, 3)[before:]
    names = {line.get("task") for line in dump}
    assert {"transport-peer-1", "transport-peer-2"} <= names, "each peer link's task is in the dump"
    end = next(line for line in dump if line["event"] == "task_dump_end")
    assert set(end["peers"]) == {"1", "2"}  # type: ignore[arg-type]
    with urllib.request.urlopen(f"http://{cluster.nodes[2].http_addr}/v1/health", timeout=5) as answer:
        assert json.loads(answer.read())["status"] == "ok"
