"""A replica's tictac trees, built on the loop in bounded slices, and the RPCs that serve them.

The serving half of the scrubber (multiraft/node/scrubber.py drives a verify from a
partition's leader). A peer asks for a replica's tree over an offset span: the tree
is built here from the stored batches (storage/scrub.py) a slice at a time, yielding
to the loop between slices (the store is the loop's, not thread-safe), and kept for
a short while so the peer's follow-up calls (the children of differing nodes, level
by level) are served without a second read. Only what this replica has applied (its
high watermark) is hashed: entries above it may still be overwritten.

No tree covers more than `SPAN_LEAVES_MAX` leaves (`bounded_end`): a build holds its
leaves in memory, so a partition longer than that is compared span after span, by the
scrubber as by a mirror's full sync (multiraft/node/mirror_trees.py serves the source's
side with the same bound).

RPCs (JSON bodies, digests in hex):
- `scrub.tree` {group_id, lo, hi, deep?, paced?, deadline_s?} -> {lo, hi, depth, root, damaged}: the span
  is cut to what this replica holds: `lo` raised to its log start, `hi` lowered to its high
  watermark (a replica behind answers a shorter span: "behind", not "different"), and
  to `SPAN_LEAVES_MAX` leaves from `lo`'s; `deep` reads every closed segment of the span
  instead of its tree sidecar; absent (an earlier version's leader, whose builds read
  everything) it is true, `false` takes the sidecars; `paced` (a scheduled scrub's call,
  multiraft/node/scheduled_scrubs.py) reads through this node's scrub byte rate; absent,
  or from an earlier version's leader, at full speed as before; `deadline_s`: the leader's
  timeout for the call, the build's bound here (past it: `Timeout`, and the build stops
  drawing from the rate); absent (an earlier version's leader), unbounded as before;
- `scrub.nodes` {group_id, lo, hi, level, positions} -> {digests}: from a kept tree (a
  span over the leaf bound is refused);
- `scrub.repair` {group_id} -> {started}: the repair a damaged read starts
  (`Replicas.report_damage`: a full check at reopen, a cut before a bad frame, the
  leader's refill).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from multiraft.errors import InvalidRequest, Timeout
from multiraft.node.move_throttle import BytePace
from multiraft.node.tree_sidecars import SidecarWriter
from multiraft.transport.rpc import Rpc, answer
from raftlog.errors import NotLeader
from raftlog.storage import CompactedError
from raftlog.types import GroupId
from storage.scrub import ReplicaTreeBuilder
from storage.tictac import LEAF_OFFSETS, TicTacTree, leaf_of

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

TREES_KEPT = 64  # built trees kept for follow-up calls (a few thousand 16-byte leaves each)
TREE_KEPT_S = 120.0
POSITIONS_MAX = 4096  # digests asked for in one call
# Leaves one tree covers at most: 268 M offsets (1 GiB of 100-byte records is 2,622 leaves).
# A build holds its leaves and the levels above them as 16-byte `bytes` objects: a full tree
# of distinct digests is about 5.4 MiB of Python objects (tracemalloc), so the kept trees
# are bounded too (TREES_KEPT of them), if loosely.
SPAN_LEAVES_MAX = 65_536


def bounded_end(lo: int, hi: int) -> int:
    """`hi`, lowered so that `[lo, hi)` covers at most `SPAN_LEAVES_MAX` leaves from `lo`'s
    leaf on (a span starting inside a leaf covers one offset range less than a whole one)."""
    return min(hi, (leaf_of(lo) + SPAN_LEAVES_MAX) * LEAF_OFFSETS)


@dataclass(frozen=True, slots=True)
class BuiltTree:
    """One replica's tree over a span, and what its build met."""

    tree: TicTacTree
    damaged: tuple[int, ...]  # indexes of entries whose frames failed their check
    bytes_hashed: int

    def summary(self) -> dict[str, Any]:
        return {"lo": self.tree.lo, "hi": self.tree.hi, "depth": self.tree.depth,
                "root": self.tree.root.hex(), "damaged": list(self.damaged)}


