"""The source's side of a full sync: a partition's tictac tree over the public API.

A sink verifying a mirror (multiraft/node/mirror_verify.py) compares its own tree of
a mirror partition with the source's, root first (docs/mirror.md, "Full sync"). The
source answers two reads (`read` on the topic, docs/http.md):

- `tree(lo, hi)`: the tree of one replica's stored batches over `[lo, hi)` cut to what
  that replica holds and has applied (`served_span`): its span, depth, root, and the
  replica's log start and high watermark (so the sink tells "behind" from "different");
- `nodes(lo, hi, level, positions)`: digests of that tree, from the tree the first
  call built (kept a short while, as the scrubber's are: multiraft/node/scrub_trees.py).

Trees are built from the replica on this node when it hosts one (any replica, cut to
its high watermark: a follower behind answers a shorter span); otherwise from the
partition's leader, over `mirror.tree` / `mirror.nodes`. A sink's client sticks to
one source address while it answers, so its calls meet the tree they built.

Bounds, against a costly or hostile caller: a span covers at most `SPAN_LEAVES_MAX`
leaves (scrub_trees.py; the scrubber's trees have the same bound; the answer says where
it stopped and the sink goes on from there), a call asks for at most `POSITIONS_MAX`
digests, at most `BUILDS_MAX` trees are built at once on a node (each a read of its
span's open segment and edges, and of the closed segments without a tree sidecar, on the
loop in slices: storage/scrub.py), and built trees are kept 64 at most, for 120 s.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, OffsetOutOfRange
from multiraft.node.routing import call_peer
from multiraft.node.scrub_trees import bounded_end
from multiraft.transport.rpc import Rpc, answer
from raftlog.errors import NotLeader
from raftlog.types import GroupId
from storage.tictac import ZERO, TicTacTree

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing
    from multiraft.node.scrub_trees import ReplicaTrees

POSITIONS_MAX = 256  # digests a call asks for: 16 differing nodes' children; fits a URL
LEVEL_MAX = 63
DAMAGED_SHOWN_MAX = 16
BUILDS_MAX = 4  # trees built at once on one node for full syncs
FORWARD_TIMEOUT_S = 30.0  # a forwarded first call builds its tree: a read of the whole span


def served_span(lo: int, hi: int, log_start: int, high_watermark: int) -> tuple[int, int]:
    """The span a tree asked for over `[lo, hi)` covers on a replica holding `[log_start,
    high_watermark)`: cut to it (an `hi` below `lo` is an empty span at `lo`), and to
    `SPAN_LEAVES_MAX` leaves from `lo`'s leaf. A start past the high watermark is out of range."""
    assert 0 <= log_start <= high_watermark
    if lo > high_watermark:
        raise OffsetOutOfRange(f"lo {lo} is past the high watermark {high_watermark}", log_start, high_watermark)
    lo = max(lo, log_start)
    hi = min(bounded_end(lo, max(hi, lo)), high_watermark)
    return lo, hi


def level_nodes(tree: TicTacTree, level: int, positions: list[int]) -> list[bytes]:
    """`tree.nodes`, with the levels above the root read as single parents of it (position 0
    the root, the rest zero), so any level a caller names has an answer."""
    if level < tree.depth:
        return tree.nodes(level, positions)
    return [tree.root if p == 0 else ZERO for p in positions]


def check_positions(positions: object) -> list[int]:
    if not isinstance(positions, list) or not 1 <= len(positions) <= POSITIONS_MAX or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2**63 for p in positions):
        raise InvalidRequest(f"positions: 1..{POSITIONS_MAX} node positions")
    return positions


