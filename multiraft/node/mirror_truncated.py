"""A mirror partition whose source truncated past it (issue 24; docs/mirror.md, "The source
truncated past a mirror").

The source's retention deleted offsets the mirror had not copied yet. The pull cannot go
on: a mirror keeps the source's offsets, and a log holds no gap of offsets, so it cannot
skip ahead. The link's `on_source_truncated` decides (Kafka's `auto.offset.reset`, in
spirit, as MirrorMaker 2 users set it to `earliest`):

- `stop` (the default): the pull waits in `source_truncated`, reading the source again
  every `TRUNCATED_RETRY_S`; nothing of the mirror's is discarded. It goes on by itself
  only if the source's log starts at or below its position again (it never does by
  retention); an operator changes the policy (`raftlog mirror alter`) or deletes and
  recreates the mirror topic.
- `resync`: the partition's sink leader proposes `ResyncMirrorPartition`, whole (no kept
  prefix), starting at the source's log start as confirmed (below): a new incarnation (a
  new Raft group) that the real-time path refills from the source as any mirror partition.
  What the mirror loses is what the source's retention already deleted, plus the mirror's
  own copy of the older offsets it still held, and the consumer offsets committed on it.

A resync discards the mirror's whole copy, so it needs solid evidence. One answer is none
(a source node's bug, a lie, a replica whose retention ran a round ahead): the truncation
must be seen again `CONFIRM_AFTER_S` after it was first seen by the same pull, in the same term
at the same position, with no read in between finding the source's log at or below the position
(`forget_sighting` forgets it, and so does every start of the pull's copy loop: after a
leadership change, a pause, a settle or a failure; a sighting of another term or position
starts the count again); then the source's own
description confirms it (`SourceClient.partition_views`: each source address the link names
describes its own replica of the partition, and every replica the description names must be
described so, by the node hosting it): the resync starts at the lowest log start over the
replicas, and only if that is past the pull's position, so no offset a replica still holds is
skipped. While one still holds it, nothing is proposed and the client moves to
the next source address (its reads may reach that replica). And it must be the partition the
mirror copies: the source's group id for it equal to the one the catalog recorded when the
mirror was made (`PartitionInfo.source_group`; the source never reuses one); another one
(the source topic was made again) is `Diverged`, none recorded (a mirror made before it was)
acts as `stop` (`Action.UNIDENTIFIED`).

Only the partition's leader decides, on a fresh view: the pull acts on a truncated answer
only while it still leads in the term it read in, and just before proposing it confirms that
with a ReadIndex on the partition's group and reads the applied position again (`StillBehind`):
a pull whose leadership moved while its long poll was out, or whose position another leader
copied past meanwhile, proposes nothing and settles again.

Bounded and idempotent: the leader decides on a catalog caught up with the metadata
leader's (`sync_catalog`, a ReadIndex: a node that just began leading the partition may not
have applied a resync another node had accepted), proposes at most one accepted resync per
incarnation (`_replaced`), and the command names the group it replaces, so proposals racing
from several nodes replace it once. A refused proposal (no metadata leader,
a partition being moved) is tried again after `backoff_s`, doubling to 30 s. A promoted
topic is never resynced (the catalog refuses it too, `NOT_A_MIRROR`), nor one deleted or now
another link's. The decision is a pure function of the catalog (`truncated_action`), taken
again just before the proposal; the catalog's apply does not look at the policy, so a change
to `stop` racing a proposal already made does not undo it.

Counted per link for /metrics (`raftlog_mirror_truncated_resyncs_total`), and per partition
for the link's status (`truncated_resyncs`, `last_truncated_resync`), by the node whose
proposal replaced the incarnation (the catalog's apply answers it); kept in memory as the
full sync's verdicts are.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from multiraft.metadata.mirror_commands import OnSourceTruncated, ResyncMirrorPartition
from multiraft.node.mirror_source import Diverged, PartitionView, SourceError, backoff_s
from raftlog.errors import ClientError
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.metadata.catalog import Catalog
    from multiraft.node.catalog_holder import CatalogHolder

TRUNCATED_RETRY_S = 5.0  # a stopped partition reads the source again this often
CONFIRM_AFTER_S = TRUNCATED_RETRY_S  # a resync needs the truncation seen again at least this long after


# Confirms, just before a resync is proposed, that the pull's node still leads the partition
# in its term and that the applied position is below the given start; that position (mirror_pull.py).
StillBehind = Callable[[int], Awaitable[int]]


class SourceViews(Protocol):
    """What a resync's confirmation reads of the link's source client (mirror_source.py)."""

    async def partition_views(self, topic: str, partition: int) -> list[PartitionView]: ...

    def rotate(self) -> None: ...


class Proposer(Protocol):
    """The metadata group's operations used here (multiraft/node/metadata_ops.py)."""

    async def sync_catalog(self) -> None: ...

    async def propose(self, command: Any) -> Any: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Truncation:
    """The pull of `group_id` (an incarnation of `topic`/`partition`) at `position`, led here in
    `term`, and the source's log now starting at `log_start_offset`, past it."""

    link: str
    topic: str
    partition: int
    group_id: GroupId
    position: int
    log_start_offset: int
    term: int

    def __post_init__(self) -> None:
        assert self.log_start_offset > self.position >= 0, self

    def deleted(self) -> str:
        return (f"the source deleted offsets {self.position}..{self.log_start_offset - 1} (retention) "
                "before they were copied")


