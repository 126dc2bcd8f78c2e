"""Mirror links: their admin operations, the discovery of source topics, their status.

- Admin (any node): create, pause, resume, alter (`on_source_truncated`) and delete links,
  promote a mirror topic:
  catalog commands through the metadata leader (multiraft/metadata/mirror_commands.py).
- Discovery (the metadata leader, one supervised loop): every `DISCOVER_INTERVAL_S`,
  each running link lists the source's topics; each one its pattern matches and the
  sink lacks becomes a mirror topic: the source's partition count and topic config,
  the replication factor the sink can hold (the source's, at most its live nodes),
  each partition starting at the source's log start offset now. A sink topic of that
  name that is not this link's mirror is left alone and named in `conflicts`. A link
  whose source fails is retried after a jittered backoff. The source's answers are
  checked before they are used: a topic name outside the topic-name pattern (it would
  go into URL paths) is refused without a call, a partition count above
  `PARTITIONS_MAX` before any read of its partitions (one read each), the reason
  shown in the discovery's `refused`. So is a topic whose description or partitions'
  log starts cannot be read (a partition not led yet) or are no offsets (the reader refuses
  those: mirror_source.parse_log_answer), or whose description the sink's command
  refuses (a config value out of bounds), or that the sink cannot place (no live
  node, or more new replicas than a node's open-files limit leaves room for: the check
  a topic made by hand meets, `MetadataOps.check_files`): each is that topic's
  refusal, never a failed round, so the link's other topics go on.
- Growth (the same loop): each of the link's mirror topics not promoted follows its
  source topic's partition increase. When the source's listing says more partitions
  than the mirror has, the new ones are read for their log start offsets (one read
  each) and `GrowMirrorTopic` adds them in mirror mode, placed as a mirror topic's are,
  with their source identities from the source's description as a creation records its
  (`records_source_identity`; a description not showing them yet refuses the growth).
  Within the same bounds as creation: at most `CREATES_PER_ROUND_MAX` creations and
  growths a round, and `READS_PER_ROUND_MAX` log-start reads for them all (`ReadBudget`,
  `listed_growth`: multiraft/node/mirror_follow.py) (a mirror
  with more new partitions than reads are left is made or grown by those read, and
  grown further in the next rounds: a partition count only grows, and the source has
  at least as many), a count above `PARTITIONS_MAX` refused before any read; a count
  below the mirror's is refused (a partition count never shrinks: the source topic was
  deleted and made again), and the mirror keeps pulling the partitions it has. A new
  partition whose log start cannot be read, or new partitions the sink cannot place
  (too few live nodes, the open-files check), are named in `refused` too (tried again
  the next round) rather than failing the link's round, and so is a growth while the
  sink is finalized below feature level 2 (`MIRROR_FOLLOW`: an older node could not read
  `GrowMirrorTopic`; the reason tells the operator to finalize). A creation or growth that another
  change overtook before its entry applied (a promotion, a delete, the same one proposed
  by the previous metadata leader around a leader change) changes nothing and is no
  failure: the next round looks again; one the catalog refuses on its own (group ids
  exhausted) is named in `refused` (`CATALOG_REFUSALS`).
- Status (any node): the link, what the metadata leader's discovery last saw, and
  each mirror partition's pull, asked of every live node (`mirror.status`), since
  each partition's leader runs its own pull (multiraft/node/mirror_pull.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from multiraft.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    NotAMirror,
    ResourceExhausted,
    TopicExists,
    UnknownMirrorLink,
    UnknownTopic,
)
from multiraft.metadata.checks import is_int
from multiraft.metadata.commands import PARTITIONS_MAX, TOPIC_CONFIG_KEYS
from multiraft.metadata.features import FeatureLevel, supports
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    DeleteMirrorLink,
    GrowMirrorTopic,
    LinkState,
    MirrorLink,
    PromoteMirrorTopic,
    SetMirrorLinkPolicy,
    SetMirrorLinkState,
    pattern_matches,
)
from multiraft.metadata.patterns import TOPIC_NAME_PATTERN
from multiraft.metadata.placement import PlacementNode, place_replicas
from multiraft.node.mirror_follow import ReadBudget, listed_growth, mirror_size
from multiraft.node.mirror_source import (
    SourceClient,
    SourceError,
    backoff_s,
    parse_partition_view,
    source_client,
)
from multiraft.node.routing import call_peer
from multiraft.transport.rpc import answer
from raftlog.errors import ClientError
from raftlog.types import NodeId

if TYPE_CHECKING:
    from multiraft.metadata.catalog import Catalog
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.mirror_pull import MirrorPulls
    from multiraft.node.mirror_verify import MirrorVerifier, MirrorVerifyReport
    from multiraft.node.routing import Routing
    from multiraft.transport.rpc import Rpc

DISCOVER_INTERVAL_S = 1.0
TOPICS_PER_LINK_MAX = 1000  # source topics one link mirrors
CREATES_PER_ROUND_MAX = 16  # mirror topics created or grown by one link's round (each reads its new partitions)
STATUS_CALL_TIMEOUT_S = 2.0
# What group 0 answers a mirror's creation or growth that another change overtook between
# discovery's look and the entry's apply (a promotion, a delete, the same creation or growth
# proposed by the previous metadata leader), or that it refuses on its own (group ids
# exhausted): by code, which a refusal forwarded from another node keeps.
CATALOG_REFUSALS = frozenset(error.code for error in (NotAMirror, UnknownTopic, UnknownMirrorLink, TopicExists,
                                                      InvalidPartitions, InvalidReplicaAssignment, ResourceExhausted))
CONFLICTS_SHOWN_MAX = 20


@dataclass(slots=True)
class Discovery:
    """What the metadata leader's discovery last did for one link."""

    last_run_ms: int | None = None
    source_topics: int = 0
    mirrored: int = 0
    conflicts: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # source topic -> why it is not mirrored
    failures: int = 0
    last_error: str | None = None
    retry_at: float = 0.0

    def view(self) -> dict[str, Any]:
        refused = [f"{name}: {why}" for name, why in sorted(self.refused.items())[:CONFLICTS_SHOWN_MAX]]
        return {"last_run_ms": self.last_run_ms, "source_topics": self.source_topics, "conflicts": self.conflicts,
                "refused": refused, "failures": self.failures, "last_error": self.last_error}


