"""End-of-run checks on the servers themselves, after every fault is healed.

- every replica of every group holds the same committed prefix, byte for byte
  (SHA-256 of entries 1..min(commit) over the replicas, from the debug endpoint
  `GET /v1/debug/groups/{id}/digest`, served only when RAFTLOG_CHAOS_DEBUG=1);
- at most one leader per (group, term), from the `became_leader` events in every
  node's JSON log (all incarnations; the log files are appended across restarts);
- the offset ranges each partition refused on apply (readers skip them; the
  checker must not call them holes).
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections import defaultdict
from typing import Any

from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey

SETTLE_S = 20.0  # replicas may still be applying the last commits when the run ends
DIGEST_ATTEMPTS = 10


def _groups(cluster: ChaosCluster, node: int) -> list[dict[str, Any]]:
    answer = cluster.get_json(node, "/v1/debug/groups", timeout_s=5.0)
    return list(answer["groups"])  # type: ignore[index]


def replica_digests(cluster: ChaosCluster) -> dict[str, Any]:
    """Compare every group's replicas at the lowest commit index among them."""
    try:
        return _replica_digests(cluster)
    except urllib.error.HTTPError as error:  # the nodes run without RAFTLOG_CHAOS_DEBUG
        return {"compared": 0, "identical": 0, "mismatched": [], "error": f"debug endpoints: {error}"}


def _replica_digests(cluster: ChaosCluster) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        views: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)  # group -> node -> view
        for node in cluster.ids:
            for view in _groups(cluster, node):
                views[int(view["group_id"])][node] = view
        lagging = [g for g, by_node in views.items()
                   if len({v["commit_index"] for v in by_node.values()}) > 1]
        if not lagging or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    identical, mismatched, incomparable = 0, [], []
    for group in sorted(views):
        for attempt in range(DIGEST_ATTEMPTS):
            # Fresh views each attempt: a replica still reopening or catching up may not
            # hold `upto` yet; that is "cannot compare yet", not "differs".
            by_node = views[group] if attempt == 0 else {
                node: view for node in cluster.ids for view in _groups(cluster, node) if view["group_id"] == group}
            upto = min(int(v["commit_index"]) for v in by_node.values())
            start = max(int(v.get("log_start_index", 1)) for v in by_node.values())
            digests = {}
            for node in by_node:
                try:
                    answer = cluster.get_json(node, f"/v1/debug/groups/{group}/digest?upto={upto}", timeout_s=30.0)
                    digests[node] = answer["sha256"]  # type: ignore[index]
                except urllib.error.HTTPError as error:
                    digests[node] = f"unavailable: {error.code}"
            if not any(str(d).startswith("unavailable") for d in digests.values()) or start > upto:
                break
            time.sleep(1.0)
        if start > upto:
            incomparable.append({"group": group, "reason": f"retention moved the start past {upto}"})
        elif len(set(digests.values())) == 1:
            identical += 1
        else:
            mismatched.append({"group": group, "upto": upto, "digests": digests})
    return {"compared": len(views), "identical": identical, "mismatched": mismatched, "incomparable": incomparable}


def skipped_ranges(cluster: ChaosCluster, keys: list[PartitionKey]) -> dict[PartitionKey, list[tuple[int, int]]]:
    wanted = set(keys)
    try:
        views = {node: _groups(cluster, node) for node in cluster.ids}
    except urllib.error.HTTPError:
        return {}
    found: dict[PartitionKey, set[tuple[int, int]]] = defaultdict(set)
    for node_views in views.values():
        for view in node_views:
            if view.get("topic") is None:
                continue
            key = PartitionKey(view["topic"], int(view["partition"]))
            if key in wanted:
                found[key] |= {(int(b), int(n)) for b, n in view.get("skipped_ranges", [])}
    return {key: sorted(ranges) for key, ranges in found.items()}


def leaders_per_term(cluster: ChaosCluster) -> dict[str, Any]:
    """Election safety from the logs: a (group, term) won more than once (by two nodes,
    or twice by one node: it forgot it already won, e.g. a vote that was not durable)."""
    wins: dict[tuple[int, int], list[int]] = defaultdict(list)
    for node in cluster.ids:
        path = cluster.log_file(node)
        if not path.exists():
            continue
        with open(path, "rb") as log:
            for line in log:
                if b'"became_leader"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill -9
                wins[(int(event["group_id"]), int(event["term"]))].append(node)
    violations = [{"group": g, "term": t, "won_by": nodes} for (g, t), nodes in wins.items() if len(nodes) > 1]
    return {"elections": sum(len(n) for n in wins.values()), "violations": violations}
