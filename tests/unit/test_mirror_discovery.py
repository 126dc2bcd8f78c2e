"""Goal: one link's discovery round (the metadata leader's `MirrorLinks._discover`) trusts
nothing a source answers and lets no topic stall the others: a bad answer about one topic
(a log start no log has) is that topic's refusal, named in `refused`, never a failed round,
and the link's other topics are created or grown in the same round.

The round runs as the node runs it, against a fake source client (its log answers go
through the real header parser) and a fake metadata leader that checks and applies each
proposal on a real catalog, through the codec, as group 0's replicas would.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.metadata.catalog import ID_MAX, Catalog, NodeInfo
from multiraft.metadata.commands import Command, DeleteTopic, decode_command, encode_command
from multiraft.metadata.features import SUPPORTED_LEVEL, require_command_level
from multiraft.metadata.mirror_commands import (
    CreateMirrorTopic,
    GrowMirrorTopic,
    PromoteMirrorTopic,
)
from multiraft.node import mirror_follow, mirror_links, open_files
from multiraft.node.mirror_links import Discovery, MirrorLinks
from multiraft.node.mirror_source import LogChunk, SourceError, parse_log_answer
from raftlog.types import GroupId, Index, NodeId
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog, _finalized


class Source:
    """A source cluster as discovery reads it: each topic's partition count, its description
    (`described` overrides fields), and each partition's log start as its read answers it
    (header text: the real parser reads it). A description given as a `SourceError` is
    raised, as a source answering that topic with an error."""

    def __init__(self, topics: dict[str, int], starts: dict[tuple[str, int], str] | None = None,
                 described: dict[str, Any] | None = None) -> None:
        self.topics = topics
        self.starts = starts or {}
        self.described = described or {}
        self.reads: list[tuple[str, int]] = []

    async def get_json(self, path: str, params: dict[str, str] | None = None, wait_s: float = 0.0) -> Any:
        if path == "/v1/topics":
            return {"topics": [{"name": n, "partitions": c} for n, c in self.topics.items()]}
        name = path.removeprefix("/v1/topics/")
        if isinstance(self.described.get(name), SourceError):
            raise self.described[name]
        return {"name": name, "partitions": [{"partition": p} for p in range(self.topics[name])], "config": {},
                "replication_factor": 1, **self.described.get(name, {})}

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        self.reads.append((topic, partition))
        start = self.starts.get((topic, partition), "0")
        return parse_log_answer(b"", {"Raftlog-Next-Offset": start, "Raftlog-High-Watermark": start,
                                      "Raftlog-Log-Start-Offset": start})

    def scrub(self, text: str) -> str:
        return text

    async def close(self) -> None:
        pass


class Metadata:
    """The metadata leader's proposals: checked, then applied to `catalog` through the codec
    after `racing[name]` (entries another leader, or an operator, put before the proposal
    about topic `name`), the refusal raised."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.racing: dict[str, list[Command]] = {}
        self.proposed: list[Command] = []
        self.files_limit = 1 << 20  # this node's open-files limit
        self._index = 1000

    def check_files(self, assignments: list[list[NodeId]]) -> None:
        open_files.check_new_replicas(assignments, self.files_limit)

    def placeable_nodes(self) -> list[NodeInfo]:
        return self.catalog.placeable_nodes()  # no node below the feature level here

    async def propose(self, command: Command) -> None:
        require_command_level(self.catalog, command)  # as MetadataOps.propose
        self.catalog.validate(command)
        for entry in [*self.racing.pop(getattr(command, "name", ""), []), command]:
            self._index += 1
            result = self.catalog.apply(Index(self._index), decode_command(encode_command(entry)))
            if result.error is not None:
                raise result.error
        self.proposed.append(command)


def _discovery(catalog: Catalog, source: Source, level: int = SUPPORTED_LEVEL) -> tuple[MirrorLinks, Metadata]:
    """The metadata leader's discovery of `catalog`, finalized at feature `level` first."""
    if level:
        _finalized(catalog, level)
    metadata = Metadata(catalog)
    logger = SimpleNamespace(info=lambda *a, **k: None)
    links = MirrorLinks(NodeId(1), SimpleNamespace(catalog=catalog), metadata, None, SimpleNamespace(  # type: ignore[arg-type]
        register=lambda *a: None), None, logger, None)  # type: ignore[arg-type]
    links._clients[LINK.name] = (catalog.mirror_links[LINK.name], source)  # type: ignore[assignment]
    return links, metadata


