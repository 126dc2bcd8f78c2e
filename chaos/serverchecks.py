"""End-of-run checks on the servers themselves, after every fault is healed.

- every replica of every group holds the same committed log, byte for byte: first
  every replica must catch up to the group's highest commit index (bounded), then
  SHA-256 of entries 1..that index is compared, from the debug endpoint
  `GET /v1/debug/groups/{id}/digest` (served only when RAFTLOG_CHAOS_DEBUG=1).
  Comparing only up to the *lowest* commit index, as this did first, let one
  lagging replica shorten the comparison for all of them; a replica that cannot
  catch up is now a finding of its own ("replica 3 of group 5 stuck at commit
  120 < 131");
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey

# A healed replica catches up from its leader in well under a second (a 600 s run's
# partition is ~10,000 entries); one restarted after a kill re-applies its log first.
# Half a minute is generous; a replica behind after it is reported, not waited for.
CATCH_UP_S = 30.0
CATCH_UP_POLL_S = 0.5
DIGEST_ATTEMPTS = 10  # a replica reopening its store refuses a digest for a moment
DIGEST_RETRY_S = 1.0

GroupViews = dict[int, dict[int, dict[str, Any]]]  # group -> node -> that node's view of it


class ReplicaSource(Protocol):
    def views(self) -> dict[int, list[dict[str, Any]]]:
        """Node -> its view of every group it hosts (`GET /v1/debug/groups`); a node that
        does not answer is left out. Raises `DebugOff` when the endpoints are not served."""

    def digest(self, node: int, group: int, upto: int, start: int = 1) -> str | None:
        """SHA-256 of entries start..upto on `node`, or None if it cannot give it now."""


class DebugOff(Exception):
    """The nodes run without RAFTLOG_CHAOS_DEBUG: there is nothing to compare."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckReplica:
    """A replica still below its group's highest commit index when the wait ended."""

    group: int
    node: int
    commit_index: int | None  # None: the node did not report the group at all
    target: int

    def explanation(self) -> str:
        if self.commit_index is None:
            return f"replica {self.node} of group {self.group} did not report the group (commit {self.target} elsewhere)"
        return f"replica {self.node} of group {self.group} stuck at commit {self.commit_index} < {self.target}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaComparison:
    compared: int  # groups
    # Groups whose every replica reached the highest commit index and hashes the same up to it.
    identical: int
    mismatched: list[dict[str, Any]] = field(default_factory=list)
    incomparable: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[StuckReplica] = field(default_factory=list)
    upto: dict[int, int] = field(default_factory=dict)  # group -> the commit index compared to
    error: str | None = None

    def details(self) -> dict[str, Any]:
        """For details.json and the summary line."""
        return {"compared": self.compared, "identical": self.identical, "mismatched": self.mismatched,
                "incomparable": self.incomparable, "stuck": [s.explanation() for s in self.stuck],
                "upto": self.upto, **({"error": self.error} if self.error else {})}


class DebugEndpoints:
    """`ReplicaSource` over the nodes' debug HTTP endpoints."""

    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster

    def views(self) -> dict[int, list[dict[str, Any]]]:
        found = {}
        for node in self.cluster.ids:
            try:
                found[node] = _groups(self.cluster, node)
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    raise DebugOff(f"debug endpoints: {error}") from None
            except (OSError, ValueError):
                continue  # down or not answering this time: it may next time
        return found

    def digest(self, node: int, group: int, upto: int, start: int = 1) -> str | None:
        try:
            answer = self.cluster.get_json(node, f"/v1/debug/groups/{group}/digest?upto={upto}&from={start}",
                                           timeout_s=30.0)
        except (OSError, ValueError):
            return None
        return str(answer["sha256"])  # type: ignore[index]


def _groups(cluster: ChaosCluster, node: int) -> list[dict[str, Any]]:
    answer = cluster.get_json(node, "/v1/debug/groups", timeout_s=5.0)
    return list(answer["groups"])  # type: ignore[index]


