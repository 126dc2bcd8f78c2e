"""The cluster's feature level as a node acts on it (multiraft/metadata/features.py): what a
node says of itself, the operator's finalize, a new cluster's first level, and a node whose
build supports less than the level its cluster is finalized at.

**What a node says.** Every node answers `node.heartbeat` (the liveness call each node makes
to the controller every half second, multiraft/node/controller.py) with `{"supported": S,
"finalized": F}`: the level its build supports and the one its catalog holds. A node from
before the gate answers the same call with an empty body: read as supported 0. So asking
needs nothing new of an older node (a field added to `RegisterNode` would make it refuse
the command; a new RPC, an "unknown method" error to tell apart from others). The call's
request carries the same body (a node of this build sends its levels with its heartbeat and
with a features ask; an older one sends it empty: 0, and an older leader never read it), so
the metadata leader knows the level each node last said (`heard`, `below_level`).

**Finalizing** (`GET`/`POST /v1/admin/features`, `raftlog cluster features [finalize]`):
the node serving the request asks every registered node at once (itself locally). A node
decommissioned to the end (no copy left, out of the metadata group) is not asked: it applies
and replicates nothing, and the catalog keeps its entry forever, so asking it would block
every finalize once it is stopped. A dead node is asked: it may come back with its copies
and its vote. The level (the highest every asked node supports, unless one is named) is
proposed only when every asked node answered and supports it; else 409
FEATURE_LEVEL_UNSUPPORTED names the nodes and their levels (`finalize_target`). A node gone
for good is decommissioned first. The metadata leader never finalizes an upgraded cluster
by itself, as Kafka's controller does not: a level, once finalized, puts in group 0 what the
older build cannot read, so it is the point after which a rollback no longer works, and an
operator's step keeps that from being a surprise (docs/node.md, "Upgrading").

**A new cluster** starts at its build's level: no node of it runs an older build and there
is no earlier version to roll back to. Its first metadata leader proposes the finalize: the
one whose own first entry (its term's empty entry) is the first after the bootstrap entries,
so nothing was ever written past them, and no older cluster can pass for a new one (a new
leader holds every committed entry). Not in the bootstrap entries themselves: each initial
voter writes those on its own, byte for byte alike, so a level in them would give initial
voters of two builds different committed logs; and raftlog/ (the Raft core) knows no catalog.
It asks the initial voters first (as a finalize asks, `_first_finalize`) and proposes the
lowest level they support: none when one supports 0 (a build from before the gate) or is
still silent after FIRST_FINALIZE_ASK_S, or when it lost the leadership meanwhile; then it
logs `feature_level_first_finalize_skipped` and the operator finalizes. If that first
leader fails before its entry commits, the cluster stays at 0 and `finalize` raises it
(`raftlog cluster features` shows it).

**Below the level** (a node rolled back, or one joined with an older build): the node logs
`feature_level_unsupported` when its catalog shows it (an entry applied, a snapshot
restored), `/v1/health` says so and `?ready=cluster` answers 503, the features listing
shows it, and its reconciler stops creating and deleting replicas (`CatalogHolder.readable`):
a catalog snapshot may hold fields its build ignores (a kept prefix read as none starts a
replica unsafely, docs/mirror.md "Upgrading"), so it acts on none until it is upgraded. It
still opens the replicas it holds a log of, as any restart does (multiraft/node/replicas.py),
and they run: their logs are the same format. The metadata leader places no new replica on
it (`MetadataOps.placeable_nodes` leaves out `below_level`, as it does a decommissioning
node): one it would not create. A catalog command it cannot decode stops its metadata
replica, as before the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.errors import FeatureLevelUnsupported, InvalidRequest
from multiraft.metadata.checks import is_int
from multiraft.metadata.features import FeatureLevel, FinalizeFeatureLevel
from multiraft.node import decommission
from multiraft.node.registry import METADATA_GROUP
from multiraft.transport.rpc import RpcError
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import Index, NodeId

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime
    from multiraft.transport.rpc import Rpc

# One node's answer. The nodes are asked together: a finalize stays well inside the HTTP
# answer's 15 s (a silent node fails at once: the RPC layer's liveness, rpc.py).
FEATURES_CALL_TIMEOUT_S = 2.0
WATCH_INTERVAL_S = 0.5  # a node below the level says so within this
FIRST_LEADER_POLL_S = 0.05  # while a new cluster may still be electing its first leader
# How long a new cluster's first leader asks its initial voters their levels (they are
# started together: a quorum elected it) before it leaves the finalize to the operator.
FIRST_FINALIZE_ASK_S = 30.0
# After a finalize commits, how long its answer asks the nodes again until each that answers
# sees the new level (a node applies it within a heartbeat or so), within the HTTP bound.
FINALIZE_REREAD_S = 1.0
REREAD_PAUSE_S = 0.05
HEARTBEAT_METHOD = "node.heartbeat"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLevel:
    """One registered node, as a features listing shows it."""

    node_id: int
    status: str  # the catalog's: alive, dead, ...
    supported: int | None = None  # the level it supports (None: not asked, or no answer)
    finalized: int | None = None  # its catalog's level, as it said (None: unknown; a node from before the gate)
    decommissioned: bool = False  # not asked: holds no copy, out of the metadata group
    error: str = ""  # why it did not answer

    @property
    def answered(self) -> bool:
        return self.supported is not None

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "status": self.status, "answered": self.answered,
                "supported": self.supported, "finalized": self.finalized, "decommissioned": self.decommissioned,
                "error": self.error}


def read_answer(body: bytes) -> tuple[int, int | None]:
    """A `node.heartbeat` answer as (supported, finalized). Empty, from a node before the gate:
    (0, None). Raises ValueError on anything else that is not the shape."""
    if not body:
        return 0, None
    document = json.loads(body)
    supported, finalized = (document.get("supported"), document.get("finalized")) if isinstance(document, dict) \
        else (None, None)
    if not is_int(supported) or supported < 0 or not is_int(finalized) or finalized < 0:
        raise ValueError(f"not a feature level answer: {body[:100]!r}")
    return supported, finalized


def finalize_target(nodes: Sequence[NodeLevel], requested: int | None, finalized: int) -> int:
    """The level a finalize proposes: `requested`, or the highest every asked node supports.
    Raises FEATURE_LEVEL_UNSUPPORTED (409) naming the nodes that did not answer or support
    less, INVALID_REQUEST (400) for a level below the finalized one. Equal to `finalized`:
    nothing to change (the caller proposes nothing)."""
    asked = [n for n in nodes if not n.decommissioned]
    if not asked:
        raise FeatureLevelUnsupported("no registered node to ask (the catalog lists none yet: is the cluster starting?)")
    silent = [n for n in asked if not n.answered]
    if silent:
        raise FeatureLevelUnsupported(
            "every registered node must say which feature level it supports before the cluster's is raised; "
            f"no answer from {_named(silent)}: start it, or decommission a node gone for good")
    if requested is not None and requested < finalized:
        raise InvalidRequest(f"the cluster is finalized at feature level {finalized}; a level is only ever raised "
                             f"(asked {requested})")
    common = min(n.supported or 0 for n in asked)
    target = common if requested is None else requested
    below = [n for n in asked if (n.supported or 0) < max(target, finalized, 1)]
    if below:
        wanted = max(target, finalized, 1)
        raise FeatureLevelUnsupported(
            f"feature level {wanted} is not supported by {_named(below)}: upgrade "
            f"{'them' if len(below) > 1 else 'it'} first (the highest level every node supports is {common})")
    return max(target, finalized)


def _named(nodes: Sequence[NodeLevel]) -> str:
    return ", ".join(f"node {n.node_id} ({n.status}, " + (f"supports {n.supported})" if n.answered else
                                                          f"{n.error or 'no answer'})") for n in nodes)


def first_leader_state(runtime: GroupRuntime | None, bootstrap_entries: int) -> str:
    """Where a new cluster's first finalize stands on this node: "mine" (this node leads the
    metadata group and its own first entry directly follows the bootstrap entries: nothing
    was ever written past them), "open" (no leader's entry is committed there yet: keep
    looking) or "closed" (a committed entry is there, of another term: never again)."""
    if runtime is None:
        return "open"
    core = runtime.core
    first = Index(bootstrap_entries + 1)
    if core.log.last_index() < first:
        return "open"
    term = core.log.term_or_none(first)
    if term is None:  # compacted away: long past
        return "closed"
    if core.role is Role.LEADER and term == core.term:
        return "mine"
    return "closed" if core.log.committed >= first else "open"


class FeatureGate:
    """This node's part in the cluster's feature level (see the module docstring)."""

    def __init__(self, node_id: NodeId, registry: GroupRegistry, catalog: CatalogHolder, metadata: MetadataOps,
                 rpc: Rpc, logger: Any, initial_voters: Sequence[NodeId]) -> None:
        """`initial_voters`: the metadata group's (one bootstrap entry each, raftlog/bootstrap.py)."""
        self.id = node_id
        self.supported = catalog.supported_level
        self._registry = registry
        self._catalog = catalog
        self._metadata = metadata
        self._rpc = rpc
        self._logger = logger.bind(supported_level=self.supported)
        self._initial_voters = list(initial_voters)
        self._bootstrap_entries = len(self._initial_voters)
        self._first_done = False  # a new cluster's first finalize: proposed, or left to the operator
        self._warned_at = 0  # the finalized level last warned about (below it)
        # The level each node's last heartbeat here said it supports (this one's own, too).
        self._heard: dict[NodeId, int] = {node_id: self.supported}

    def heartbeat_answer(self) -> bytes:
        """This node's answer to `node.heartbeat`."""
        return json.dumps({"supported": self.supported, "finalized": self._catalog.catalog.feature_level},
                          separators=(",", ":")).encode()

    def heard(self, source: int, body: bytes) -> None:
        """A node heartbeat's body, which carries the caller's levels as its answer does (empty
        from a node before the gate: level 0; malformed: nothing learned)."""
        with contextlib.suppress(ValueError):
            self._heard[NodeId(source)] = read_answer(body)[0]

    def below_level(self) -> frozenset[NodeId]:
        """The nodes whose last heartbeat here (the metadata leader's, for placement) said they
        support less than the finalized level: they take no new replica."""
        finalized = self._catalog.catalog.feature_level
        return frozenset(node for node, supported in self._heard.items() if supported < finalized)

    def health(self) -> dict[str, Any]:
        finalized = self._catalog.catalog.feature_level
        return {"supported": self.supported, "finalized": finalized, "unsupported": self.supported < finalized}

    # ---- the operator's view and finalize ------------------------------------------------

    async def levels(self) -> list[NodeLevel]:
        """Every registered node, asked (but the decommissioned), in node order."""
        catalog = self._catalog.catalog
        metadata = self._registry.groups.get(METADATA_GROUP)
        membership = metadata.core.membership if metadata is not None else None
        asks: list[asyncio.Task[NodeLevel]] = []
        listed: list[NodeLevel] = []
        for node_id, info in sorted(catalog.nodes.items()):
            if decommission.progress(catalog, membership, node_id).stage is decommission.Stage.DONE:
                listed.append(NodeLevel(node_id=node_id, status=info.status.value, decommissioned=True))
            else:
                asks.append(asyncio.ensure_future(self._ask(NodeLevel(node_id=node_id, status=info.status.value))))
        listed += await asyncio.gather(*asks)
        return sorted(listed, key=lambda n: n.node_id)

    async def _ask(self, row: NodeLevel) -> NodeLevel:
        if row.node_id == self.id:
            supported, finalized = read_answer(self.heartbeat_answer())
            return NodeLevel(node_id=row.node_id, status=row.status, supported=supported, finalized=finalized)
        try:
            body = await self._rpc.call(row.node_id, HEARTBEAT_METHOD, self.heartbeat_answer(), FEATURES_CALL_TIMEOUT_S)
            supported, finalized = read_answer(body)
        except (RpcError, ValueError) as error:
            return NodeLevel(node_id=row.node_id, status=row.status, error=str(error)[:200] or type(error).__name__)
        return NodeLevel(node_id=row.node_id, status=row.status, supported=supported, finalized=finalized)

    async def report(self, nodes: list[NodeLevel] | None = None) -> dict[str, Any]:
        """`GET /v1/admin/features`: the finalized level, each node's, what this build knows."""
        nodes = nodes if nodes is not None else await self.levels()
        asked = [n for n in nodes if not n.decommissioned]
        common = min((n.supported or 0 for n in asked), default=0) if all(n.answered for n in asked) else None
        return {"finalized": self._catalog.catalog.feature_level, "supported_here": self.supported,
                "highest_common": common, "nodes": [n.to_json() for n in nodes],
                "not_answered": [n.node_id for n in asked if not n.answered],
                "levels": [{"level": int(level), "name": level.name.lower(), "description": level.description}
                           for level in FeatureLevel]}

    async def finalize(self, requested: int | None) -> dict[str, Any]:
        """`POST /v1/admin/features`: raise the finalized level once every node supports it.

        The nodes asked are those of this node's catalog synced with the metadata leader's
        first (a node registered moments ago is asked too). Asking and proposing are not one
        step: a node restarted with an older build between its answer and the commit is
        below the level from then on, flagged as a rolled-back node is (module docstring).
        The answer's nodes are asked again after the commit (`_asked_after`): what each
        says it sees is then the new level, or what it still saw at the bound."""
        if requested is not None and requested < 1:
            raise InvalidRequest("level is 1 or more")
        await self._metadata.sync_catalog()
        nodes = await self.levels()
        before = self._catalog.catalog.feature_level
        target = finalize_target(nodes, requested, before)
        if target > before:
            await self._metadata.propose(FinalizeFeatureLevel(level=target))
            await self._metadata.sync_catalog()
            self._logger.info("feature_level_finalized", level=target, previous=before)
            nodes = await self._asked_after(target)
        return {**await self.report(nodes), "previous": before}

    async def _asked_after(self, level: int) -> list[NodeLevel]:
        """The nodes asked again until each that answers sees `level`, FINALIZE_REREAD_S at most."""
        deadline = asyncio.get_running_loop().time() + FINALIZE_REREAD_S
        while True:
            nodes = await self.levels()
            if all((n.finalized or 0) >= level for n in nodes if n.answered) or (
                    asyncio.get_running_loop().time() >= deadline):
                return nodes
            await asyncio.sleep(REREAD_PAUSE_S)

    # ---- a new cluster, and a node below the level -----------------------------------------

    async def run(self) -> None:
        """Propose a new cluster's first level when this node is its first metadata leader; say
        so when the catalog is finalized above what this node supports."""
        while True:
            state = first_leader_state(self._registry.groups.get(METADATA_GROUP), self._bootstrap_entries)
            if state == "mine" and not self._first_done and self._catalog.catalog.feature_level < self.supported:
                await self._first_finalize()
            self._watch()
            await asyncio.sleep(FIRST_LEADER_POLL_S if state == "open" else WATCH_INTERVAL_S)

    async def _first_finalize(self) -> None:
        """Ask the initial voters (every `WATCH_INTERVAL_S` while one is silent, for
        `FIRST_FINALIZE_ASK_S` at most) and finalize at the lowest level they support; none
        when one supports 0 (a build from before the gate) or stays silent: the operator's."""
        deadline = asyncio.get_running_loop().time() + FIRST_FINALIZE_ASK_S
        while True:
            rows = await asyncio.gather(*(self._ask(NodeLevel(node_id=n, status="initial voter"))
                                          for n in self._initial_voters))
            level = min((n.supported or 0 for n in rows), default=0)
            if all(n.answered for n in rows) or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(WATCH_INTERVAL_S)
        self._first_done = True
        if level < 1:  # one supports 0, or did not answer (read as 0)
            self._logger.warning("feature_level_first_finalize_skipped", nodes=_named(
                [n for n in rows if (n.supported or 0) < 1]), detail="finalize once every node runs a build "
                                                                     "that supports it (docs/node.md, \"Upgrading\")")
            return
        if first_leader_state(self._registry.groups.get(METADATA_GROUP), self._bootstrap_entries) != "mine":
            return  # it lost the leadership while it asked: not its finalize any more (nor a later leader's)
        try:
            await self._metadata.propose(FinalizeFeatureLevel(level=level))
        except ClientError as error:  # a leadership lost meanwhile: the next round sees it "closed"
            self._first_done = False
            self._logger.info("feature_level_first_finalize_failed", error=error.code)
            return
        self._logger.info("feature_level_finalized", level=level, previous=0, new_cluster=True)

    def _watch(self) -> None:
        finalized = self._catalog.catalog.feature_level
        if finalized > self.supported and finalized != self._warned_at:
            self._warned_at = finalized
            self._logger.error("feature_level_unsupported", finalized_level=finalized,
                               detail="this node's build supports less than the level the cluster is finalized "
                                      "at: upgrade it; meanwhile it runs the replicas it holds, creates and deletes none, and "
                                      "takes no new one "
                                      "(docs/node.md, \"Upgrading\")")