class ReplicaTrees:
    """Builds and keeps this node's replicas' trees; answers peers' scrub calls."""

    def __init__(self, registry: GroupRegistry, report_damage: Callable[[GroupId], None],
                 clock: Callable[[], float] = time.monotonic, logger: Any = None,
                 pace: BytePace | None = None,
                 read_whole: Callable[[GroupId], None] = lambda group_id: None) -> None:
        """`pace`: the node's scrub byte rate, for paced builds (scheduled scrubs; None: none);
        `read_whole`: told when a verify reads a replica's span whole (a deep build for the
        scrubber, led or served here): the scrub schedule counts it as a scrub."""
        self._registry = registry
        self._report_damage = report_damage
        self.pace = pace if pace is not None else BytePace(0)
        self.read_whole = read_whole
        self._clock = clock
        self._logger = logger or structlog.get_logger("raftlog.scrub")
        self.sidecars = SidecarWriter(self._logger)  # shared with the node's warmer; its `counts` on /metrics
        self._kept: OrderedDict[tuple[int, int, int], tuple[SegmentStore, float, BuiltTree]] = OrderedDict()
        self.bytes_hashed = 0

    def span(self, group_id: GroupId, lo: int, hi: int) -> tuple[int, int]:
        """`[lo, hi)` cut to what this replica holds and has applied, and to the leaf bound."""
        store, machine = self._registry.stores.get(group_id), self._registry.partitions.get(group_id)
        if store is None or machine is None:
            raise NotLeader(0, f"group {group_id} has no replica here")
        lo = max(lo, int(store.log_start_offset))
        hi = min(bounded_end(lo, hi), int(machine.state.high_watermark), int(store.log_end_offset))
        return lo, max(lo, hi)

    async def build(self, group_id: GroupId, lo: int, hi: int, *, fresh: bool, deep: bool = False,
                    paced: bool = False) -> BuiltTree:
        """This replica's tree over exactly `[lo, hi)` (within its span), kept for a while.
        `fresh`: build it again (each verify starts fresh; only its own follow-up calls reuse
        the tree). A fresh build reads the open segment and the span's edges, and takes the
        closed segments inside the span from their sidecars (storage/scrub.py); `deep`: reads
        every segment of the span again, sidecars or not, which is what finds rot since (a
        kept tree, or a sidecar, hides it). `paced`: each slice waits for the node's scrub
        byte rate (`pace`), shared by every paced build here."""
        assert hi <= bounded_end(lo, hi), "every caller bounds its span (SPAN_LEAVES_MAX)"
        kept = None if fresh else self.kept(group_id, lo, hi)
        if kept is not None:
            return kept
        store = self._registry.stores.get(group_id)
        if store is None:
            raise NotLeader(0, f"group {group_id} has no replica here")
        builder = ReplicaTreeBuilder(store, lo, hi, deep=deep)
        pace = self.pace if paced else None
        while True:
            if pace is not None:
                await pace.ready()  # before every slice, the first too: many small builds keep the rate
            # Checked after every wait, so no slice reads a store closed or replaced meanwhile,
            # nor entries retention (compaction_loop, on this loop) deleted meanwhile.
            if self._registry.stores.get(group_id) is not store:
                raise NotLeader(0, f"group {group_id} reopened while its tree was built; ask again")
            position = builder.next_index
            if position is not None and store.first_index() > position:
                raise NotLeader(0, f"retention passed entry {position} of group {group_id} while its tree "
                                f"was built; ask again")
            before = builder.bytes_hashed
            try:
                finished = builder.step()
            except CompactedError as error:  # the same, met inside a slice
                raise NotLeader(0, f"retention passed group {group_id}'s tree build ({error}); ask again") from None
            if pace is not None:
                pace.spent(builder.bytes_hashed - before)
            if finished:
                break
            await asyncio.sleep(0)  # a slice at a time: the loop serves the groups between
        built = BuiltTree(builder.tree(), tuple(builder.damaged), builder.bytes_hashed)
        self.bytes_hashed += builder.bytes_hashed
        counts = self.sidecars.counts
        counts.segments_from_sidecars += builder.from_sidecars
        counts.ignored += builder.ignored
        counts.mismatched += len(builder.mismatched)
        if builder.mismatched:  # bytes changed under a stamp that did not: rot (or a bug) a frame check passed
            self._logger.warning("tree_sidecar_mismatch", group_id=int(group_id), segments=builder.mismatched)
        self.sidecars.offer(store, builder.made)  # written after this answer, in the writer's task
        self._kept[(int(group_id), lo, hi)] = (store, self._clock(), built)
        while len(self._kept) > TREES_KEPT:
            self._kept.popitem(last=False)
        return built

    def kept(self, group_id: GroupId, lo: int, hi: int) -> BuiltTree | None:
        """The tree over `[lo, hi)` built here lately from the replica's current store, if kept
        (the log may have moved on since: retention, appends; the tree is of what it held)."""
        kept = self._kept.get((int(group_id), lo, hi))
        if kept is None or kept[0] is not self._registry.stores.get(group_id):
            return None
        return kept[2] if self._clock() - kept[1] < TREE_KEPT_S else None

    def report_damage(self, group_id: GroupId) -> bool:
        """Start the self-repair of this replica (a no-op when one is under way)."""
        if group_id not in self._registry.groups:
            return False
        self._report_damage(group_id)
        return True

    # -- the RPCs ----------------------------------------------------------------

    def serve(self, rpc: Rpc) -> None:
        async def tree(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._tree_call(body), _encode)

        async def nodes(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._nodes_call(body), _encode)

        async def repair(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._repair_call(body), _encode)

        rpc.register("scrub.tree", tree)
        rpc.register("scrub.nodes", nodes)
        rpc.register("scrub.repair", repair)

    async def _tree_call(self, body: bytes) -> dict[str, Any]:
        request = _request(body)
        group_id = GroupId(_int(request, "group_id"))
        lo, hi = self.span(group_id, _int(request, "lo"), _int(request, "hi"))
        # Absent from an earlier version's leader, whose verify read every segment: so does this.
        deep = request.get("deep", True) is not False
        paced = request.get("paced") is True  # a scheduled scrub's: within this node's scrub rate
        # The asking leader's own timeout for this call: past it nobody reads the answer, and a
        # paced build would go on drawing from this node's scrub rate (the RPC server cancels no
        # handler). Absent (an earlier version's leader): no bound here, as before.
        deadline_s = _deadline_s(request)
        try:
            async with asyncio.timeout(deadline_s):
                built = await self.build(group_id, lo, hi, fresh=True, deep=deep, paced=paced)
        except TimeoutError:
            raise Timeout(f"group {group_id}: the tree of [{lo}, {hi}) was not built within the "
                          f"{deadline_s} s the leader waits; ask again") from None
        if deep:
            self.read_whole(group_id)  # once read: a build cut short (reopen, retention) is no scrub
        return built.summary()

    async def _nodes_call(self, body: bytes) -> dict[str, Any]:
        request = _request(body)
        group_id = GroupId(_int(request, "group_id"))
        positions = request.get("positions")
        if not isinstance(positions, list) or len(positions) > POSITIONS_MAX or \
                not all(isinstance(p, int) and p >= 0 for p in positions):
            raise InvalidRequest(f"positions: a list of at most {POSITIONS_MAX} indexes")
        lo, hi = _int(request, "lo"), _int(request, "hi")
        if hi > bounded_end(lo, hi):
            raise InvalidRequest(f"[{lo}, {hi}) covers more than {SPAN_LEAVES_MAX} leaves")
        built = await self.build(group_id, lo, hi, fresh=False)
        level = _int(request, "level")
        if level >= built.tree.depth:
            raise InvalidRequest(f"level {level}: the tree has {built.tree.depth}")
        return {"digests": [d.hex() for d in built.tree.nodes(level, positions)]}

    async def _repair_call(self, body: bytes) -> dict[str, Any]:
        request = _request(body)
        return {"started": self.report_damage(GroupId(_int(request, "group_id")))}


def _request(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        raise InvalidRequest("a JSON object")
    return request


def _int(request: dict[str, Any], name: str) -> int:
    value = request.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"{name}: a non-negative integer")
    return value


def _deadline_s(request: dict[str, Any]) -> float | None:
    value = request.get("deadline_s")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e6:
        raise InvalidRequest("deadline_s: seconds, a positive number")
    return float(value)


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()
