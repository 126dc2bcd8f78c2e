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

When a partition's preferred replica cannot lead (its node is dead, or the
replica is behind), elections put its leadership wherever they happen to, and
one survivor can end up leading far more than the others. So a node that leads
more than its fair share of the partitions (the ceiling of the leaders counted
over the live nodes) also hands such partitions to in-sync followers on nodes
below that share, least loaded first: the fewest transfers that even the
leaders out, as DESIGN.md section 5 asks. Only partitions whose preferred
replica cannot lead (and is not this node) move this way, so the two rules
never undo each other; once the preferred node is back, leadership goes home.
The counts come from this node's view (its replicas' leaders, the leaders'
pings for the rest), a second old at most; concurrent moves by two nodes can
overshoot by a little, and the next round evens that out.

Pure choices (`preferred_moves`, `evening_moves`) apart from the loop that acts on them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.metadata.catalog import NodeStatus
from multiraft.transport.rpc import RPC_TIMEOUT_S, RemoteError, Rpc, RpcError, answer
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node.routing import Routing
    from multiraft.runtime.group import GroupRuntime

BALANCE_INTERVAL_S = 5.0
MOVES_PER_ROUND_MAX = 100


@dataclass(frozen=True, slots=True)
class Move:
    group_id: GroupId
    target: NodeId


def _can_lead(node: Routing, runtime: GroupRuntime, candidate: NodeId) -> bool:
    """`candidate` could take this group's leadership now: a live, in-sync voter."""
    if candidate == node.id or candidate not in runtime.core.membership.voters:
        return False
    info = node.catalog.catalog.nodes.get(candidate)
    if info is None or info.status is not NodeStatus.ALIVE or not node.is_live(candidate):
        return False
    return candidate in runtime.core.in_sync_replicas()


def preferred_moves(node: Routing, limit: int = MOVES_PER_ROUND_MAX) -> list[Move]:
    """Groups this node leads whose preferred replica could lead now (live, in sync)."""
    assert limit >= 0
    moves: list[Move] = []
    for group_id, runtime, _, info in node.led_partitions():
        if len(moves) >= limit:
            break
        if _can_lead(node, runtime, NodeId(info.replicas[0])):
            moves.append(Move(group_id, NodeId(info.replicas[0])))
    return moves


def even_out(me: NodeId, counts: dict[NodeId, int], movable: list[tuple[GroupId, list[NodeId]]],
             limit: int) -> list[Move]:
    """Transfers that bring `me` down to the fair share of leaders over the nodes in
    `counts` (leaders per live node, `me` included): each of `movable` (a group `me`
    leads, with the nodes that could take it) goes to its candidate with the fewest
    leaders, while `me` is above the share and that candidate is below it."""
    assert me in counts and limit >= 0
    counts = dict(counts)
    fair = -(-sum(counts.values()) // len(counts))  # the ceiling
    moves: list[Move] = []
    for group_id, candidates in movable:
        if counts[me] <= fair or len(moves) >= limit:
            break
        # Below the share, and the move narrows the gap (never trades one excess for another).
        below = [c for c in candidates if c in counts and counts[c] < fair and counts[c] < counts[me] - 1]
        if not below:
            continue
        target = min(below, key=lambda c: (counts[c], c))
        moves.append(Move(group_id, target))
        counts[me] -= 1
        counts[target] += 1
    return moves


def evening_moves(node: Routing, limit: int = MOVES_PER_ROUND_MAX) -> list[Move]:
    """Groups to hand over so this node leads no more than its fair share; only those
    whose preferred replica cannot lead now (the preferred rule takes the others)."""
    catalog = node.catalog.catalog
    live = {n.node_id for n in catalog.live_nodes() if n.node_id == node.id or node.is_live(n.node_id)}
    if node.id not in live or len(live) < 2:
        return []
    counts = dict.fromkeys(live, 0)
    for topic in catalog.topics.values():
        for partition in topic.partitions:
            leader = NodeId(node.leader_of(partition.group_id))
            if leader in counts:
                counts[leader] += 1
    movable = []
    for group_id, runtime, _, info in node.led_partitions():
        if info.replicas[0] == node.id or _can_lead(node, runtime, NodeId(info.replicas[0])):
            continue  # at home, or about to go home: the preferred rule's
        candidates = [NodeId(r) for r in info.replicas if _can_lead(node, runtime, NodeId(r))]
        if candidates:
            movable.append((group_id, candidates))
    return even_out(node.id, counts, movable, limit)


def balance_now(node: Routing, logger: Any, limit: int = MOVES_PER_ROUND_MAX) -> int:
    """Start the transfers of one round; returns how many were started."""
    moves = preferred_moves(node, limit)
    moves += evening_moves(node, limit - len(moves))
    for move in moves:
        node.registry.groups[move.group_id].request_transfer(move.target)
    if moves:
        logger.info("leadership_balancing", transfers=len(moves))
    return len(moves)


async def balance_loop(node: Routing, logger: Any, interval_s: float = BALANCE_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval_s)
        with contextlib.suppress(KeyError):  # a group closed between the choice and the move
            balance_now(node, logger)


async def balance_everywhere(node: Routing, rpc: Rpc, logger: Any) -> dict[int, int]:
    """One balancing round on every node now; transfers started, by node (-1: not reached)."""
    started = {int(node.id): balance_now(node, logger)}
    for peer in node.peer_ids():
        try:
            answer = await rpc.call(peer, "leaders.balance", b"", RPC_TIMEOUT_S)
            started[peer] = int(answer)
        except (RpcError, RemoteError, ValueError):
            started[peer] = -1  # not reached: reported, not fatal
    return started


def serve_balance(node: Routing, rpc: Rpc, logger: Any) -> None:
    """Answer peers' `leaders.balance` calls with a round here."""

    async def round_here() -> int:
        return balance_now(node, logger)

    async def serve(source: int, body: bytes) -> tuple[int, bytes]:
        return await answer(round_here(), lambda count: str(count).encode())

    rpc.register("leaders.balance", serve)
