"""Mirror links: their admin operations, the discovery of source topics, their status.

- Admin (any node): create, pause, resume and delete links, promote a mirror topic:
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
  shown in the discovery's `refused`.
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

from multiraft.errors import NotAMirror, UnknownMirrorLink
from multiraft.metadata.commands import PARTITIONS_MAX, TOPIC_CONFIG_KEYS
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    DeleteMirrorLink,
    LinkState,
    MirrorLink,
    PromoteMirrorTopic,
    SetMirrorLinkState,
    pattern_matches,
)
from multiraft.metadata.patterns import TOPIC_NAME_PATTERN
from multiraft.metadata.placement import PlacementNode, place_replicas
from multiraft.node.mirror_source import SourceClient, SourceError, backoff_s, source_client
from multiraft.node.routing import call_peer
from multiraft.transport.rpc import answer
from raftlog.errors import ClientError
from raftlog.types import NodeId

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.mirror_pull import MirrorPulls
    from multiraft.node.mirror_verify import MirrorVerifier, MirrorVerifyReport
    from multiraft.node.routing import Routing
    from multiraft.transport.rpc import Rpc

DISCOVER_INTERVAL_S = 1.0
TOPICS_PER_LINK_MAX = 1000  # source topics one link mirrors
CREATES_PER_ROUND_MAX = 16
STATUS_CALL_TIMEOUT_S = 2.0
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
        topics = []
        for topic in sorted((t for t in catalog.topics.values() if t.mirror_link == name), key=lambda t: t.name):
            partitions = [{**pulls.get((topic.name, p.partition), {"partition": p.partition, "state": "unknown"}),
                           "last_verify": _verify_view(verifies.get((topic.name, p.partition)))}
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
                "verifies": [v.to_json() for (topic, _), v in sorted(self.verifier.last.items()) if topic in topics]}

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
            names = sorted(t["name"] for t in listed["topics"] if isinstance(t, dict) and isinstance(t.get("name"), str)
                           and pattern_matches(link.pattern, t["name"]))[:TOPICS_PER_LINK_MAX]
            invalid = {n: "not a valid topic name" for n in names if not TOPIC_NAME_PATTERN.fullmatch(n)}
            names = [n for n in names if n not in invalid]
            catalog = self._catalog.catalog
            refused = invalid | {n: why for n, why in discovery.refused.items() if n in names and n not in catalog.topics}
            conflicts = [n for n in names if n in catalog.topics and catalog.topics[n].mirror_link != link.name]
            # Those refused last round go last: a refusal repeated never starves the others.
            missing = sorted((n for n in names if n not in catalog.topics),
                             key=lambda n: n in discovery.refused)[:CREATES_PER_ROUND_MAX]
            for name in missing:
                why = await self._create_mirror(client, link, name)
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

    async def _create_mirror(self, client: SourceClient, link: MirrorLink, name: str) -> str | None:
        """Make `name` a mirror topic of `link`; or why the source's description is refused."""
        assert TOPIC_NAME_PATTERN.fullmatch(name)  # checked by the caller: it goes into URL paths
        described = await client.get_json(f"/v1/topics/{name}")
        if not isinstance(described, dict) or not isinstance(described.get("partitions"), list):
            return "the source's description has no partition list"
        count = len(described["partitions"])
        if not 1 <= count <= PARTITIONS_MAX:  # before `count` source reads, one each
            return f"the source says {count} partitions; a topic has 1..{PARTITIONS_MAX}"
        if not isinstance(described.get("config"), dict):
            return "the source's description has no config"
        config = {k: v for k, v in described["config"].items() if k in TOPIC_CONFIG_KEYS}
        starts = []
        for partition in range(count):
            chunk = await client.read_log(name, partition, 0, 1, 0)
            starts.append(chunk.log_start_offset)
        catalog = self._catalog.catalog
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self._metadata.placeable_nodes()]
        factor = max(1, min(int(described["replication_factor"]), len(nodes)))
        assignments = place_replicas(nodes, count, factor, start=catalog.next_group_id,
                                     drained=catalog.drained_nodes())
        await self._metadata.propose(CreateMirrorTopic(
            name=name, link=link.name, replication_factor=factor, config=config,
            assignments=tuple(tuple(r) for r in assignments), start_offsets=tuple(starts)))
        self._logger.info("mirror_topic_created", link=link.name, topic=name, partitions=count,
                          start_offsets=starts[:8])
        return None


def _verify_view(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """A partition's last full sync as its status shows it: when, the verdict, what was compared
    and repaired (the whole verdict is in the verify's own answer)."""
    if verdict is None:
        return None
    return {key: verdict[key] for key in ("at_ms", "status", "lo", "hi", "ranges", "nodes_compared", "spans",
                                          "repair", "seconds", "leader")}
