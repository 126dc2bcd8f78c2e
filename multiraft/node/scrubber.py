"""The in-cluster scrubber: a partition's replicas compared by tictac trees (issue 24, phase 1).

A verify of one partition runs on its leader. It names the span once, at the start:
from the leader's log start to its high watermark, and walks it in spans of at most
`SPAN_LEAVES_MAX` leaves (a tree's leaves are held in memory: a huge partition must
not build one unbounded tree, here or on a follower). For each span the leader builds
its tree, each follower builds its own over the span cut to what it has applied
(multiraft/node/scrub_trees.py), and the two are compared root first
(storage/tictac.py `Descent`), the follower sending only the children of nodes that
differ. Identical replicas cost one root a span. A follower that answered a shorter
span is `behind` (compared over what it holds), and `different` when a leaf of that
prefix differs; either ends its walk (a repair is of the whole replica), while the
leader reads on to the end of the span, so its own damage anywhere is found first.

Spans follow awaits (the followers' calls, the builds' slices), and the leader's log
moves meanwhile: each span is cut to what the leader holds when it starts (retention
may have moved the log start past it; the walk ends when nothing is left), a follower
whose answered span the leader no longer holds is asked again from the new start, and
a verify whose leader stopped leading or reopened its replica answers `NotLeader`.

What each build reads (storage/scrub.py): a verify is **deep** by default (finding rot
between replicas is what it is for): the leader and every follower read every segment
of the span again, and a sidecar that disagrees with its segment's bytes is rewritten.
A **fast** one (`"deep": false`, `raftlog cluster verify --fast`) reads the open segment
and the span's edges and counts each closed segment wholly inside the span by its tree
sidecar (storage/tree_sidecar.py), read only when none matches it; so rot in a closed
segment whose sidecar was written before it is not seen. The trees are the same either
way, bit for bit. `deep` travels in `scrub.verify` and `scrub.tree`; absent (a node of
an earlier version, whose builds read everything) it means deep.

A different follower is repaired the way a replica whose read met a bad frame is:
`Replicas.report_damage` there (a reopen with a full check; recovery cuts the log
before the first frame that fails its check and marks the replica for repair; the
leader refills it). That cut only finds damage a checksum sees; a difference whose
frames all pass their checks is reported, and the repair started finds nothing to
cut (docs/mirror.md, "What is not built yet"). A leader whose own read failed is not
the reference for anyone: it starts its own repair and no follower is touched.

A scheduled scrub (multiraft/node/scheduled_scrubs.py) is a deep verify run by the leader
on its own, **paced**: every build of it, the leader's and each follower's (`paced` in
`scrub.tree`), reads through its node's scrub byte rate, and a follower's call may take as
long as its share of that rate needs (`_tree_call_timeout_s`); every tree call sends that
timeout as `deadline_s`, where the follower's build stops (the RPC server cancels no handler).

The node that takes `POST /v1/admin/verify` walks the partitions in catalog order,
at most `PARTITIONS_PER_CALL` a call, each on its leader (over `scrub.verify` when
that is another node), and says where to go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, OffsetOutOfRange
from multiraft.node.routing import call_peer
from multiraft.node.scrub_trees import ReplicaTrees
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer
from raftlog.errors import ClientError, NotLeader
from raftlog.types import GroupId
from storage.tictac import Descent, TicTacTree

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing

PARTITIONS_PER_CALL = 16  # partitions verified by one POST /v1/admin/verify, at most
CALL_BUDGET_S = 10.0  # and no partition is started after this long: the answer says where to go on
TREE_CALL_TIMEOUT_S = 10.0  # a follower's first answer builds its tree: a read of the whole span
SPANS_MAX = 4096  # spans (each up to SPAN_LEAVES_MAX leaves) one verify walks: 1 T offsets
# Asks of one follower for one span's tree: again when retention moved this leader's log start
# past the span the follower answered while it built (a pass every 2 s, each asked from the new
# start: a third move within one span's call means the log is going faster than a verify can).
TREE_ASKS_MAX = 3
# A paced follower build shares its node's scrub rate with that node's own scheduled scrub and
# the other leaders' asking it at once (RF 3: about three builds a node): its call may take this
# many times what the leader's own build of the span would take alone at that rate.
PACED_BUILDS_SHARING = 4
IDENTICAL, BEHIND, DIFFERENT, UNREACHABLE, LEADER_DAMAGED = (
    "identical", "behind", "different", "unreachable", "leader_damaged")
_WORST = (DIFFERENT, LEADER_DAMAGED, UNREACHABLE, BEHIND, IDENTICAL)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaVerdict:
    node: int
    status: str
    lo: int
    hi: int  # the span compared (a replica behind compares a shorter one)
    ranges: tuple[tuple[int, int], ...] = ()
    truncated: bool = False  # more differing leaves than a comparison reports
    nodes_compared: int = 0  # digests this replica sent for the comparison
    repair_started: bool = False
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ranges": [list(r) for r in self.ranges]}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PartitionVerdict:
    topic: str
    partition: int
    status: str
    leader: int
    lo: int
    high_watermark: int
    replicas: tuple[ReplicaVerdict, ...]

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return sorted({r for replica in self.replicas for r in replica.ranges})

    @property
    def repair_started(self) -> bool:
        return any(replica.repair_started for replica in self.replicas)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "status": self.status, "leader": self.leader,
                "lo": self.lo, "high_watermark": self.high_watermark,
                "ranges": [list(r) for r in self.ranges], "repair_started": self.repair_started,
                "replicas": [r.to_json() for r in self.replicas]}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PartitionVerdict:
        replicas = tuple(ReplicaVerdict(**{**r, "ranges": tuple(tuple(x) for x in r["ranges"])})
                         for r in value["replicas"])
        return cls(topic=value["topic"], partition=value["partition"], status=value["status"],
                   leader=value["leader"], lo=value["lo"], high_watermark=value["high_watermark"], replicas=replicas)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    partitions: tuple[PartitionVerdict, ...]
    total: int  # partitions the request covers
    next_start: int | None  # where the next call goes on (None: done)

    def to_json(self) -> dict[str, Any]:
        statuses = [p.status for p in self.partitions]
        return {"partitions": [p.to_json() for p in self.partitions], "total": self.total,
                "verified": len(self.partitions), "next_start": self.next_start,
                "all_identical": all(s == IDENTICAL for s in statuses)}


@dataclasses.dataclass(frozen=True, slots=True)
class _Lead:
    """What a verify of one partition began on: this node leading its group (`runtime`) over
    `store`. Another runtime (an election) or store (a reopen, which may cut the log) ends it."""

    group_id: GroupId
    runtime: object
    store: object


@dataclasses.dataclass(frozen=True, slots=True)
class _Mode:
    """How a verify reads: `deep` (every segment again), `paced` (within the scrub byte rate, a
    scheduled scrub), and how long a follower's tree call may take."""

    deep: bool
    paced: bool
    timeout_s: float = TREE_CALL_TIMEOUT_S