class MirrorLinks:
    def __init__(self, node_id: NodeId, catalog: CatalogHolder, metadata: MetadataOps, routing: Routing, rpc: Rpc,
                 pulls: MirrorPulls, logger: Any, verifier: MirrorVerifier, rng: random.Random | None = None) -> None:
        self.id = node_id
        self._catalog = catalog
        self._metadata = metadata
        self._routing = routing
        self._rpc = rpc
        self.pulls = pulls
        self.verifier = verifier
        self._logger = logger
        self._rng = rng or random.Random()
        self.discovery: dict[str, Discovery] = {}
        self._clients: dict[str, tuple[MirrorLink, SourceClient]] = {}
        rpc.register("mirror.status", self._serve_status)

    # ---- admin ----------------------------------------------------------------------

    async def create(self, command: CreateMirrorLink) -> dict[str, object]:
        await self._metadata.propose(command)
        return await self._described(command.name)

    async def set_state(self, name: str, state: LinkState) -> dict[str, object]:
        self.link(name)
        await self._metadata.propose(SetMirrorLinkState(name=name, state=state.value))
        return await self._described(name)

    async def alter(self, command: SetMirrorLinkPolicy) -> dict[str, object]:
        """Change a link's `on_source_truncated` (its pulls read it when a truncation is found)."""
        self.link(command.name)
        await self._metadata.propose(command)
        return await self._described(command.name)

    async def delete(self, name: str) -> None:
        self.link(name)
        await self._metadata.propose(DeleteMirrorLink(name=name))

    async def promote(self, name: str, topic: str) -> dict[str, object]:
        """Stop mirroring `topic` and make it writable: the catalog marks it promoted at once;
        each partition's leader then ends its mirror mode (mirror_pull.py), and produce
        answers MIRROR_READ_ONLY until its partition did."""
        self.link(name)
        info = self._catalog.catalog.topic(topic)
        if info.mirror_link != name:
            raise NotAMirror(f"topic {topic!r} is not a mirror over link {name!r}")
        if info.is_mirror:
            await self._metadata.propose(PromoteMirrorTopic(name=topic))
        return {"link": name, "topic": topic, "promoted": True}

    async def verify(self, name: str, topic: str | None, start: int, *, repair: bool,
                     deep: bool = False) -> MirrorVerifyReport:
        """The full sync of a link's mirror partitions (multiraft/node/mirror_verify.py)."""
        return await self.verifier.verify(name, topic, start, repair=repair, deep=deep)

    def link(self, name: str) -> MirrorLink:
        link = self._catalog.catalog.mirror_links.get(name)
        if link is None:
            raise UnknownMirrorLink(f"mirror link {name!r} does not exist")
        return link

    def links(self) -> list[dict[str, object]]:
        catalog = self._catalog.catalog
        return [{**link.describe(), "mirror_topics": catalog.mirror_topics(name)}
                for name, link in sorted(catalog.mirror_links.items())]

    async def _described(self, name: str) -> dict[str, object]:
        await self._metadata.sync_catalog()
        return {**self.link(name).describe(), "mirror_topics": self._catalog.catalog.mirror_topics(name)}

    # ---- status ---------------------------------------------------------------------

    async def status(self, name: str) -> dict[str, Any]:
        """The link, its discovery (from the metadata leader) and every pull of it (from
        the nodes leading its partitions); a node that does not answer is named."""
        link = self.link(name)
        catalog = self._catalog.catalog
        nodes = sorted(n for n in catalog.nodes if n == self.id or self._routing.is_live(n))
        answers = await asyncio.gather(*(self._node_status(n, name) for n in nodes), return_exceptions=True)
        pulls: dict[tuple[str, int], dict[str, Any]] = {}
        verifies: dict[tuple[str, int], dict[str, Any]] = {}
        truncated: dict[tuple[str, int], list[dict[str, Any]]] = {}  # resyncs each node proposed, by partition
        discovery: dict[str, Any] | None = None
        unreachable = []
        for node, found in zip(nodes, answers, strict=True):
            if isinstance(found, BaseException):
                unreachable.append(node)
                continue
            discovery = found.get("discovery") or discovery
            for pull in found["pulls"]:
                pulls[(pull["topic"], pull["partition"])] = {**pull, "node": node}
            for verdict in found.get("verifies", []):  # the latest full sync of each partition, wherever it ran
                key = (verdict["topic"], verdict["partition"])
                if key not in verifies or verifies[key]["at_ms"] < verdict["at_ms"]:
                    verifies[key] = verdict
            for resyncs in found.get("truncated_resyncs", []):  # absent from a node of an earlier version
                truncated.setdefault((resyncs["topic"], resyncs["partition"]), []).append({**resyncs, "node": node})
        topics = []
        for topic in sorted((t for t in catalog.topics.values() if t.mirror_link == name), key=lambda t: t.name):
            partitions = [{**pulls.get((topic.name, p.partition), {"partition": p.partition, "state": "unknown"}),
                           "last_verify": _verify_view(verifies.get((topic.name, p.partition))),
                           **_truncated_view(truncated.get((topic.name, p.partition), []))}
                          for p in topic.partitions]
            topics.append({"topic": topic.name, "promoted": topic.mirror_promoted, "partitions": partitions})
        return {**link.describe(), "discovery": discovery, "topics": topics, "nodes_unreachable": unreachable}

    async def _node_status(self, node: int, name: str) -> dict[str, Any]:
        if node == self.id:
            return self.local_status(name)
        body = await call_peer(self._rpc, node, "mirror.status", json.dumps({"link": name}).encode(),
                               STATUS_CALL_TIMEOUT_S, write=False)
        return json.loads(body)

    def local_status(self, name: str) -> dict[str, Any]:
        discovery = self.discovery.get(name) if self._metadata_leader() else None
        topics = set(self._catalog.catalog.mirror_topics(name))
        return {"discovery": discovery.view() if discovery is not None else None,
                "pulls": [s.view() for s in self.pulls.status.values() if s.link == name],
                "verifies": [v.to_json() for (topic, _), v in sorted(self.verifier.last.items()) if topic in topics],
                "truncated_resyncs": self.pulls.truncated.partitions(name)}

    async def _serve_status(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> dict[str, Any]:
            request = json.loads(body)
            return self.local_status(str(request["link"]))
        return await answer(work(), lambda value: json.dumps(value).encode())

    # ---- discovery (the metadata leader) ----------------------------------------------

    def _metadata_leader(self) -> bool:
        return self._routing.leader_of(0) == self.id  # type: ignore[arg-type]

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(DISCOVER_INTERVAL_S)
                links = self._catalog.catalog.mirror_links
                for name in [n for n, (link, _) in self._clients.items() if links.get(n) != link]:
                    await self._clients.pop(name)[1].close()
                self.discovery = {n: d for n, d in self.discovery.items() if n in links}
                if not self._metadata_leader():
                    continue
                for link in list(links.values()):
                    discovery = self.discovery.setdefault(link.name, Discovery())
                    if link.state is LinkState.RUNNING and time.monotonic() >= discovery.retry_at:
                        await self._discover(link, discovery)
        finally:
            for _, client in self._clients.values():
                await client.close()
            self._clients.clear()

    async def _discover(self, link: MirrorLink, discovery: Discovery) -> None:
        held = self._clients.get(link.name)
        if held is None or held[0] != link:
            client = source_client(link, self._rng, self.pulls.local_host)
            held = self._clients[link.name] = (link, client)
        client = held[1]
        try:
            listed = await client.get_json("/v1/topics")
            counts = {t["name"]: t.get("partitions") for t in listed["topics"]
                      if isinstance(t, dict) and isinstance(t.get("name"), str)}
            names = sorted(n for n in counts if pattern_matches(link.pattern, n))[:TOPICS_PER_LINK_MAX]
            invalid = {n: "not a valid topic name" for n in names if not TOPIC_NAME_PATTERN.fullmatch(n)}
            names = [n for n in names if n not in invalid]
            catalog = self._catalog.catalog
            growing, not_grown = listed_growth(catalog, link.name, {n: counts[n] for n in names})
            refused = invalid | not_grown | {n: why for n, why in discovery.refused.items()
                                             if n in names and (n not in catalog.topics or n in growing)}
            conflicts = [n for n in names if n in catalog.topics and catalog.topics[n].mirror_link != link.name]
            # Those refused last round go last: a refusal repeated never starves the others.
            work = sorted([n for n in names if n not in catalog.topics] + sorted(growing),
                          key=lambda n: n in discovery.refused)[:CREATES_PER_ROUND_MAX]
            budget = ReadBudget()
            for name in work:
                if budget.left == 0:
                    break  # the others wait for the next round (what was refused of them still shown)
                why = await (self._grow_mirror(client, link, name, growing[name], budget) if name in growing
                             else self._create_mirror(client, link, name, budget))
                if why is None:
                    refused.pop(name, None)
                else:
                    refused[name] = why
        except (SourceError, ClientError, KeyError, TypeError, ValueError) as error:
            discovery.failures += 1
            discovery.last_error = client.scrub(str(error))
            discovery.retry_at = time.monotonic() + backoff_s(discovery.failures, self._rng)
            return
        discovery.failures, discovery.last_error, discovery.refused = 0, None, refused
        discovery.source_topics, discovery.conflicts = len(names), conflicts[:CONFLICTS_SHOWN_MAX]
        discovery.last_run_ms = int(time.time() * 1000)

    async def _create_mirror(self, client: SourceClient, link: MirrorLink, name: str,
                             budget: ReadBudget) -> str | None:
        """Make `name` a mirror topic of `link`, with as many of its source's partitions as
        `budget` has reads left (the others follow as growths); or why the source's
        description is refused."""
        assert TOPIC_NAME_PATTERN.fullmatch(name)  # checked by the caller: it goes into URL paths
        try:
            described = await client.get_json(f"/v1/topics/{name}")
        except SourceError as error:  # this topic's (deleted since the listing, an error of its own): the others go on
            return f"the source's description was not read: {client.scrub(str(error))}"
        if not isinstance(described, dict) or not isinstance(described.get("partitions"), list):
            return "the source's description has no partition list"
        count = len(described["partitions"])
        if not 1 <= count <= PARTITIONS_MAX:  # before `count` source reads, one each
            return f"the source says {count} partitions; a topic has 1..{PARTITIONS_MAX}"
        if not isinstance(described.get("config"), dict):
            return "the source's description has no config"
        said_factor = described.get("replication_factor")
        if not is_int(said_factor):
            return "the source's description has no replication factor"
        config = {k: v for k, v in described["config"].items() if k in TOPIC_CONFIG_KEYS}
        made = min(count, budget.left)  # the others in the next rounds, as a growth
        try:
            starts = await budget.log_starts(client, name, range(made))
        except SourceError as error:  # this topic's (a partition not led yet, a bad answer): the others go on
            return f"a partition's log start was not read: {client.scrub(str(error))}"
        catalog = self._catalog.catalog
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self._metadata.placeable_nodes()]
        factor = max(1, min(said_factor, len(nodes)))
        try:
            assignments = place_replicas(nodes, made, factor, start=catalog.next_group_id,
                                         drained=catalog.drained_nodes())
            self._metadata.check_files(assignments)  # as a topic made by hand
        except InvalidRequest as error:  # no live node, or no descriptors left for the new replicas
            return f"the sink cannot place its {made} partitions: {error}"
        identities = source_groups(described, range(made)) if records_source_identity(catalog) else None
        try:  # the source's answers are in it (config, start offsets): a bad one refuses this topic only
            command = CreateMirrorTopic(name=name, link=link.name, replication_factor=factor, config=config,
                                        assignments=tuple(tuple(r) for r in assignments), start_offsets=tuple(starts),
                                        source_groups=identities)
        except InvalidRequest as error:
            return f"the source's description is refused: {client.scrub(str(error))}"
        try:
            await self._metadata.propose(command)
        except ClientError as error:
            if error.code not in CATALOG_REFUSALS:
                raise
            if name in self._catalog.catalog.topics:
                return None  # made meanwhile (by the previous metadata leader, or by hand): the next round looks
            return f"the catalog refused the mirror: {error}"
        self._logger.info("mirror_topic_created", link=link.name, topic=name, partitions=made,
                          source_partitions=count, start_offsets=starts[:8])
        return None

    async def _grow_mirror(self, client: SourceClient, link: MirrorLink, name: str, said: int,
                           budget: ReadBudget) -> str | None:
        """Grow mirror `name` toward the source's `said` partitions (checked by `listed_growth`),
        by as many as `budget` has reads left (the others next round), each new one starting
        at its source partition's log start offset now and, when `records_source_identity`
        allows, recording its source partition's identity from the source's description (as a
        mirror made does); or why not."""
        assert TOPIC_NAME_PATTERN.fullmatch(name) and said <= PARTITIONS_MAX  # checked by the caller
        current = mirror_size(self._catalog.catalog, name, link.name)
        if current is None or current >= said:
            return None  # promoted, deleted or grown since the listing: the next round looks again
        count = min(said, current + budget.left)  # the source has at least this many: a partial growth is one
        identities = None
        if records_source_identity(self._catalog.catalog):
            try:  # read before the log starts: a failure here spends none of the round's budget
                described = await client.get_json(f"/v1/topics/{name}")
            except SourceError as error:  # this topic's, as a creation's: the others go on
                return f"the source has {said} partitions; its description was not read: {client.scrub(str(error))}"
            if not isinstance(described, dict) or not isinstance(described.get("partitions"), list) or len(
                    described["partitions"]) < count:  # a source node whose catalog lags the listing's
                return f"the source has {said} partitions; its description does not show the new ones yet"
            identities = source_groups(described, range(current, count))  # None: grown without, as a creation
        try:
            starts = await budget.log_starts(client, name, range(current, count))
        except SourceError as error:  # this topic's (a new partition not led yet, say): the others go on
            return f"the source has {said} partitions; a new one's log start was not read: {client.scrub(str(error))}"
        catalog = self._catalog.catalog
        if mirror_size(catalog, name, link.name) != current:  # changed during the reads
            return None
        topic = catalog.topics[name]
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self._metadata.placeable_nodes()]
        try:
            assignments = place_replicas(nodes, count - current, topic.replication_factor,
                                         start=catalog.next_group_id, existing=[p.replicas for p in topic.partitions],
                                         drained=catalog.drained_nodes())
            self._metadata.check_files(assignments)  # as partitions added by hand
        except InvalidRequest as error:  # too few live nodes, or no descriptors left for the new replicas
            return f"the source has {said} partitions; the new ones cannot be placed here: {error}"
        try:  # the source's start offsets are in it: a bad one refuses this topic only
            command = GrowMirrorTopic(name=name, link=link.name, count=count, assignments=tuple(tuple(r) for r in assignments),
                                      start_offsets=tuple(starts), source_groups=identities)
        except InvalidRequest as error:
            return f"the source has {said} partitions; their log starts are refused: {error}"
        try:
            await self._metadata.propose(command)
        except ClientError as error:
            if error.code not in CATALOG_REFUSALS:
                raise
            if mirror_size(self._catalog.catalog, name, link.name) != current:
                return None  # promoted, deleted or grown meanwhile (the previous leader's growth): the next round looks
            return f"the source has {said} partitions; the catalog refused the growth: {error}"
        self._logger.info("mirror_topic_grown", link=link.name, topic=name, partitions=count, before=current,
                          source_partitions=said, start_offsets=starts[:8])
        return None