async def _round(links: MirrorLinks, discovery: Discovery) -> Discovery:
    await links._discover(links._catalog.catalog.mirror_links[LINK.name], discovery)
    return discovery


@pytest.mark.parametrize("headers", [
    {"Raftlog-Log-Start-Offset": "-1"}, {"Raftlog-Log-Start-Offset": str(2**64), "Raftlog-High-Watermark": str(2**64)},
    {"Raftlog-Log-Start-Offset": str(2**63)}, {"Raftlog-High-Watermark": "-5"}, {"Raftlog-Next-Offset": str(2**63)},
    {"Raftlog-Log-Start-Offset": "11"},  # above the high watermark (10)
])
def test_a_log_answer_with_an_offset_no_log_has_is_a_source_error(headers: dict[str, str]) -> None:
    good = {"Raftlog-Next-Offset": "10", "Raftlog-High-Watermark": "10", "Raftlog-Log-Start-Offset": "3"}
    assert parse_log_answer(b"", good).log_start_offset == 3
    assert parse_log_answer(b"", {**good, "Raftlog-Log-Start-Offset": "10"}).log_start_offset == 10  # empty
    edge = str(2**63 - 1)
    assert parse_log_answer(b"", {**good, "Raftlog-High-Watermark": edge, "Raftlog-Next-Offset": edge}).high_watermark \
        == 2**63 - 1
    with pytest.raises(SourceError):
        parse_log_answer(b"", {**good, **headers})


@pytest.mark.asyncio
async def test_a_hostile_log_start_refuses_its_topic_and_the_round_goes_on() -> None:
    # `orders` grew to 3 at the source, whose partition 2 says its log starts at -1; the new
    # `orders-a` says 2**64. Each is refused by name, and so are new topics whose description
    # the sink cannot take (a config value out of bounds, no replication factor) or read (the
    # source answers it with an error); `orders-b`, after them, is created.
    catalog = _catalog(LINK, MIRROR)
    source = Source({"orders": 3, "orders-a": 1, "orders-a2": 1, "orders-a3": 1, "orders-a4": 1, "orders-b": 2},
                    {("orders", 2): "-1", ("orders-a", 0): str(2**64), ("orders-b", 0): "5", ("orders-b", 1): "7"},
                    {"orders-a2": {"config": {"retention_ms": -5}}, "orders-a3": {"replication_factor": None},
                     "orders-a4": SourceError("the source answered /v1/topics/orders-a4 with 500")})
    links, _ = _discovery(catalog, source)
    discovery = await _round(links, Discovery())
    assert (discovery.failures, discovery.last_error) == (0, None)
    assert sorted(discovery.refused) == ["orders", "orders-a", "orders-a2", "orders-a3", "orders-a4"]
    assert all("log start was not read" in discovery.refused[n] and "outside 0..2**63-1" in discovery.refused[n]
               for n in ("orders", "orders-a"))
    assert "retention_ms" in discovery.refused["orders-a2"]
    assert "no replication factor" in discovery.refused["orders-a3"]
    assert "description was not read" in discovery.refused["orders-a4"] and "500" in discovery.refused["orders-a4"]
    assert len(catalog.topic("orders").partitions) == 2
    assert not {"orders-a", "orders-a2", "orders-a3", "orders-a4"} & set(catalog.topics)
    assert [p.start_offset for p in catalog.topic("orders-b").partitions] == [5, 7]
    # The next round tries them again, and goes on refusing them, still without failing.
    source.reads.clear()
    await _round(links, discovery)
    assert (discovery.failures, sorted(discovery.refused)) == (0, ["orders", "orders-a", "orders-a2", "orders-a3",
                                                                   "orders-a4"])
    assert sorted(source.reads) == [("orders", 2), ("orders-a", 0), ("orders-a2", 0)]


