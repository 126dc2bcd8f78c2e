"""Goal: the browser policy's allowed origins and host names (multiraft/http/browsers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multiraft.http.browsers import BrowserPolicy
from multiraft.node.config import Address, NodeConfig


def _config(tmp_path: Path, **settings: Any) -> NodeConfig:
    return NodeConfig(node_id=1, data_dir=tmp_path, raft_addr=Address("127.0.0.1", 1),
                      http_addr=Address("node1.internal", 8080), initial_cluster={1: Address("127.0.0.1", 1)},
                      cluster_secret=b"0123456789abcdef" * 4, **settings)


def test_allowed_origins_and_host_names_come_from_the_config(tmp_path: Path) -> None:
    policy = BrowserPolicy.of(_config(tmp_path, http_allowed_origins=("https://console.example/",),
                                      http_host_names=("raftlog.lan",)))
    assert policy.origin_allowed("https://console.example", "http", "node1.internal:8080")
    assert not policy.origin_allowed("https://console.example.evil", "http", "node1.internal:8080")
    assert policy.origin_allowed("http://node1.internal:8080", "http", "node1.internal:8080")
    for host in ("node1.internal:8080", "RAFTLOG.LAN", "raftlog.lan:1", "10.0.0.7:8080", "[fe80::1]:80"):
        assert policy.host_allowed(host), host
    for host in ("evil.example", "node1.internal.evil.example", "lan"):
        assert not policy.host_allowed(host), host
