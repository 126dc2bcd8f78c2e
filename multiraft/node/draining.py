"""Draining a node: its leaderships leave it, for a rolling restart (issue 25).

An operator drains a node before restarting it (`raftlog node drain N`), so its
partitions change leader by a transfer each (a few milliseconds of refused
proposals) instead of an election after the stop (an election timeout of
unavailability per partition it led). The mark is a node flag in the catalog
(`SetNodeDrained`), so it outlives the restart it is for, and every node acts on
it from its own copy:

- the drained node hands each group it leads to a ready replica on another node
  (`drain_moves`): the partition's preferred replica when that is ready, else the
  ready replica on the node leading fewest partitions; the metadata group's
  leadership too, when another voter of it is ready (a one-voter metadata group
  cannot move: the drain then ends with the node leading it and nothing else);
- the other nodes' balancers count it ineligible (leadership.py `_eligible`): no
  preferred-leader transfer to it, no evening of leaders onto it, and it counts in
  no fair share;
- placement makes it no new partition's preferred leader while another chosen
  replica can be (placement.py), and a group it opens (a new partition, or a restart)
  lets the first replica not drained and live campaign first (`first_campaigner`).

A drained replica can still win an election (its timer runs out first after a
failure, or every other replica is down): the balancer then hands the group off
at its next round. Undraining clears the mark; the balancers' preferred rule then
brings each partition home to its first replica, drained node included.

Transfers go through the balancer (leadership.py): bounded in flight, to ready
targets only (live, in sync, caught up), aborted ones backed off. A drain does
not wait for the settle period (elections elsewhere): the operator asked for it,
and every target is ready; targets live without a silence for the target-live
time are preferred over those just back, which are taken only when no other is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from raftlog.messages import Role
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node.routing import Routing
    from multiraft.runtime.group import GroupRuntime

METADATA_GROUP = GroupId(0)

Ready = Callable[["GroupRuntime", NodeId], bool]  # the candidate can take the group's leadership now


def is_drained(node: Routing, node_id: NodeId) -> bool:
    info = node.catalog.catalog.nodes.get(node_id)
    return info is not None and info.leads_nothing


def first_campaigner(replicas: Sequence[NodeId], me: NodeId, drained: Collection[NodeId],
                     is_live: Callable[[int], bool]) -> NodeId:
    """Who campaigns first for a group opened new or after a restart: the first replica
    neither drained nor (seen from here) down; the first replica when there is none. Every
    replica computes this from its own catalog and liveness: views that differ only make
    a replica wait its hold out, after which the timers elect."""
    assert replicas, "a group has replicas"
    for replica in replicas:
        if replica not in drained and (replica == me or is_live(replica)):
            return replica
    return replicas[0]


def leader_counts(node: Routing, exclude: Collection[NodeId]) -> dict[NodeId, int]:
    """Partitions led per registered node outside `exclude`, from this node's view."""
    catalog = node.catalog.catalog
    counts = {n: 0 for n in catalog.nodes if n not in exclude}
    for topic in catalog.topics.values():
        for partition in topic.partitions:
            leader = NodeId(node.leader_of(partition.group_id))
            if leader in counts:
                counts[leader] += 1
    return counts


def pick_target(candidates: Sequence[NodeId], preferred: NodeId | None, counts: dict[NodeId, int],
                settled: Callable[[NodeId], bool]) -> NodeId | None:
    """Among ready `candidates`: settled ones first (a node just back may flap again), then
    the preferred replica, then the one leading fewest, then the lowest id."""
    if not candidates:
        return None
    return min(candidates, key=lambda c: (not settled(c), c != preferred, counts.get(c, 0), c))


def drain_moves(node: Routing, ready: Ready, settled: Callable[[NodeId], bool], limit: int,
                skip: Callable[[GroupId], bool]) -> list[tuple[GroupId, NodeId]]:
    """Transfers (group, target) that take this (drained) node's leaderships elsewhere:
    the metadata group's first (the controller's work should not stall behind
    partitions), then each led partition's, at most `limit`."""
    assert limit >= 0
    moves: list[tuple[GroupId, NodeId]] = []
    if limit == 0:
        return moves
    counts = leader_counts(node, node.catalog.catalog.drained_nodes())
    metadata = node.registry.groups.get(METADATA_GROUP)
    if metadata is not None and metadata.core.role is Role.LEADER and not skip(METADATA_GROUP):
        voters = sorted(NodeId(v) for v in metadata.core.membership.voters)
        target = pick_target([v for v in voters if ready(metadata, v)], None, counts, settled)
        if target is not None:
            moves.append((METADATA_GROUP, target))
    for group_id, runtime, _, info in node.led_partitions():
        if len(moves) >= limit:
            break
        if skip(group_id):
            continue
        target = pick_target([NodeId(r) for r in info.replicas if ready(runtime, NodeId(r))],
                             NodeId(info.replicas[0]), counts, settled)
        if target is not None:
            moves.append((group_id, target))
            counts[target] = counts.get(target, 0) + 1
    return moves[:limit]


def partitions_led(node: Routing, node_id: NodeId) -> int:
    """How many partitions `node_id` leads, from this node's view (a second old at most)."""
    catalog = node.catalog.catalog
    return sum(node.leader_of(p.group_id) == node_id for t in catalog.topics.values() for p in t.partitions)