class PartitionTrees:
    """Serves partitions' trees to sinks (the HTTP routes, and `mirror.*` calls of peers)."""

    def __init__(self, trees: ReplicaTrees, registry: GroupRegistry, catalog: CatalogHolder, routing: Routing,
                 rpc: Rpc) -> None:
        self._trees = trees
        self._registry = registry
        self._catalog = catalog
        self._routing = routing
        self._rpc = rpc
        self._builds = asyncio.Semaphore(BUILDS_MAX)
        self.trees_served = 0

    async def tree(self, topic: str, partition: int, lo: int, hi: int, deep: bool = False) -> dict[str, Any]:
        """`deep`: read every segment of the span (an earlier version forwarded to ignores it: it
        reads them all anyway); else closed segments count by their tree sidecars."""
        group_id = self._catalog.partition_group(topic, partition)
        if self._hosted(group_id):
            return await self._local_tree(group_id, lo, hi, deep)
        return await self._forward(topic, partition, group_id, "mirror.tree", {"lo": lo, "hi": hi, "deep": deep})

    async def nodes(self, topic: str, partition: int, lo: int, hi: int, level: int,
                    positions: list[int]) -> list[str]:
        check_positions(positions)
        group_id = self._catalog.partition_group(topic, partition)
        if self._hosted(group_id):
            return await self._local_nodes(group_id, lo, hi, level, positions)
        request = {"lo": lo, "hi": hi, "level": level, "positions": positions}
        return (await self._forward(topic, partition, group_id, "mirror.nodes", request))["digests"]

    def _hosted(self, group_id: GroupId) -> bool:
        return group_id in self._registry.stores and group_id in self._registry.partitions

    def _bounds(self, group_id: GroupId) -> tuple[int, int]:
        store, machine = self._registry.stores.get(group_id), self._registry.partitions.get(group_id)
        if store is None or machine is None:
            raise NotLeader(0, f"group {group_id} has no replica here")
        start = int(store.log_start_offset)
        return start, max(start, min(int(machine.state.high_watermark), int(store.log_end_offset)))

    async def _local_tree(self, group_id: GroupId, lo: int, hi: int, deep: bool) -> dict[str, Any]:
        async with self._builds:  # the bounds read after the wait: retention may have moved the start
            start, high_watermark = self._bounds(group_id)
            lo, hi = served_span(lo, hi, start, high_watermark)
            built = await self._trees.build(group_id, lo, hi, fresh=True, deep=deep)
        self.trees_served += 1
        return {"lo": lo, "hi": hi, "depth": built.tree.depth, "root": built.tree.root.hex(),
                "damaged": list(built.damaged[:DAMAGED_SHOWN_MAX]), "log_start_offset": start,
                "high_watermark": high_watermark}

    async def _local_nodes(self, group_id: GroupId, lo: int, hi: int, level: int,
                           positions: list[int]) -> list[str]:
        async with self._builds:  # kept from the tree call, or built again (another node answered it)
            start, high_watermark = self._bounds(group_id)
            if served_span(lo, hi, start, high_watermark) != (lo, hi):
                raise OffsetOutOfRange(f"[{lo}, {hi}) is not a span this replica serves (it holds [{start}, "
                                       f"{high_watermark})): ask for the tree again", start, high_watermark)
            built = await self._trees.build(group_id, lo, hi, fresh=False)
        return [d.hex() for d in level_nodes(built.tree, level, positions)]

    async def _forward(self, topic: str, partition: int, group_id: GroupId, method: str,
                       request: dict[str, Any]) -> dict[str, Any]:
        replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
        target = self._routing.forward_target(group_id, replicas)
        if target == 0 or target == self._routing.id:
            raise NotLeader(0, f"no replica of {topic}/{partition} is known to answer")
        body = json.dumps({**request, "group_id": group_id}).encode()
        return json.loads(await call_peer(self._rpc, target, method, body, FORWARD_TIMEOUT_S, write=False))

    # -- the calls of peers (a node without a replica forwards here) -------------------

    def serve(self, rpc: Rpc) -> None:
        async def tree(source: int, body: bytes) -> tuple[int, bytes]:
            async def work() -> dict[str, Any]:
                request = _request(body, ("group_id", "lo", "hi"))
                deep = request.get("deep") is True  # absent from an earlier version: the mirror's default
                return await self._local_tree(GroupId(request["group_id"]), request["lo"], request["hi"], deep)
            return await answer(work(), _encode)

        async def nodes(source: int, body: bytes) -> tuple[int, bytes]:
            async def work() -> dict[str, Any]:
                request = _request(body, ("group_id", "lo", "hi", "level"))
                positions = check_positions(request.get("positions"))
                digests = await self._local_nodes(GroupId(request["group_id"]), request["lo"], request["hi"],
                                                  request["level"], positions)
                return {"digests": digests}
            return await answer(work(), _encode)

        rpc.register("mirror.tree", tree)
        rpc.register("mirror.nodes", nodes)


def _request(body: bytes, names: tuple[str, ...]) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except ValueError:
        request = None
    if not isinstance(request, dict) or not all(
            isinstance(request.get(n), int) and not isinstance(request.get(n), bool) and request[n] >= 0
            for n in names):
        raise InvalidRequest(f"a JSON object with non-negative integers {', '.join(names)}")
    return request


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()
