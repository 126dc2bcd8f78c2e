"""Preferred-leader balancing: each partition's leadership goes home to its first replica.

Placement spreads the first replica of each partition evenly over the nodes, and
a new partition's first replica campaigns first; but elections are races (a node
that applied the catalog late, or restarted, loses them), so leadership drifts
toward some nodes and their CPU and network do all the work. Kafka's answer is
the "preferred replica": the first of the assignment, restored periodically
(`auto.leader.rebalance.enable`). Ours, without a coordinator: every node looks
at the groups *it* leads and hands each one whose preferred replica is live and
in sync over to it (Raft leadership transfer: the target is caught up, then told
to campaign at once). Bounded per round so a thousand moves do not land at once.

Pure choice (`preferred_moves`) apart from the loop that acts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multiraft.metadata.catalog import NodeStatus
from raftlog.messages import Role
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node import Node

BALANCE_INTERVAL_S = 5.0
MOVES_PER_ROUND_MAX = 100


@dataclass(frozen=True, slots=True)
class Move:
    group_id: GroupId
    target: NodeId


def preferred_moves(node: Node, limit: int = MOVES_PER_ROUND_MAX) -> list[Move]:
    """Groups this node leads whose preferred replica could lead now (live, in sync)."""
    assert limit >= 0
    moves: list[Move] = []
    for group_id, machine in node.partitions.items():
        if len(moves) >= limit:
            break
        runtime = node.groups.get(group_id)
        if runtime is None or runtime.core.role is not Role.LEADER:
            continue
        topic = node.catalog.topics.get(machine.state.topic)
        if topic is None or machine.state.partition >= len(topic.partitions):
            continue  # being deleted
        preferred = NodeId(topic.partitions[machine.state.partition].replicas[0])
        if preferred == node.id or preferred not in runtime.core.membership.voters:
            continue
        info = node.catalog.nodes.get(preferred)
        if info is None or info.status is not NodeStatus.ALIVE or not node.is_live(preferred):
            continue
        if preferred not in runtime.core.in_sync_replicas():
            continue
        moves.append(Move(group_id, preferred))
    return moves


def balance_now(node: Node, limit: int = MOVES_PER_ROUND_MAX) -> int:
    """Start the transfers of one round; returns how many were started."""
    moves = preferred_moves(node, limit)
    for move in moves:
        node.groups[move.group_id].request_transfer(move.target)
    if moves:
        node.logger.info("leadership_balancing", transfers=len(moves))
    return len(moves)


async def balance_loop(node: Node, interval_s: float = BALANCE_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval_s)
        with contextlib.suppress(KeyError):  # a group closed between the choice and the move
            balance_now(node)