def records_source_identity(catalog: Catalog) -> bool:
    """Whether discovery records the source partitions' identities in the mirror topics it makes
    or grows (`CreateMirrorTopic.source_groups`, `GrowMirrorTopic.source_groups`, which a
    truncated resync needs): only once `catalog` (the sink's) is finalized at feature level 2
    (`MIRROR_FOLLOW`, multiraft/metadata/features.py). A node of an earlier version refuses
    such a command (its `decode_command` fails: its metadata replica fails and reopens into
    the entry until upgraded), and restoring a snapshot it drops them silently; below the
    level a mirror is made exactly as before, its command byte for byte the old one."""
    return supports(catalog, FeatureLevel.MIRROR_FOLLOW)


def source_groups(described: dict[str, Any], partitions: range) -> tuple[int, ...] | None:
    """The group ids of the source's `partitions` as its description gives them: the mirror's
    record of what it copies (a resync after the source truncated past it needs the source's
    equal to it: multiraft/node/mirror_truncated.py). None when one is missing or malformed:
    the mirror is made or grown all the same, and such a resync then waits for an operator."""
    try:
        return tuple(parse_partition_view(described, p).group_id for p in partitions)
    except SourceError:
        return None


def _verify_view(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """A partition's last full sync as its status shows it: when, the verdict, what was compared
    and repaired (the whole verdict is in the verify's own answer)."""
    if verdict is None:
        return None
    return {key: verdict[key] for key in ("at_ms", "status", "lo", "hi", "ranges", "nodes_compared", "spans",
                                          "repair", "seconds", "leader")}


def _truncated_view(resyncs: list[dict[str, Any]]) -> dict[str, Any]:
    """A partition's resyncs because the source truncated past it (docs/mirror.md, "The source
    truncated past a mirror"): how many the sink's nodes proposed (each counts its own, in
    memory), and the last one."""
    last = max(resyncs, key=lambda r: r["at_ms"], default=None)
    return {"truncated_resyncs": sum(r["count"] for r in resyncs),
            "last_truncated_resync": {key: last[key] for key in ("at_ms", "deleted", "start_offset", "old_group",
                                                                  "node")} if last is not None else None}