# What another metadata leader's entries (or an operator) put in group 0's log between the
# round's look at the catalog and its proposal's apply.
PROMOTED = PromoteMirrorTopic(name="orders")
DELETED = DeleteTopic(name="orders")
GROWN_TO_3 = GrowMirrorTopic(name="orders", link="dr", count=3, assignments=((NodeId(1),),), start_offsets=(9,))
GROWN_TO_4 = GrowMirrorTopic(name="orders", link="dr", count=4, assignments=((NodeId(1),),) * 2,
                             start_offsets=(9, 9))
SECOND = CreateMirrorTopic(name="orders2", link="dr", replication_factor=1, config={}, assignments=((NodeId(1),),),
                           start_offsets=(0,))


@pytest.mark.parametrize(("said", "racing", "after"), [
    (3, PROMOTED, 2), (3, DELETED, None),
    (3, GROWN_TO_3, 3),  # the same growth, proposed by the previous metadata leader
    (3, GROWN_TO_4, 4), (4, GROWN_TO_3, 3),  # the source grew twice, each leader saw one count
])
@pytest.mark.asyncio
async def test_a_growth_overtaken_before_its_apply_is_no_failure(said: int, racing: Command, after: int | None) -> None:
    catalog = _catalog(LINK, MIRROR, SECOND)
    links, metadata = _discovery(catalog, Source({"orders": said, "orders2": 2}))
    metadata.racing["orders"] = [racing]
    discovery = await _round(links, Discovery())
    assert (discovery.failures, discovery.last_error, discovery.refused) == (0, None, {})
    assert len(catalog.topic("orders2").partitions) == 2  # the round went on after it
    topic = catalog.topics.get("orders")
    assert (len(topic.partitions) if topic is not None else None) == after
    if after is not None and topic is not None and topic.is_mirror and after < said:
        await _round(links, discovery)  # the next round looks again: grown to the source's count
        assert len(catalog.topic("orders").partitions) == said and discovery.refused == {}


@pytest.mark.asyncio
async def test_a_creation_overtaken_by_the_same_creation_is_no_failure() -> None:
    catalog = _catalog(LINK)
    links, metadata = _discovery(catalog, Source({"orders": 2}))
    metadata.racing["orders"] = [MIRROR]  # the previous metadata leader made it
    discovery = await _round(links, Discovery())
    assert (discovery.failures, discovery.refused) == (0, {})
    assert catalog.topic("orders").partitions[1].start_offset == 500  # the previous leader's


@pytest.mark.asyncio
async def test_a_growth_the_catalog_refuses_on_its_own_is_named() -> None:
    catalog = _catalog(LINK, MIRROR)
    catalog.next_group_id = GroupId(ID_MAX)
    links, _ = _discovery(catalog, Source({"orders": 4}))  # two new partitions, one group id left
    discovery = await _round(links, Discovery())
    assert discovery.failures == 0 and "group ids are exhausted" in discovery.refused["orders"]


@pytest.mark.asyncio
async def test_a_mirror_made_or_grown_past_the_open_files_limit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Room for 2 new replicas on the one node: growing `orders` by 3 and making `orders-a` with
    # 3 partitions are refused by name, as a topic made by hand would be; `orders-b` (2) fits.
    catalog = _catalog(LINK, MIRROR)
    links, metadata = _discovery(catalog, Source({"orders": 5, "orders-a": 3, "orders-b": 2}))
    monkeypatch.setattr(open_files, "open_now", lambda: 0)
    metadata.files_limit = open_files.RESERVED_FDS + 2
    discovery = await _round(links, Discovery())
    assert discovery.failures == 0 and sorted(discovery.refused) == ["orders", "orders-a"]
    assert all("open-files limit" in why for why in discovery.refused.values())
    assert len(catalog.topic("orders").partitions) == 2 and "orders-a" not in catalog.topics
    assert len(catalog.topic("orders-b").partitions) == 2