class Action(enum.Enum):
    STOP = "stop"  # the link says stop (or is gone): wait, keep everything
    DONE = "done"  # this incarnation is replaced, or being replaced: wait for the catalog
    PROMOTED = "promoted"  # the topic was promoted: never resynced
    GONE = "gone"  # the topic is no longer this link's mirror (deleted, or another link's): never resynced
    UNIDENTIFIED = "unidentified"  # the source partition's identity is not recorded: acts as stop
    RESYNC = "resync"  # propose the resync (once confirmed)


def truncated_action(catalog: Catalog, truncation: Truncation, proposed: bool) -> Action:
    """What the pull does about `truncation`, from the catalog alone; `proposed`: this node
    already had a resync of this incarnation accepted."""
    link = catalog.mirror_links.get(truncation.link)
    if link is None or link.on_source_truncated != OnSourceTruncated.RESYNC:
        return Action.STOP
    topic = catalog.topics.get(truncation.topic)
    if topic is None or topic.mirror_link != truncation.link:
        return Action.GONE
    if not topic.is_mirror:
        return Action.PROMOTED
    partitions = topic.partitions
    if proposed or truncation.partition >= len(partitions) or \
            partitions[truncation.partition].group_id != truncation.group_id:
        return Action.DONE
    if partitions[truncation.partition].source_group is None:
        return Action.UNIDENTIFIED
    return Action.RESYNC


# What the pull's status says after the deleted range, by the action taken (DONE: `_done`).
_SHOWN = {Action.STOP: "on_source_truncated is stop: copying waits",
          Action.PROMOTED: "the topic is promoted: no resync",
          Action.GONE: "the topic is no longer this link's mirror (deleted, or another link's): no resync",
          Action.UNIDENTIFIED: ("the source partition's identity is not recorded: resync needs a mirror made by "
                                "this version (delete the mirror topic to have it made again), copying waits")}


@dataclasses.dataclass(slots=True)
class PartitionResyncs:
    """The truncated resyncs this node proposed for one mirror partition (for its status)."""

    count: int = 0
    at_ms: int = 0
    deleted_from: int = 0
    deleted_to: int = 0
    start_offset: int = 0
    old_group: int = 0

    def view(self, link: str, topic: str, partition: int) -> dict[str, Any]:
        return {"link": link, "topic": topic, "partition": partition, "count": self.count, "at_ms": self.at_ms,
                "deleted": [self.deleted_from, self.deleted_to], "start_offset": self.start_offset,
                "old_group": self.old_group}


