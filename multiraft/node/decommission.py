"""Decommissioning a node: its replicas move away, then it leaves the metadata group
(issue 25).

An operator takes a healthy node out of the cluster with `raftlog node decommission
N` (`SetNodeDecommissioning` in the catalog; `recommission` cancels). From then on:

1. it leads nothing: every node treats it as drained (its leaderships move away,
   draining.py), so its partitions do not go leaderless when it finally stops. Not
   first: the moves below start at once, beside the drain, and each copy is made by
   whichever node leads its partition (the successor takes a move up at its next
   round, reassignment.py). Only a removal waits for the leadership: a leader never
   removes itself, it hands the group over first;
2. it takes no new replica (placement counts only `placeable_nodes`);
3. the controller names a live node in place of each of its replicas, the way it
   does for a dead node's (`ReplaceReplica`, placement's `replacement_for`: racks and
   load respected), but at most `MOVES_IN_FLIGHT_MAX` partitions of the cluster move
   at a time, so the copies (each a learner catching up, reassignment.py) do not all
   load the leaders at once. A move ends when the group removed the old copy
   (`ReplicaLeft`), and only then does the node delete it;
4. once it holds no copy, it leaves the metadata group: a learner is removed at
   once; a voter first has a caught-up learner promoted in its place when fewer
   than `METADATA_VOTERS_KEPT` voters would remain (three voters stay three; a
   cluster with fewer staying members keeps them all as voters), and is removed
   once it no longer leads the group (its drain moves that leadership). A voter
   waiting for a learner to catch up says so in its status.

Then it is decommissioned: the catalog keeps its entry (marked), readiness no longer
waits for it, and it can be stopped. Kafka (KIP-500's unregistration) and Redpanda
(`rpk redpanda admin brokers decommission`) work the same way: data first, then the
membership.

`metadata_step` and `progress` are pure; the controller (controller.py) acts.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import NodeStatus
from multiraft.node.learners import caught_up
from raftlog.messages import ConfChange, ConfChangeOp, Membership
from raftlog.types import NodeId

MOVES_IN_FLIGHT_MAX = 8  # partitions moving at once, cluster-wide, for decommissions
METADATA_VOTERS_KEPT = 3


class Stage(enum.Enum):
    MOVING_REPLICAS = "moving_replicas"
    LEAVING_METADATA = "leaving_metadata"
    DONE = "done"


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    node_id: NodeId
    decommissioning: bool
    stage: Stage | None  # None: not decommissioning
    replicas: int  # partitions the node still keeps a copy of (listed or leaving)
    metadata_member: str  # "voter", "learner" or "none"
    waiting_for: str  # why it is not done yet, for people ('' when moving on or done)


def replicas_held(catalog: Catalog, node_id: NodeId) -> int:
    return sum(node_id in p.hosts for t in catalog.topics.values() for p in t.partitions)


def moves_in_flight(catalog: Catalog) -> int:
    """Partitions with a copy still leaving (a move not finished), cluster-wide."""
    return sum(bool(p.leaving) for t in catalog.topics.values() for p in t.partitions)


def moves_allowed(catalog: Catalog) -> int:
    return max(0, MOVES_IN_FLIGHT_MAX - moves_in_flight(catalog))


def moves_waiting(catalog: Catalog, holding: Collection[NodeId], allowed: int, started: int) -> str:
    """Why a round started no move of the `holding` nodes' replicas ('' when it did, or
    when each such partition is moving already)."""
    if started or not holding:
        return ""
    unmoved = [p for t in catalog.topics.values() for p in t.partitions
               if not p.leaving and any(n in p.replicas for n in holding)]
    if not unmoved:
        return ""
    if not allowed:
        return (f"{moves_in_flight(catalog)} partitions are moving already (at most {MOVES_IN_FLIGHT_MAX} at "
                "once): the next moves wait for them")
    return (f"no live node can take the replicas of {len(unmoved)} partitions (every other live node holds a "
            "copy, or is leaving): add a node")


def _member(membership: Membership, node_id: NodeId) -> str:
    if node_id in membership.voters:
        return "voter"
    return "learner" if node_id in membership.learners else "none"


def _promotable(catalog: Catalog, membership: Membership, matches: Mapping[NodeId, int],
                commit: int) -> list[NodeId]:
    """Learners that may take a leaving voter's vote: live, staying, caught up."""
    staying = {n.node_id for n in catalog.nodes.values()
               if n.status is NodeStatus.ALIVE and not n.decommissioning}
    return sorted(n for n in membership.learners if n in staying and caught_up(matches.get(n, 0), commit))


def node_alive(catalog: Catalog, node_id: NodeId) -> bool:
    """Registered and live in the catalog (the controller's view)."""
    info = catalog.nodes.get(node_id)
    return info is not None and info.status is NodeStatus.ALIVE


def _voters_wanted(catalog: Catalog, membership: Membership) -> int:
    """Voters the metadata group keeps: three, or every staying member when fewer (a dead
    one counts: it may come back, and shrinking the group past it is not undone)."""
    staying = [n for n in membership.members if n in catalog.nodes and not catalog.nodes[n].decommissioning]
    return min(METADATA_VOTERS_KEPT, len(staying))


def metadata_step(catalog: Catalog, membership: Membership, leader: NodeId, matches: Mapping[NodeId, int],
                  commit: int, leaving: Collection[NodeId]) -> tuple[ConfChange | None, str]:
    """The metadata group's next membership change for the decommissioning nodes that
    hold no copy any more (`leaving`), taken by its leader `leader`; with the reason
    when there is none to take."""
    for node_id in sorted(leaving):
        if node_id in membership.learners:
            return ConfChange(ConfChangeOp.REMOVE, node_id), ""
        if node_id not in membership.voters:
            continue
        # Only live voters count: a dead one cannot take the leaving vote's place.
        remaining = {v for v in membership.voters - set(leaving) if node_alive(catalog, v)}
        if len(remaining) < _voters_wanted(catalog, membership):
            candidates = _promotable(catalog, membership, matches, commit)
            if candidates:
                return ConfChange(ConfChangeOp.ADD_VOTER, candidates[0]), ""
            return None, (f"node {node_id} votes in the metadata group and no live, caught-up learner can take "
                          f"its place yet ({len(remaining)} live voters would remain)")
        if node_id == leader:
            return None, f"node {node_id} still leads the metadata group (its drain moves that)"
        after = membership.voters - {node_id}
        if 2 * len({v for v in after if node_alive(catalog, v)}) <= len(after):
            return None, (f"removing node {node_id} would leave the metadata group without a live majority "
                          f"({sorted(after)} vote, not all live): waiting for its nodes")
        return ConfChange(ConfChangeOp.REMOVE, node_id), ""
    return None, ""


def progress(catalog: Catalog, membership: Membership | None, node_id: NodeId, waiting_for: str = "") -> Progress:
    """Where `node_id`'s decommission stands, from this node's catalog and its view of
    the metadata group's membership (None: not known here)."""
    info = catalog.nodes[node_id]
    held = replicas_held(catalog, node_id)
    member = _member(membership, node_id) if membership is not None else "none"
    if not info.decommissioning:
        stage = None
    elif held:
        stage = Stage.MOVING_REPLICAS
    elif member != "none":
        stage = Stage.LEAVING_METADATA
    else:
        stage = Stage.DONE
    return Progress(node_id=node_id, decommissioning=info.decommissioning, stage=stage, replicas=held,
                    metadata_member=member, waiting_for=waiting_for if stage not in (None, Stage.DONE) else "")
