"""The full sync between clusters: a mirror compared with its source by tictac trees.

Riak's full-sync AAE on a log (docs/mirror.md, "Full sync"). A verify of one mirror
partition runs on its sink leader:

1. The span: from the sink's log start to its high watermark, now. The source answers
   its tree over that span cut to what it holds (multiraft/node/mirror_trees.py): from
   its log start, up to its high watermark; so the two compare over what both hold.
2. The leader builds its own tree over the span the source answered (storage/scrub.py,
   a slice at a time) and compares root first (`Descent`), asking the source only for
   the children of nodes that differ. Identical copies cost one root.
3. The verdict: `identical`; `behind` (identical over what both hold, the source holds
   more: the real-time path is still copying); `different`, with the differing offset
   ranges; `source_damaged` (the source's own read failed its checks: no reference, no
   repair); `sink_damaged` (the leader's read failed its checks: the in-cluster self-repair
   is started, docs/mirror.md "The scrubber"); `unreachable` (the source, or the leader).
4. A different partition is repaired by a **resync** (`ResyncMirrorPartition`): a new
   incarnation of the mirror partition, a new Raft group, which keeps the old one's
   entries below the first differing offset when it can (mirror_prefix.py; only once the
   cluster is finalized at feature level 1, multiraft/metadata/features.py) and otherwise
   starts at the source's log start; the real-time path refills the rest. Committed
   entries of a Raft log cannot be taken back, and storage gives offsets in log order, so
   a copy whose committed batches differ is replaced, never patched; docs/mirror.md says
   what that costs and why.

`POST /v1/admin/mirrors/{name}/verify` walks a link's mirror partitions in catalog order
from any node, each on its leader (`mirror.verify` when that is another node), at most
`PARTITIONS_PER_CALL` a call and none started after `CALL_BUDGET_S`. A link with
`verify_interval_s` is verified on a schedule by each partition's leader (`run`), with
repair. Each leader keeps the last verdict of each partition it verified (the link's
status shows it), and counts what its verifies found per link (`LinkVerifyCounts`, on
/metrics: by link and verdict, never by partition).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest, NotAMirror, OffsetOutOfRange, UnknownMirrorLink
from multiraft.metadata.features import FeatureLevel, supports
from multiraft.metadata.mirror_commands import LinkState, MirrorLink, ResyncMirrorPartition
from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node.mirror_prefix import choose_cut
from multiraft.node.mirror_source import SourceClient, SourceError, source_client
from multiraft.node.mirror_trees import POSITIONS_MAX, served_span
from multiraft.node.mirror_verify_filtered import READ_BYTES_MAX, filtered_source_tree
from multiraft.node.routing import call_peer
from multiraft.node.scrub_trees import SPAN_LEAVES_MAX, bounded_end
from multiraft.runtime.histograms import Histogram
from multiraft.transport.rpc import Rpc, answer
from raftlog.errors import ClientError, NotLeader
from raftlog.types import GroupId
from storage.tictac import Descent, run_descent

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.registry import GroupRegistry
    from multiraft.node.routing import Routing
    from multiraft.node.scrub_trees import ReplicaTrees

PARTITIONS_PER_CALL = 16
CALL_BUDGET_S = 10.0
VERIFY_CALL_TIMEOUT_S = 120.0  # one partition on another node: two reads of its span, and the descent
SPANS_MAX = 4096  # spans (each up to SPAN_LEAVES_MAX leaves) one verify walks: 1 T offsets
SCHEDULE_SCAN_S = 1.0
IDENTICAL, BEHIND, DIFFERENT, SOURCE_DAMAGED, SINK_DAMAGED, UNREACHABLE = VERDICTS = (
    "identical", "behind", "different", "source_damaged", "sink_damaged", "unreachable")
# A verify reads the open segment on both sides and the closed ones' tree sidecars (0.1 s at
# 1 GiB, docs/mirror.md "Figures"); a closed segment without a sidecar is read, about 1.4 s
# per GiB on this box: from a small partition's milliseconds to a large one's minutes.
VERIFY_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MirrorVerdict:
    """One mirror partition compared with its source."""

    topic: str
    partition: int
    status: str
    leader: int  # the sink node that ran it
    lo: int
    hi: int  # the span compared: what both held
    high_watermark: int  # the mirror's, at the start
    source_high_watermark: int = 0
    ranges: tuple[tuple[int, int], ...] = ()  # differing leaves' offset ranges
    truncated: bool = False  # more differing leaves than a comparison reports
    nodes_compared: int = 0  # digests fetched from the source (1: one root, identical)
    spans: int = 0  # trees compared (a partition beyond SPAN_LEAVES_MAX leaves takes several)
    bytes_hashed: int = 0  # by the sink leader
    repair: str = ""  # "resync_started", or why none was ("refused: ...")
    kept_below: int = 0  # a resync's new incarnation keeps the old one's batches below this offset (0: none)
    at_ms: int = 0  # wall clock at the start
    seconds: float = 0.0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ranges": [list(r) for r in self.ranges]}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> MirrorVerdict:
        return cls(**{**value, "ranges": tuple(tuple(r) for r in value["ranges"])})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MirrorVerifyReport:
    link: str
    partitions: tuple[MirrorVerdict, ...]
    total: int
    next_start: int | None

    def to_json(self) -> dict[str, Any]:
        return {"link": self.link, "partitions": [p.to_json() for p in self.partitions], "total": self.total,
                "verified": len(self.partitions), "next_start": self.next_start,
                "all_identical": all(p.status == IDENTICAL for p in self.partitions),
                "resyncs_started": sum(p.repair == "resync_started" for p in self.partitions)}


@dataclasses.dataclass(slots=True)
class LinkVerifyCounts:
    """What the verifies this node ran for one link found, since it started (for /metrics)."""

    verifies: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    differing_ranges: int = 0
    digests_fetched: int = 0  # nodes_compared: 1 per span of identical copies
    spans: int = 0  # trees compared
    bytes_hashed: int = 0  # by this node, into its own trees
    resyncs_started: int = 0
    seconds: Histogram = dataclasses.field(default_factory=lambda: Histogram(VERIFY_SECONDS_BUCKETS))

    def record(self, verdict: MirrorVerdict) -> None:
        assert verdict.status in self.verifies, verdict.status
        self.verifies[verdict.status] += 1
        self.differing_ranges += len(verdict.ranges)
        self.digests_fetched += verdict.nodes_compared
        self.spans += verdict.spans
        self.bytes_hashed += verdict.bytes_hashed
        self.resyncs_started += verdict.repair == "resync_started"
        self.seconds.observe(verdict.seconds)


@dataclasses.dataclass(slots=True)
class _Walk:
    """What one verify found over its spans so far."""

    ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    truncated: bool = False
    nodes: int = 0
    spans: int = 0
    bytes_hashed: int = 0
    source_high_watermark: int = 0
    source_log_start: int = 0
    lo: int | None = None
    hi: int = 0
    damaged: str = ""  # which side's read failed its checks, and what


class MirrorVerifier:
    """Compares the mirror partitions this node leads with their sources; repairs by resync."""

    def __init__(self, registry: GroupRegistry, catalog: CatalogHolder, routing: Routing, rpc: Rpc,
                 trees: ReplicaTrees, metadata: MetadataOps, logger: Any,
                 new_client: Callable[[MirrorLink], SourceClient] | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 local_host: str | None = None) -> None:
        self._registry = registry
        self._catalog = catalog
        self._routing = routing
        self._rpc = rpc
        self._trees = trees
        self._metadata = metadata
        self._logger = logger
        self._new_client = new_client or (lambda link: source_client(link, random.Random(), local_host))
        self._clock_ms = clock_ms
        self.last: dict[tuple[str, int], MirrorVerdict] = {}  # the last verdict per partition verified here
        self._due: dict[tuple[str, int], float] = {}
        self.verified = 0
        self.resyncs_started = 0
        self._counts: dict[str, LinkVerifyCounts] = {}  # by link: the verifies run here

    def serve(self, rpc: Rpc) -> None:
        async def verify(source: int, body: bytes) -> tuple[int, bytes]:
            async def work() -> MirrorVerdict:
                try:
                    request = json.loads(body)
                    topic, partition, repair = request["topic"], int(request["partition"]), bool(request["repair"])
                    deep = request.get("deep") is True  # absent from an earlier version: the mirror's default
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise InvalidRequest("mirror.verify: {topic, partition, repair, deep}") from None
                return await self.verify_partition(topic, partition, repair=repair, deep=deep)
            return await answer(work(), lambda v: json.dumps(v.to_json()).encode())

        rpc.register("mirror.verify", verify)

    def counts(self) -> dict[str, LinkVerifyCounts]:
        """What this node's verifies found, by link; a link no longer in the catalog is
        forgotten (so the series stay bounded by the links there are)."""
        links = self._catalog.catalog.mirror_links
        self._counts = {name: counts for name, counts in self._counts.items() if name in links}
        return dict(sorted(self._counts.items()))

    # -- a link's partitions, from any node ----------------------------------------------

    async def verify(self, name: str, topic: str | None, start: int, *, repair: bool = True,
                     deep: bool = False) -> MirrorVerifyReport:
        catalog = self._catalog.catalog
        if name not in catalog.mirror_links:
            raise UnknownMirrorLink(f"mirror link {name!r} does not exist")
        if topic is not None and (catalog.topic(topic).mirror_link != name or not catalog.topic(topic).is_mirror):
            raise NotAMirror(f"topic {topic!r} is not a mirror over link {name!r} (or was promoted)")
        names = [topic] if topic is not None else catalog.mirror_topics(name)
        every = [(t, p.partition) for t in names for p in catalog.topic(t).partitions]
        if start > len(every):
            raise OffsetOutOfRange(f"start {start} is past the {len(every)} partitions asked for", 0, len(every))
        began, verdicts = time.monotonic(), []
        for topic_name, partition in every[start:start + PARTITIONS_PER_CALL]:
            if verdicts and time.monotonic() - began > CALL_BUDGET_S:
                break
            verdicts.append(await self._verify_anywhere(topic_name, partition, repair, deep))
        after = start + len(verdicts)
        return MirrorVerifyReport(link=name, partitions=tuple(verdicts), total=len(every),
                                  next_start=after if after < len(every) else None)

    async def _verify_anywhere(self, topic: str, partition: int, repair: bool, deep: bool) -> MirrorVerdict:
        group_id = self._catalog.partition_group(topic, partition)
        replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
        leader = self._routing.forward_target(group_id, replicas)
        try:
            if leader == self._routing.id:
                return await self.verify_partition(topic, partition, repair=repair, deep=deep)
            if leader == 0:
                raise NotLeader(0, "no leader known")
            body = json.dumps({"topic": topic, "partition": partition, "repair": repair, "deep": deep}).encode()
            reply = await call_peer(self._rpc, leader, "mirror.verify", body, VERIFY_CALL_TIMEOUT_S, write=False)
            return MirrorVerdict.from_json(json.loads(reply))
        except ClientError as error:
            return MirrorVerdict(topic=topic, partition=partition, status=UNREACHABLE, leader=leader, lo=0, hi=0,
                                 high_watermark=0, at_ms=self._clock_ms(), detail=f"{error.code}: {error.message}")

    # -- one partition, on its sink leader -------------------------------------------------

    async def verify_partition(self, topic: str, partition: int, *, repair: bool, deep: bool = False) -> MirrorVerdict:
        """`deep`: this leader and the source read every segment of the span (finds rot on
        either side); else closed segments count by their tree sidecars (docs/mirror.md)."""
        group_id = self._catalog.partition_group(topic, partition)
        info = self._catalog.catalog.topic(topic)
        link = self._catalog.catalog.mirror_links.get(info.mirror_link or "")
        store, machine = self._registry.stores.get(group_id), self._registry.partitions.get(group_id)
        if self._registry.leading(group_id) is None or store is None or machine is None:
            raise NotLeader(self._routing.leader_of(group_id), f"node {self._routing.id} does not lead "
                                                               f"{topic}/{partition}")
        if link is None or not info.is_mirror or not machine.state.mirror:
            raise NotAMirror(f"{topic}/{partition} is not a mirror (or was promoted)")
        at_ms, began = self._clock_ms(), time.monotonic()
        lo, high_watermark = int(store.log_start_offset), int(machine.state.high_watermark)
        walk = _Walk()
        client = self._new_client(link)
        try:
            if link.record_filter is not None:  # its trees are not the source's: mirror_verify_filtered.py
                status = await self._walk_filtered(client, group_id, topic, partition, lo, high_watermark, walk,
                                                   deep, RecordMatcher.of(link.record_filter))
            else:
                status = await self._walk(client, group_id, topic, partition, lo, high_watermark, walk, deep)
            detail = walk.damaged
        except (SourceError, ClientError, KeyError, TypeError, ValueError) as error:
            status, detail = UNREACHABLE, f"{type(error).__name__}: {error}"
        finally:
            await client.close()
        verdict = MirrorVerdict(
            topic=topic, partition=partition, status=status, leader=int(self._routing.id),
            lo=walk.lo if walk.lo is not None else lo, hi=walk.hi, high_watermark=high_watermark,
            source_high_watermark=walk.source_high_watermark, ranges=tuple(walk.ranges), truncated=walk.truncated,
            nodes_compared=walk.nodes, spans=walk.spans, bytes_hashed=walk.bytes_hashed, at_ms=at_ms,
            seconds=round(time.monotonic() - began, 3), detail=detail)
        if status == DIFFERENT and repair:
            outcome, kept = await self._resync(topic, partition, group_id, walk.source_log_start,
                                               min(lo for lo, _ in walk.ranges))
            verdict = dataclasses.replace(verdict, repair=outcome, kept_below=kept)
        self.last[(topic, partition)] = verdict
        self.verified += 1
        self._counts.setdefault(link.name, LinkVerifyCounts()).record(verdict)
        self._logger.info("mirror_verified", topic=topic, partition=partition, status=status,
                          ranges=len(verdict.ranges), nodes_compared=verdict.nodes_compared, repair=verdict.repair)
        return verdict

    async def _walk(self, client: SourceClient, group_id: GroupId, topic: str, partition: int, lo: int,
                    high_watermark: int, walk: _Walk, deep: bool) -> str:
        """Compare span after span (the source cuts each to what it holds, and to its leaf bound)
        until the end both hold; the verdict's status."""
        for _ in range(SPANS_MAX):
            # Both sides read their span at once: the source's answer is almost always the span
            # asked for, so this leader's tree over it is ready when the answer comes.
            guess = served_span(lo, high_watermark, lo, high_watermark)  # the source's cut, if it holds as much
            ahead = asyncio.create_task(self._trees.build(group_id, *guess, fresh=True, deep=deep))
            try:
                summary = await client.tree(topic, partition, lo, high_watermark, deep)
            finally:
                speculative = await asyncio.gather(ahead, return_exceptions=True)
            their_lo, their_hi = int(summary["lo"]), int(summary["hi"])
            walk.source_high_watermark = int(summary["high_watermark"])
            walk.source_log_start = int(summary["log_start_offset"])
            if summary.get("damaged"):
                walk.damaged = f"the source's entries {summary['damaged']} fail their checks there"
                return SOURCE_DAMAGED
            if their_hi > bounded_end(their_lo, their_hi):  # this leader builds over the span it answered
                raise SourceError(f"the source answered the span [{their_lo}, {their_hi}): over "
                                  f"{SPAN_LEAVES_MAX} leaves")
            if their_hi <= their_lo or self._trees.span(group_id, their_lo, their_hi) != (their_lo, their_hi):
                break  # nothing more in common (the source's log starts past the mirror's end)
            walk.lo = their_lo if walk.lo is None else walk.lo
            walk.hi = their_hi
            mine = speculative[0]
            if isinstance(mine, BaseException) or (mine.tree.lo, mine.tree.hi) != (their_lo, their_hi):
                mine = await self._trees.build(group_id, their_lo, their_hi, fresh=True, deep=deep)
            if not self._counted(walk, mine, group_id):
                return SINK_DAMAGED
            descent = Descent(mine.tree)
            descent.receive([bytes.fromhex(summary["root"])])
            while (step := descent.wanted()) is not None:
                level, positions = step
                digests: list[bytes] = []
                for at in range(0, len(positions), POSITIONS_MAX):
                    chunk = positions[at:at + POSITIONS_MAX]
                    digests += await client.tree_nodes(topic, partition, their_lo, their_hi, level, chunk)
                descent.receive(digests)
            result = descent.result()
            walk.nodes += result.nodes_compared
            walk.ranges += result.ranges
            walk.truncated |= result.truncated
            if result.ranges or their_hi >= min(high_watermark, walk.source_high_watermark):
                break  # a difference is repaired whole (a resync), so the walk stops at the first
            lo = their_hi
        if walk.ranges:
            return DIFFERENT
        return BEHIND if high_watermark < walk.source_high_watermark else IDENTICAL

    async def _walk_filtered(self, client: SourceClient, group_id: GroupId, topic: str, partition: int, lo: int,
                             high_watermark: int, walk: _Walk, deep: bool, matcher: RecordMatcher) -> str:
        """A filtered mirror: span after span, its tree against the one it should have, computed
        here from the source's log (at most READ_BYTES_MAX source bytes in all); `behind` when
        the bound stopped it before the end both hold (`detail` says where)."""
        budget = READ_BYTES_MAX
        while budget > 0:
            theirs = await filtered_source_tree(client, topic, partition, lo, bounded_end(lo, high_watermark),
                                                matcher, budget)
            budget -= theirs.bytes_read
            walk.source_high_watermark, walk.source_log_start = theirs.source_high_watermark, theirs.source_log_start
            span = (theirs.tree.lo, theirs.tree.hi)
            if span[1] <= span[0] or self._trees.span(group_id, *span) != span:
                break  # nothing more in common
            walk.lo, walk.hi = (span[0] if walk.lo is None else walk.lo), span[1]
            mine = await self._trees.build(group_id, *span, fresh=True, deep=deep)
            if not self._counted(walk, mine, group_id):
                return SINK_DAMAGED
            result = run_descent(Descent(mine.tree), theirs.tree.nodes)
            walk.nodes += result.nodes_compared
            walk.ranges += result.ranges
            walk.truncated |= result.truncated
            if result.ranges or span[1] >= min(high_watermark, walk.source_high_watermark):
                break
            lo = span[1]
        if walk.ranges:
            return DIFFERENT
        if (walk.hi or 0) < min(high_watermark, walk.source_high_watermark):
            walk.damaged = f"compared up to offset {walk.hi}: a filtered mirror's verify reads at most " \
                           f"{READ_BYTES_MAX} source bytes a partition"
            return BEHIND
        return BEHIND if high_watermark < walk.source_high_watermark else IDENTICAL

    def _counted(self, walk: _Walk, mine: Any, group_id: GroupId) -> bool:
        """Count a span this leader hashed into `walk`; False when its own entries failed their
        checks (the walk then says which, and the in-cluster self-repair is asked for)."""
        walk.spans += 1
        walk.bytes_hashed += mine.bytes_hashed
        if mine.damaged:
            started = self._trees.report_damage(group_id)
            walk.damaged = f"this leader's entries {list(mine.damaged)[:16]} fail their checks " \
                           f"(self-repair {'started' if started else 'not started'})"
            return False
        return True

    async def _resync(self, topic: str, partition: int, group_id: GroupId, start_offset: int,
                      differs_at: int) -> tuple[str, int]:
        """Replace the mirror partition by a new incarnation the real-time path refills, keeping
        the old one's entries below `differs_at` when it can (mirror_prefix.py); the outcome,
        and the offset below which the old batches are kept (0: none)."""
        store = self._registry.stores.get(group_id)
        info = self._catalog.catalog.topic(topic).partitions[partition]
        # Below the level a node may run a build that cannot read a kept prefix: resync whole,
        # written exactly as before the prefix existed (docs/mirror.md, "Upgrading").
        keeps = supports(self._catalog.catalog, FeatureLevel.BASELINE)
        cut = await choose_cut(store, differs_at, start_offset, info) if store is not None and keeps else None
        runtime = self._registry.leading(group_id)
        # Kept entries must be committed ones: this node still leads and has applied the cut
        # (a follower's log past its commit may differ); and no move under way (learners).
        if runtime is None or runtime.core.membership.learners or (
                cut is not None and cut[0] > runtime.core.applied_index):
            cut = None
        index, term, kept = cut or (0, 0, 0)
        voters = tuple(sorted(runtime.core.membership.voters)) if cut is not None and runtime is not None else ()
        command = ResyncMirrorPartition(name=topic, partition=partition, group_id=int(group_id),
                                        start_offset=start_offset, prefix_index=index, prefix_term=term,
                                        prefix_offset=kept, prefix_voters=voters)
        try:
            await self._metadata.propose(command)
        except ClientError as error:
            return f"refused: {error.code}: {error.message}", 0
        self.resyncs_started += 1
        self._logger.warning("mirror_resync_started", topic=topic, partition=partition, old_group=group_id,
                             start_offset=start_offset, kept_below=kept, kept_index=index,
                             **({} if keeps else {"prefix": "not kept below feature level 1"}))
        return "resync_started", kept

    # -- the schedule ---------------------------------------------------------------------

    async def run(self) -> None:
        """Verify (and repair) each mirror partition led here whose link has `verify_interval_s`,
        that often; one partition at a time. A partition's first turn comes one interval after
        this node began leading it."""
        while True:
            await asyncio.sleep(SCHEDULE_SCAN_S)
            for topic, partition, interval_s in self._scheduled():
                key, now = (topic, partition), time.monotonic()
                due = self._due.setdefault(key, now + interval_s)
                if now < due:
                    continue
                self._due[key] = now + interval_s
                try:
                    await self.verify_partition(topic, partition, repair=True)
                except ClientError as error:
                    self._logger.info("mirror_verify_skipped", topic=topic, partition=partition, error=error.code)

    def _scheduled(self) -> list[tuple[str, int, int]]:
        catalog, found = self._catalog.catalog, []
        for topic in catalog.topics.values():
            link = catalog.mirror_links.get(topic.mirror_link or "")
            if link is None or not topic.is_mirror or link.state is not LinkState.RUNNING \
                    or link.verify_interval_s is None:
                continue
            for p in topic.partitions:
                if self._registry.leading(p.group_id) is not None:
                    found.append((topic.name, p.partition, link.verify_interval_s))
        led = {(t, p) for t, p, _ in found}
        self._due = {k: v for k, v in self._due.items() if k in led}
        return found
