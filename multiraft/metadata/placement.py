"""Replica placement: which nodes hold each partition of a new topic.

A pure function the controller runs before proposing `CreateTopic` (the result
travels in the command, so apply never re-derives it). Deterministic: the same
nodes, counts and `start` give the same assignment on any machine.

Greedy, one replica slot at a time, each slot taking the candidate with the
smallest key:

- the **replica count** first. Loads stay within one of each other after every
  partition (if before it all loads are m or m+1, choosing the least loaded
  distinct nodes keeps them in {m, m+1} or {m+1, m+2}), so max - min <= 1 per node;
- then, for the first slot (the preferred leader), the **leader count**, so
  preferred leaders spread too;
- then **racks already used** by this partition, so replicas of one partition
  land on distinct racks whenever balance allows (with equal-sized racks it does);
- then the position in a **rack-alternating order** rotated by `start + p`
  (Kafka's `getRackAlternatedBrokerList`), so ties break differently for each
  partition and each topic (the controller passes a different `start` per topic).

Partitions added to a topic (`existing`: the topic's current replica lists) are placed
by the same greedy pass, counting the topic's current replicas and preferred leaders
first, so the grown topic is spread as one created with the new count would be.
A drained node (`drained`: leading nothing, for a rolling restart) still takes
replicas but is the preferred leader of a new partition only when every replica
chosen for it is drained.

A node without a rack counts as a rack of its own. Balance beats rack spread when
the two conflict (say one rack holds most nodes): an unbalanced cluster fails
worse than a partition whose copies share a rack.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from multiraft.errors import InvalidPartitions, InvalidReplicationFactor
from multiraft.metadata.commands import PARTITIONS_MAX
from raftlog.types import NodeId


@dataclass(frozen=True, slots=True)
class PlacementNode:
    node_id: NodeId
    rack: str | None = None


def rack_alternating_order(nodes: Sequence[PlacementNode]) -> list[PlacementNode]:
    """Nodes sorted by id within each rack, racks interleaved: a1, b1, c1, a2, b2, ...
    Rackless nodes form one rack each (sorted by id) and come after the named racks."""
    by_rack: dict[str, list[PlacementNode]] = {}
    rackless: list[PlacementNode] = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.rack is None:
            rackless.append(node)
        else:
            by_rack.setdefault(node.rack, []).append(node)
    columns = [by_rack[rack] for rack in sorted(by_rack)] + [[node] for node in rackless]
    order: list[PlacementNode] = []
    for row in range(max((len(c) for c in columns), default=0)):
        order.extend(column[row] for column in columns if row < len(column))
    return order


def _pick(
    chosen: list[int], loads: list[int], leaders: list[int], racks: list[str], rotation: int
) -> int:
    """The position (in the rack-alternating order) that takes the next replica slot."""
    size = len(loads)

    def key(i: int) -> tuple[int, int, int, int]:
        same_rack = sum(racks[c] == racks[i] for c in chosen)
        # The leader slot wants few leaders; follower slots want many, so nodes
        # that lead little keep room to lead later partitions.
        leading = leaders[i] if not chosen else -leaders[i]
        return (loads[i], same_rack, leading, (i - rotation) % size)

    return min((i for i in range(size) if i not in chosen), key=key)


def place_replicas(
    nodes: Sequence[PlacementNode],
    partitions: int,
    replication_factor: int,
    start: int = 0,
    existing: Sequence[Sequence[NodeId]] = (),
    drained: Collection[NodeId] = frozenset(),
) -> list[list[NodeId]]:
    """Replica lists, preferred leader first, for `partitions` partitions over `nodes`.

    `nodes` are the live nodes. `existing`: replica lists (preferred leader first) already
    placed, counted as load (partitions added to a topic). `drained`: nodes that take
    no preferred leadership while another chosen replica can. Raises
    `InvalidReplicationFactor` when there are fewer live nodes than replicas,
    `InvalidPartitions` for a bad count.
    """
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise InvalidPartitions(f"partitions must be 1..{PARTITIONS_MAX}")
    if replication_factor < 1:
        raise InvalidReplicationFactor("replication factor must be at least 1")
    if replication_factor > len(nodes):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} exceeds the {len(nodes)} live nodes"
        )
    assert len({n.node_id for n in nodes}) == len(nodes), "node ids are unique"
    order = rack_alternating_order(nodes)
    racks = [n.rack if n.rack is not None else f"\0node-{n.node_id}" for n in order]
    loads = [0] * len(order)
    leaders = [0] * len(order)
    position_of = {n.node_id: i for i, n in enumerate(order)}
    for replicas in existing:
        for rank, node_id in enumerate(replicas):
            if node_id in position_of:  # a replica on a node not live now weighs nothing
                loads[position_of[node_id]] += 1
                leaders[position_of[node_id]] += rank == 0
    balanced_before = max(loads) - min(loads) <= 1
    excluded = [order[i].node_id in drained for i in range(len(order))]
    assignments: list[list[NodeId]] = []
    for p in range(partitions):
        rotation = (start + p) % len(order)
        chosen: list[int] = []
        for _ in range(replication_factor):
            position = _pick(chosen, loads, leaders, racks, rotation)
            chosen.append(position)
            loads[position] += 1
        leader = min(chosen, key=lambda i: (excluded[i], leaders[i], chosen.index(i)))
        chosen.remove(leader)
        chosen.insert(0, leader)
        leaders[leader] += 1
        assignments.append([order[i].node_id for i in chosen])
    if balanced_before:  # from loads off by more (a node added since), the gap only narrows
        assert max(loads) - min(loads) <= 1
    return assignments


def replacement_for(
    nodes: Sequence[PlacementNode], others: Sequence[NodeId], exclude: Sequence[NodeId],
    loads: dict[NodeId, int],
) -> NodeId | None:
    """The node that takes over a lost replica of a partition whose other replicas are
    on `others`: among the live `nodes` not in `exclude` (every node holding a copy),
    the one holding the fewest replicas (`loads`), then on a rack none of `others`
    uses, then the lowest id. None when every live node already holds a copy (the
    partition then stays under-replicated until a node is added or comes back)."""
    racks = {n.node_id: n.rack for n in nodes}
    used = {racks.get(k) for k in others if racks.get(k) is not None}
    candidates = [n for n in nodes if n.node_id not in exclude]
    if not candidates:
        return None
    best = min(candidates, key=lambda n: (loads.get(n.node_id, 0), n.rack is not None and n.rack in used, n.node_id))
    return best.node_id