class TruncatedResyncs:
    """The `on_source_truncated` policy of this node's pulls (one per node, beside them)."""

    def __init__(self, catalog: CatalogHolder, metadata: Proposer | None, logger: Any,
                 rng: random.Random | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """`metadata`: where resyncs are proposed (None: none can be; every link acts as `stop`).
        `clock_ms`: when a resync happened (the status); `monotonic`: how long ago a truncation
        was first seen."""
        self._catalog = catalog
        self._metadata = metadata
        self._logger = logger
        self._rng = rng or random.Random()
        self._clock_ms = clock_ms
        self._replaced: set[GroupId] = set()  # incarnations whose resync this node had accepted
        self._failures: dict[GroupId, int] = {}  # refused proposals in a row, by incarnation
        self._counts: dict[str, int] = {}  # by link: resyncs this node had accepted (for /metrics)
        self._partitions: dict[tuple[str, str, int], PartitionResyncs] = {}  # by (link, topic, partition)
        # incarnation -> (term, position) its truncation was first seen at, and when (monotonic)
        self._seen: dict[GroupId, tuple[tuple[int, int], float]] = {}
        self._forgot_at: tuple[Catalog, int] | None = None  # the catalog version `_forget` last ran on
        self.monotonic = monotonic

    async def on_truncated(self, truncation: Truncation, source: SourceViews,
                           still_behind: StillBehind) -> tuple[float, str]:
        """Act on `truncation` as the link says; how long the pull pauses before it reads the
        source again, and the error its status shows. `source`: the link's source client (its
        description of the partition confirms a resync). `still_behind(start)`: called just
        before a resync is proposed; confirms the pull's leader still leads in its term and that
        the partition's applied position is still below `start` (that position), else raises
        (the pull settles again, nothing proposed)."""
        self._forget()
        action = self._decide(truncation)
        if action is not Action.RESYNC:
            return TRUNCATED_RETRY_S, f"{truncation.deleted()}; {self._shown(action, truncation)}"
        now = self.monotonic()
        where = (truncation.term, truncation.position)
        seen = self._seen.get(truncation.group_id)
        if seen is None or seen[0] != where:  # a sighting of another term or position counts for nothing
            seen = self._seen[truncation.group_id] = (where, now)
        if now - seen[1] < CONFIRM_AFTER_S:
            return TRUNCATED_RETRY_S, (f"{truncation.deleted()}; resync once the truncation is seen again "
                                       f"{CONFIRM_AFTER_S:.0f} s on and the source's replicas confirm it")
        try:
            return TRUNCATED_RETRY_S, f"{truncation.deleted()}; {await self._resync(truncation, source, still_behind)}"
        except ClientError as error:
            failures = self._failures[truncation.group_id] = self._failures.get(truncation.group_id, 0) + 1
            self._logger.info("mirror_source_truncated_resync_refused", link=truncation.link,
                              topic=truncation.topic, partition=truncation.partition,
                              group_id=int(truncation.group_id), error=error.code, failures=failures)
            return backoff_s(failures, self._rng), (f"{truncation.deleted()}; resync refused ({error.code}: "
                                                    f"{error.message}), trying again")
        except Diverged:
            raise  # the pull shows it (diverged) and backs off
        except SourceError as error:
            return TRUNCATED_RETRY_S, (f"{truncation.deleted()}; not confirmed, no resync: the source's description "
                                       f"of the partition could not be read ({error})")

    async def _resync(self, truncation: Truncation, source: SourceViews, still_behind: StillBehind) -> str:
        """Confirm the truncation seen twice, and propose the resync if it holds; what was done."""
        # Decided again on a catalog caught up with the metadata leader's: this node's may
        # lag (another node that led the partition may have had it replaced already).
        assert self._metadata is not None  # else _decide says stop
        await self._metadata.sync_catalog()
        action = self._decide(truncation)
        if action is not Action.RESYNC:
            return self._shown(action, truncation)
        recorded = self._catalog.catalog.topics[truncation.topic].partitions[truncation.partition].source_group
        assert recorded is not None  # else _decide says UNIDENTIFIED
        start, why = await self._source_start(truncation, source, recorded)
        if start is None:
            source.rotate()  # the next read asks another source address: it may reach a replica holding it
            return f"not confirmed, no resync: {why}"
        position = await still_behind(start)
        action = self._decide(truncation)  # the policy again, after the confirmation's round trips
        if action is not Action.RESYNC:
            return self._shown(action, truncation)
        await self._propose(truncation, position, start)
        return self._shown(Action.DONE, truncation)

    @staticmethod
    async def _source_start(truncation: Truncation, source: SourceViews, recorded: int) -> tuple[int | None, str]:
        """Where the source's log starts as its own description says it over its replicas (each
        source node the link names describes its own replica, and retention runs per replica):
        the lowest log start among them, once every replica the description names is described
        by the node hosting it (a node that did not answer, or that the link does not name,
        leaves the truncation unconfirmed) and if it is past the pull's position (every replica
        lacks the offsets from there); else None, and why. `Diverged` when the source
        partition is another than the one the mirror recorded it copies (`recorded`, a group id
        the source never reuses: its topic was deleted and made again)."""
        views = await source.partition_views(truncation.topic, truncation.partition)
        identities = sorted({v.group_id for v in views})
        if len(identities) > 1:
            return None, f"the source's nodes disagree on the partition's identity (groups {identities})"
        if identities != [recorded]:
            raise Diverged(f"{truncation.deleted()}; the source's {truncation.topic}/{truncation.partition} is "
                           f"another partition than this mirror copies (its group {identities[0]}, the mirror's "
                           f"record {recorded}: the source topic was deleted and made again?): no resync")
        named = sorted({v.replicas for v in views})
        if len(named) > 1:
            return None, f"the source's nodes disagree on the partition's replicas ({named})"
        missing = sorted(set(named[0]) - {v.node_id for v in views if v.log_start_offset is not None})
        if missing:  # a node that did not answer, or is not among the link's addresses
            return None, (f"the source's replicas on nodes {missing} are not described (each replica's node "
                          f"must be one of the link's addresses, and answer)")
        starts = [v.log_start_offset for v in views if v.log_start_offset is not None]
        if min(starts) <= truncation.position:
            return None, (f"a source replica still holds offset {truncation.position} (log starts "
                          f"{sorted(starts)} over the {len(starts)} replicas described)")
        return min(starts), ""

    def _shown(self, action: Action, truncation: Truncation) -> str:
        """What the status says of `action`: for DONE, the new incarnation's start as the
        catalog has it applied, else the start this node's accepted resync used (never this
        node's last read of the source, which may say another)."""
        if action is not Action.DONE:
            return _SHOWN[action]
        partitions = self._catalog.catalog.topics[truncation.topic].partitions  # DONE: the topic is there
        now = partitions[truncation.partition] if truncation.partition < len(partitions) else None
        if now is not None and now.group_id != truncation.group_id:
            kept = " keeping the old one's prefix" if now.prefix else f" from offset {now.start_offset}"
            return f"replaced by a new incarnation{kept}, waiting for it"
        mine = self._partitions.get((truncation.link, truncation.topic, truncation.partition))
        if mine is not None and mine.old_group == truncation.group_id:
            return f"resync from offset {mine.start_offset} proposed, waiting for the new incarnation"
        return "another node's resync had replaced this incarnation already: waiting for the catalog"

    def _decide(self, truncation: Truncation) -> Action:
        if self._metadata is None:
            return Action.STOP
        return truncated_action(self._catalog.catalog, truncation, truncation.group_id in self._replaced)

    def forget_sighting(self, group_id: GroupId) -> None:
        """A read of `group_id`'s pull found the source's log starting at or below its position,
        or the pull's copy loop (re)starts: a truncation seen before is forgotten (a resync needs
        one seen twice in a row by one run of the pull; an old sighting, of before a leadership
        change, a pause or a failure, never confirms a new one)."""
        self._seen.pop(group_id, None)

    async def _propose(self, truncation: Truncation, position: int, start: int) -> None:
        """Propose the resync of `truncation`'s incarnation from `start` (the partition's
        applied position `position` confirmed below it). Counted, recorded and logged only if
        this proposal replaced it, as the catalog's apply answers (`{"topic": ...}`; `{}` when
        another resync had replaced it first: the command names the group it replaces).
        Two identical proposals racing from two nodes cannot be told apart in the catalog
        afterwards; the apply result of each can."""
        assert self._metadata is not None
        answer = await self._metadata.propose(ResyncMirrorPartition(
            name=truncation.topic, partition=truncation.partition, group_id=int(truncation.group_id),
            start_offset=start))
        self._replaced.add(truncation.group_id)
        self._failures.pop(truncation.group_id, None)
        if not isinstance(answer, dict) or answer.get("topic") != truncation.topic:
            self._logger.info("mirror_source_truncated_resync_changed_nothing", link=truncation.link,
                              topic=truncation.topic, partition=truncation.partition,
                              group_id=int(truncation.group_id))
            return
        self._counts[truncation.link] = self._counts.get(truncation.link, 0) + 1
        key = (truncation.link, truncation.topic, truncation.partition)
        done = self._partitions.get(key) or PartitionResyncs()
        self._partitions[key] = PartitionResyncs(done.count + 1, self._clock_ms(), position, start - 1, start,
                                                 int(truncation.group_id))
        self._logger.bind(link=truncation.link, topic=truncation.topic, partition=truncation.partition,
                          group_id=int(truncation.group_id)).warning(
            "mirror_source_truncated_resync", deleted_from=position, deleted_to=start - 1, start_offset=start)

    def counts(self) -> dict[str, int]:
        """Resyncs this node had accepted, by link (links no longer in the catalog forgotten)."""
        self._forget()
        return dict(sorted(self._counts.items()))

    def partitions(self, link: str) -> list[dict[str, Any]]:
        """Per mirror partition of `link`, the resyncs this node had accepted and the last one."""
        self._forget()
        return [p.view(*key) for key, p in sorted(self._partitions.items()) if key[0] == link]

    def _forget(self) -> None:
        """Keep only what the catalog still names: incarnations of its mirror partitions (one
        replaced leaves it when the resync applies here: the catalog then names another, which
        `truncated_action` sees), links, and their mirror topics. So all stays bounded by the
        catalog. Done once per version of the catalog (its object, replaced on a restore, and
        the index of its last command applied), not at every call: it reads every mirror
        partition (0.15 ms for 10,000), and each truncated pull calls it every 5 s. What is
        kept for an incarnation the catalog dropped since is forgotten at its next change."""
        holder = self._catalog
        catalog, version = holder.catalog, holder.topics_index
        if self._forgot_at is not None and self._forgot_at[0] is catalog and self._forgot_at[1] == version:
            return
        self._forgot_at = (catalog, version)
        groups = {p.group_id for t in catalog.topics.values() if t.mirror_link is not None for p in t.partitions}
        self._replaced &= groups
        self._failures = {g: n for g, n in self._failures.items() if g in groups}
        self._seen = {g: at for g, at in self._seen.items() if g in groups}
        self._counts = {name: n for name, n in self._counts.items() if name in catalog.mirror_links}
        self._partitions = {key: p for key, p in self._partitions.items()
                            if key[1] in catalog.topics and catalog.topics[key[1]].mirror_link == key[0]}