@pytest.mark.asyncio
async def test_a_round_reads_at_most_its_budget_and_the_next_rounds_go_on() -> None:
    # One link's round makes at most READS_PER_ROUND_MAX log-start reads, its creations and
    # growths together, so a slow source holds the other links up for that many at most. A
    # mirror with more partitions than are left is made, or grown, by those read; the next
    # rounds grow it to the source's count, each new partition at its own source log start.
    budget = mirror_follow.READS_PER_ROUND_MAX
    said = {"orders-big": budget + 10, "orders": 2 + budget // 2}
    source = Source(said, {(t, p): str(p * 10 + 1) for t, count in said.items() for p in range(count)})
    catalog = _catalog(LINK, MIRROR)
    links, _ = _discovery(catalog, source)
    discovery = Discovery()
    sizes, reads = [], []
    for _ in range(3):
        source.reads.clear()
        await _round(links, discovery)
        assert (discovery.failures, discovery.refused) == (0, {})
        sizes.append((len(catalog.topic("orders").partitions), len(catalog.topic("orders-big").partitions)))
        reads.append(len(source.reads))
    # Round 1: the new topic takes the whole budget; `orders` waits. Round 2: both grow to the
    # source's counts. Round 3: nothing left to read.
    assert sizes == [(2, budget), (2 + budget // 2, budget + 10), (2 + budget // 2, budget + 10)]
    assert reads == [budget, budget // 2 + 10, 0]
    assert [p.start_offset for p in catalog.topic("orders-big").partitions] == [p * 10 + 1 for p in range(budget + 10)]
    assert [p.start_offset for p in catalog.topic("orders").partitions][2:] == [
        p * 10 + 1 for p in range(2, 2 + budget // 2)]


def _mirrors(count: int) -> list[CreateMirrorTopic]:
    """`count` one-partition mirrors of the link, `orders-g00` on."""
    return [CreateMirrorTopic(name=f"orders-g{i:02}", link="dr", replication_factor=1, config={},
                              assignments=((NodeId(1),),), start_offsets=(0,)) for i in range(count)]


@pytest.mark.asyncio
async def test_creations_and_growths_share_the_bound_on_topics_a_round() -> None:
    # 10 new topics and 10 mirrors grown at the source: 16 of them a round (CREATES_PER_ROUND_MAX),
    # the creations first, then the growths by name; the other 4 growths the next round.
    catalog = _catalog(LINK, *_mirrors(10))
    source = Source({**{f"orders-n{i:02}": 1 for i in range(10)}, **{f"orders-g{i:02}": 2 for i in range(10)}})
    links, _ = _discovery(catalog, source)
    discovery = await _round(links, Discovery())
    assert mirror_links.CREATES_PER_ROUND_MAX == 16 == len(source.reads)
    assert [t for t, _ in source.reads] == [f"orders-n{i:02}" for i in range(10)] + [f"orders-g{i:02}" for i in range(6)]
    assert [len(catalog.topic(f"orders-g{i:02}").partitions) for i in range(10)] == [2] * 6 + [1] * 4
    source.reads.clear()
    await _round(links, discovery)
    assert source.reads == [(f"orders-g{i:02}", 1) for i in range(6, 10)] and discovery.refused == {}


@pytest.mark.asyncio
async def test_a_growth_refused_last_round_goes_last() -> None:
    # 17 mirrors grew at the source; `orders-g00`'s new partition says no offset. Round 1 takes
    # the first 16 by name: g00 refused, g01..g15 grown. Round 2 takes g16 before g00, so a
    # refusal repeated every round never holds the others back.
    catalog = _catalog(LINK, *_mirrors(17))
    source = Source({f"orders-g{i:02}": 2 for i in range(17)}, {("orders-g00", 1): "-1"})
    links, _ = _discovery(catalog, source)
    discovery = await _round(links, Discovery())
    assert list(discovery.refused) == ["orders-g00"] and discovery.failures == 0
    assert len(catalog.topic("orders-g16").partitions) == 1
    source.reads.clear()
    await _round(links, discovery)
    assert source.reads == [("orders-g16", 1), ("orders-g00", 1)]
    assert list(discovery.refused) == ["orders-g00"] and len(catalog.topic("orders-g16").partitions) == 2