def compare_replicas(source: ReplicaSource, *, catch_up_s: float = CATCH_UP_S,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> ReplicaComparison:
    """Wait (bounded) for every replica to reach its group's highest commit index, then
    compare every group's caught-up replicas up to that index."""
    try:
        views, targets, stuck = _catch_up(source, catch_up_s, clock, sleep)
    except DebugOff as error:
        return ReplicaComparison(compared=0, identical=0, error=str(error))
    identical, mismatched, incomparable = 0, [], []
    lagging = {s.group for s in stuck}
    for group in sorted(views):
        outcome = _compare_group(source, group, views[group], targets[group], sleep)
        if outcome is None:
            identical += group not in lagging
        elif "digests" in outcome:
            mismatched.append(outcome)
        else:
            incomparable.append(outcome)
    return ReplicaComparison(compared=len(views), identical=identical, mismatched=mismatched,
                             incomparable=incomparable, stuck=stuck, upto=targets)


def _catch_up(source: ReplicaSource, catch_up_s: float, clock: Callable[[], float],
              sleep: Callable[[float], None]) -> tuple[GroupViews, dict[int, int], list[StuckReplica]]:
    """Views until no replica is behind its group's highest commit index, or the deadline.
    The target only grows: a replica answering a lower commit later (restarted, still
    re-applying) must not pull it back down."""
    deadline = clock() + catch_up_s
    targets: dict[int, int] = {}
    while True:
        views = by_group(source.views())
        for group, by_node in views.items():
            targets[group] = max(targets.get(group, 0), *(int(v["commit_index"]) for v in by_node.values()))
        stuck = stuck_replicas(views, targets)
        if not stuck or clock() >= deadline:
            return views, targets, stuck
        sleep(CATCH_UP_POLL_S)


def by_group(views: Mapping[int, list[dict[str, Any]]]) -> GroupViews:
    grouped: GroupViews = defaultdict(dict)
    for node, node_views in views.items():
        for view in node_views:
            grouped[int(view["group_id"])][node] = view
    return dict(grouped)


def stuck_replicas(views: GroupViews, targets: Mapping[int, int]) -> list[StuckReplica]:
    """Members below their group's target. The members are the voters and learners the
    most advanced replica names (one that reports nothing is behind too); a copy that
    is no longer one (a moved replica not yet deleted) need not catch up. Views without
    a membership: every node that reports the group."""
    stuck = []
    for group, by_node in sorted(views.items()):
        ahead = max(by_node.values(), key=lambda v: int(v["commit_index"]))
        named = [*ahead.get("voters", ()), *ahead.get("learners", ())]
        members = {int(n) for n in named} if named else set(by_node)
        for node in sorted(members):
            view = by_node.get(node)
            commit = int(view["commit_index"]) if view is not None else None
            if commit is None or commit < targets[group]:
                stuck.append(StuckReplica(group=group, node=node, commit_index=commit, target=targets[group]))
    return stuck


def _compare_group(source: ReplicaSource, group: int, by_node: Mapping[int, dict[str, Any]], upto: int,
                   sleep: Callable[[float], None]) -> dict[str, Any] | None:
    """None when the caught-up replicas hash the same up to `upto`; otherwise why not
    (`digests` present: they differ, or some could not answer)."""
    nodes = sorted(n for n, v in by_node.items() if int(v["commit_index"]) >= upto)
    # A log that begins at a start point (a mirror partition's, at the bootstrap's last
    # index) or was compacted holds no entry 1: compare from the first index all hold.
    start = max((int(by_node[n].get("log_start_index", 1)) for n in nodes), default=1)
    if start > upto > 0:
        return {"group": group, "reason": f"compacted below index {start}, past the commit {upto}"}
    digests: dict[int, str | None] = dict.fromkeys(nodes)
    for attempt in range(DIGEST_ATTEMPTS):
        for node in [n for n, d in digests.items() if d is None]:
            digests[node] = source.digest(node, group, upto, start)
        if all(d is not None for d in digests.values()):
            break
        if attempt + 1 < DIGEST_ATTEMPTS:
            sleep(DIGEST_RETRY_S)
    if len(set(digests.values())) <= 1 and None not in digests.values():
        return None
    shown = {n: d if d is not None else "unavailable" for n, d in digests.items()}
    return {"group": group, "from": start, "upto": upto, "digests": shown}


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