class Scrubber:
    """Verifies partitions' replicas against their leaders; counts what it found."""

    def __init__(self, registry: GroupRegistry, catalog: CatalogHolder, routing: Routing, rpc: Rpc,
                 trees: ReplicaTrees) -> None:
        self._registry = registry
        self._catalog = catalog
        self._routing = routing
        self._rpc = rpc
        self.trees = trees
        self.partitions_verified = 0
        self.ranges_found = 0
        self.repairs_started = 0

    def serve(self, rpc: Rpc) -> None:
        self.trees.serve(rpc)

        async def verify(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._verify_call(body), lambda v: json.dumps(v.to_json()).encode())

        rpc.register("scrub.verify", verify)

    async def _verify_call(self, body: bytes) -> PartitionVerdict:
        try:
            request = json.loads(body)
            topic, partition = request["topic"], int(request["partition"])
            deep = request.get("deep", True) is not False  # absent from an earlier version's call: deep, as it was
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InvalidRequest("scrub.verify: {topic, partition, deep}") from None
        return await self.verify_partition(topic, partition, deep=deep)

    # -- many partitions, from any node --------------------------------------------------

    async def verify(self, topics: Sequence[str] | None, start: int, *, deep: bool = True) -> VerifyReport:
        """Up to PARTITIONS_PER_CALL partitions from position `start` of the request's list.
        `deep`: every replica reads its closed segments again; false: their sidecars (module docstring)."""
        catalog = self._catalog.catalog
        names = sorted(catalog.topics) if topics is None else list(topics)
        for name in names:
            catalog.topic(name)  # UNKNOWN_TOPIC for a name not in the catalog
        every = [(name, p.partition) for name in names for p in catalog.topic(name).partitions]
        if start > len(every):
            # 416, as a read past a log's end: how many partitions there are is the cluster's state
            raise OffsetOutOfRange(f"start {start} is past the {len(every)} partitions asked for", 0, len(every))
        chosen = every[start:start + PARTITIONS_PER_CALL]
        began, verdicts = time.monotonic(), []
        for topic, partition in chosen:
            if verdicts and time.monotonic() - began > CALL_BUDGET_S:
                break
            verdicts.append(await self._verify_anywhere(topic, partition, deep))
        after = start + len(verdicts)
        return VerifyReport(partitions=tuple(verdicts), total=len(every),
                            next_start=after if after < len(every) else None)

    async def _verify_anywhere(self, topic: str, partition: int, deep: bool) -> PartitionVerdict:
        group_id = self._catalog.partition_group(topic, partition)
        replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
        leader = self._routing.forward_target(group_id, replicas)
        try:
            if leader == self._routing.id:
                return await self.verify_partition(topic, partition, deep=deep)
            if leader == 0:
                raise NotLeader(0, "no leader known")
            body = json.dumps({"topic": topic, "partition": partition, "deep": deep}).encode()
            reply = await call_peer(self._rpc, leader, "scrub.verify", body, 4 * TREE_CALL_TIMEOUT_S, write=False)
            return PartitionVerdict.from_json(json.loads(reply))
        except ClientError as error:
            return PartitionVerdict(topic=topic, partition=partition, status=UNREACHABLE, leader=leader, lo=0,
                                    high_watermark=0, replicas=(ReplicaVerdict(
                                        node=leader, status=UNREACHABLE, lo=0, hi=0, detail=str(error)),))

    # -- one partition, on its leader ----------------------------------------------------

    async def verify_partition(self, topic: str, partition: int, *, deep: bool = True,
                               paced: bool = False) -> PartitionVerdict:
        """`paced`: a scheduled scrub's, every build within its node's scrub byte rate."""
        group_id = self._catalog.partition_group(topic, partition)
        runtime = self._registry.leading(group_id)
        store, machine = self._registry.stores.get(group_id), self._registry.partitions.get(group_id)
        if runtime is None or store is None or machine is None:
            raise NotLeader(self._routing.leader_of(group_id), f"node {self._routing.id} does not lead {topic}/{partition}")
        lead = _Lead(group_id, runtime, store)
        lo, hi = int(store.log_start_offset), int(machine.state.high_watermark)
        followers = sorted(int(n) for n in runtime.core.membership.voters if int(n) != int(self._routing.id))
        verdicts = await self._walk(lead, followers, lo, hi, _Mode(deep, paced))
        self._check_lead(lead)  # no repair started from a verify whose leader changed under it
        if deep:
            self.trees.read_whole(group_id)  # the schedule counts it: the replicas were read whole
        if all(v.status != LEADER_DAMAGED for v in verdicts):  # the leader read its whole span clean
            repaired = [dataclasses.replace(v, repair_started=await self._repair(v.node, group_id))
                        if v.status == DIFFERENT else v for v in verdicts]
            verdicts = tuple(repaired)
        status = min((v.status for v in verdicts), key=_WORST.index, default=IDENTICAL)
        verdict = PartitionVerdict(topic=topic, partition=partition, status=status, leader=int(self._routing.id),
                                   lo=lo, high_watermark=hi, replicas=verdicts)
        self.partitions_verified += 1
        self.ranges_found += len(verdict.ranges)
        self.repairs_started += sum(1 for v in verdicts if v.repair_started)
        return verdict

    def _leads(self, lead: _Lead) -> bool:
        return self._registry.leading(lead.group_id) is lead.runtime and \
            self._registry.stores.get(lead.group_id) is lead.store

    def _check_lead(self, lead: _Lead) -> None:
        if not self._leads(lead):
            raise NotLeader(self._routing.leader_of(lead.group_id), f"node {self._routing.id} stopped leading group "
                            f"{lead.group_id}, or reopened its replica, during the verify: verify again")

    async def _walk(self, lead: _Lead, followers: list[int], lo: int, hi: int,
                    mode: _Mode) -> tuple[ReplicaVerdict, ...]:
        """Each follower compared with this leader over `[lo, hi)`, span after span, until it is
        found not identical; or, when this leader's own read fails its checks, the leader's own
        verdict alone (its repair started). No repair of a follower here."""
        me = int(self._routing.id)
        found: dict[int, ReplicaVerdict] = {}  # each follower's verdict over the spans so far
        start = lo
        for number in range(SPANS_MAX):
            # Every span but the first follows awaits: retention (compaction_loop, on this loop)
            # may have moved this leader's log start past its start, a reopen replaced (and
            # perhaps cut) the store, another node may lead. The span is what is held now.
            self._check_lead(lead)
            start, end = self.trees.span(lead.group_id, start, hi)
            if number > 0 and start >= end:
                break  # retention passed the rest of the span: nothing is left to compare
            own = await self.trees.build(lead.group_id, start, end, fresh=True, deep=mode.deep, paced=mode.paced)
            if own.damaged:
                started = self.trees.report_damage(lead.group_id)
                return (ReplicaVerdict(node=me, status=LEADER_DAMAGED, lo=lo, hi=hi, repair_started=started,
                                       detail=f"entries {list(own.damaged)} fail their checks"),)
            going = [n for n in followers if n not in found or found[n].status == IDENTICAL]
            # The followers build their trees at once, each on its own node.
            call = dataclasses.replace(mode, timeout_s=self._tree_call_timeout_s(mode, own.bytes_hashed))
            answers = await asyncio.gather(*(self._verify_follower(lead, n, start, end, call) for n in going))
            for node, verdict in zip(going, answers, strict=True):
                found[node] = _joined(found.get(node), verdict)
            if end >= hi:
                break
            start = end
        return tuple(found[n] for n in followers)

    def _tree_call_timeout_s(self, mode: _Mode, own_bytes: int) -> float:
        """How long a follower may take to answer for a span this leader hashed `own_bytes` of:
        unpaced, TREE_CALL_TIMEOUT_S; paced, also its share of its node's scrub rate for them."""
        rate = self.trees.pace.rate
        if not mode.paced or rate <= 0:
            return TREE_CALL_TIMEOUT_S
        return TREE_CALL_TIMEOUT_S + PACED_BUILDS_SHARING * own_bytes / rate

    async def _verify_follower(self, lead: _Lead, node: int, lo: int, hi: int, mode: _Mode) -> ReplicaVerdict:
        """One follower compared with this leader over the span `[lo, hi)` (within the leaf bound)."""
        try:
            summary, mine = await self._trees_of(lead, node, lo, hi, mode)
            their_lo, their_hi = int(summary["lo"]), int(summary["hi"])
            if mine is None:  # nothing to compare, and nothing left to: the walk ends here
                return ReplicaVerdict(node=node, status=BEHIND if their_hi < hi else IDENTICAL, lo=their_lo,
                                      hi=their_hi, detail="not compared: retention passed the span on the leader")
            descent = Descent(mine)
            descent.receive([bytes.fromhex(summary["root"])])
            while (step := descent.wanted()) is not None:
                level, positions = step
                reply = json.loads(await self._call(node, "scrub.nodes", {
                    "group_id": lead.group_id, "lo": their_lo, "hi": their_hi, "level": level, "positions": positions,
                }, RPC_TIMEOUT_S))
                descent.receive([bytes.fromhex(d) for d in reply["digests"]])
        except (ClientError, ValueError, KeyError, TypeError) as error:
            return ReplicaVerdict(node=node, status=UNREACHABLE, lo=lo, hi=hi, detail=str(error))
        result = descent.result()
        if result.identical and their_lo >= hi:  # nothing to differ: the span is gone there, as retention does
            return ReplicaVerdict(node=node, status=IDENTICAL, lo=hi, hi=hi, nodes_compared=result.nodes_compared,
                                  detail=f"it holds nothing of the span: its log starts at {their_lo}")
        if result.identical:
            status = BEHIND if their_hi < hi else IDENTICAL
            return ReplicaVerdict(node=node, status=status, lo=their_lo, hi=their_hi,
                                  nodes_compared=result.nodes_compared)
        detail = f"entries {summary['damaged']} fail their checks there" if summary.get("damaged") else ""
        return ReplicaVerdict(node=node, status=DIFFERENT, lo=their_lo, hi=their_hi, ranges=result.ranges,
                              truncated=result.truncated, nodes_compared=result.nodes_compared, detail=detail)

    async def _trees_of(self, lead: _Lead, node: int, lo: int, hi: int,
                        mode: _Mode) -> tuple[dict[str, Any], TicTacTree | None]:
        """The follower's answer for `[lo, hi)` (the span cut to what it holds) and this leader's
        tree over the span it answered (None: this leader holds nothing of `[lo, hi)` now).
        Retention may move this leader's log start past that span during the call: unless
        the tree is one kept from this span's own build, the follower is asked again from
        where this leader starts now."""
        asked = lo
        for _ in range(TREE_ASKS_MAX):
            # An earlier version ignores `deep` (it reads every segment anyway), `paced` and
            # `deadline_s` (this call's timeout: the follower's build stops when this leader stops waiting).
            request = {"group_id": lead.group_id, "lo": asked, "hi": hi, "deep": mode.deep,
                       "deadline_s": mode.timeout_s}
            if mode.paced:
                request["paced"] = True
            summary = json.loads(await self._call(node, "scrub.tree", request, mode.timeout_s))
            their_lo, their_hi = int(summary["lo"]), int(summary["hi"])
            if not asked <= their_lo <= their_hi or (their_lo < their_hi and their_hi > hi):
                # This leader builds over the span the follower answered: never past the one asked.
                # An empty one too starts there or later (the follower's log start, when greater).
                raise ValueError(f"it answered the span [{their_lo}, {their_hi}) for [{asked}, {hi})")
            self._check_lead(lead)  # NotLeader: this follower unreachable, the walk ends on it
            if their_lo >= hi:  # it holds nothing of the span: compared with the empty tree, no build
                return summary, TicTacTree.from_leaves(their_lo, their_hi, ())
            kept = self.trees.kept(lead.group_id, their_lo, their_hi)
            if kept is not None:
                return summary, kept.tree
            held = self.trees.span(lead.group_id, their_lo, their_hi)
            if held == (their_lo, their_hi):
                return summary, (await self.trees.build(lead.group_id, their_lo, their_hi, fresh=False,
                                                        paced=mode.paced)).tree
            if held[0] >= hi:
                return summary, None
            asked = held[0]
        raise ValueError(f"retention moved this leader's log start past the span answered, {TREE_ASKS_MAX} times")

    async def _repair(self, node: int, group_id: GroupId) -> bool:
        try:
            reply = await self._call(node, "scrub.repair", {"group_id": group_id}, RPC_TIMEOUT_S)
            return bool(json.loads(reply)["started"])
        except (ClientError, ValueError, KeyError, TypeError):
            return False

    async def _call(self, node: int, method: str, request: dict[str, Any], timeout_s: float) -> bytes:
        return await call_peer(self._rpc, node, method, json.dumps(request).encode(), timeout_s, write=False)


def _joined(before: ReplicaVerdict | None, span: ReplicaVerdict) -> ReplicaVerdict:
    """A follower's verdict over the spans so far (identical over those `before`) and the next."""
    if before is None:
        return span
    assert before.status == IDENTICAL, before
    return dataclasses.replace(span, lo=before.lo, nodes_compared=before.nodes_compared + span.nodes_compared)
