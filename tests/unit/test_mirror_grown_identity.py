"""Goal: a partition a mirror grew with (`GrowMirrorTopic`, its source's partition increase)
records its source partition's identity as one the mirror was made with does
(`GrowMirrorTopic.source_groups` -> `PartitionInfo.source_group`): discovery reads it from the
source's description when `records_source_identity` allows, and a truncated resync of a grown
partition then checks it as it checks a made one's (docs/mirror.md "The source truncated past
a mirror"). Without identities the growth is the command from before they existed, byte for
byte (an older node applies it).

Over the helpers of the two sides: tests/unit/test_mirror_discovery.py's discovery round
(a fake source, a real catalog behind the codec), tests/unit/test_mirror_truncated.py's pull
over a fake source and registry.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from multiraft.errors import InvalidRequest
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import decode_command, encode_command
from multiraft.metadata.mirror_commands import GrowMirrorTopic, ResyncMirrorPartition
from multiraft.node import mirror_links
from multiraft.node.mirror_links import Discovery
from raftlog.types import Index, NodeId
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog
from tests.unit.test_mirror_discovery import Source, _discovery, _round
from tests.unit.test_mirror_growth import FOLLOW
from tests.unit.test_mirror_pull import FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)
from tests.unit.test_mirror_truncated import _setup

asynchronous = pytest.mark.asyncio(loop_scope="function")
# FOLLOW (2 -> 4 partitions) as it was encoded before identities existed.
OLDER_GROWTH = (b'{"assignments":[[1],[1]],"count":4,"link":"dr","name":"orders","start_offsets":[40,0],'
                b'"type":"grow_mirror_topic","v":1}')
RECORDED = dataclasses.replace(FOLLOW, source_groups=(12, 2**63 - 1))


def _described(count: int, groups: int = 70) -> dict[str, Any]:
    """A source description's partitions 0..count-1, partition p's group id `groups + p`."""
    return {"partitions": [{"partition": p, "group_id": groups + p, "log_start_offset": None, "high_watermark": None,
                            "replicas": [1]} for p in range(count)]}


def test_a_growth_round_trips_with_and_without_identities_and_the_catalog_keeps_them() -> None:
    for command in (FOLLOW, RECORDED):
        assert decode_command(encode_command(command)) == command
    assert encode_command(FOLLOW) == OLDER_GROWTH  # written as before the field existed
    assert decode_command(OLDER_GROWTH) == FOLLOW
    assert json.loads(encode_command(RECORDED))["source_groups"] == [12, 2**63 - 1]
    for bad in ((12,), (12, 13, 14), (0, 1), (True, 1), (2**63, 1), ("12", 1), [12, 13]):  # one per new partition
        with pytest.raises(InvalidRequest, match="source_groups"):
            dataclasses.replace(FOLLOW, source_groups=bad)  # type: ignore[arg-type]
    grown = _catalog(LINK, MIRROR, RECORDED)
    assert [p.source_group for p in grown.topic("orders").partitions] == [None, None, 12, 2**63 - 1]
    assert Catalog.restore(grown.snapshot()).topics == grown.topics
    assert [p.source_group for p in _catalog(LINK, MIRROR, FOLLOW).topic("orders").partitions] == [None] * 4


@pytest.mark.asyncio
@pytest.mark.parametrize("records", [True, False])
async def test_a_growth_records_its_new_partitions_identities_when_allowed(
        monkeypatch: pytest.MonkeyPatch, records: bool) -> None:
    monkeypatch.setattr(mirror_links, "records_source_identity", lambda _: records)
    catalog = _catalog(LINK, MIRROR)
    links, metadata = _discovery(catalog, Source({"orders": 4}, {("orders", 2): "40"}, {"orders": _described(4)}))
    discovery = await _round(links, Discovery())
    assert (discovery.failures, discovery.refused) == (0, {})
    [grown] = metadata.proposed
    assert isinstance(grown, GrowMirrorTopic) and (grown.count, grown.start_offsets) == (4, (40, 0))
    assert grown.source_groups == ((72, 73) if records else None)
    assert (b"source_groups" in encode_command(grown)) is records
    assert [p.source_group for p in catalog.topic("orders").partitions] == [None, None, *((72, 73) if records
                                                                                        else (None, None))]


@pytest.mark.asyncio
async def test_a_growth_waits_for_a_description_showing_its_new_partitions() -> None:
    # A source node whose catalog lags the listing's describes fewer partitions: the growth is
    # named in `refused` and tried again (no log start read for it), never made without the
    # identities it could have; a description whose identities are malformed grows all the
    # same, without them, as a creation does.
    catalog = _catalog(LINK, MIRROR)
    source = Source({"orders": 4}, described={"orders": _described(3)})
    links, _ = _discovery(catalog, source)
    discovery = await _round(links, Discovery())
    assert "does not show the new ones yet" in discovery.refused["orders"] and discovery.failures == 0
    assert len(catalog.topic("orders").partitions) == 2 and source.reads == []
    source.described["orders"] = {"partitions": [{"partition": p} for p in range(4)]}
    await _round(links, discovery)
    assert discovery.refused == {} and [p.source_group for p in catalog.topic("orders").partitions] == [None] * 4


# Goal: a grown partition the source truncated past, under `resync`, resyncs only for the source
# partition it recorded (FakeSource's is 900): another is `diverged`, none recorded waits as `stop`.
@asynchronous
@pytest.mark.parametrize("recorded", [900, 4242, None])
async def test_a_grown_partitions_truncation_resyncs_only_for_its_recorded_identity(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float], recorded: int | None) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100), 1: _log(5, first=100)})
    catalog, proposer, registry, pulls, first = _setup(monkeypatch, "resync", source=source,
                                                       clock=lambda: sum(pauses))
    assert catalog.apply(Index(catalog.applied_index + 1), GrowMirrorTopic(
        name="orders", link="dr", count=2, assignments=((NodeId(1),),), start_offsets=(0,),
        source_groups=None if recorded is None else (recorded,))).ok
    grown = catalog.topic("orders").partitions[1]
    assert grown.source_group == recorded
    registry.leaders.pop(first)  # only the grown partition is led here
    registry.add(grown.group_id, start=0)  # it copied nothing; the source deleted 0..99
    try:
        await pulls.scan()
        if recorded == 900:
            await _until(lambda: proposer.proposed, "a resync proposed")
            assert proposer.proposed == [ResyncMirrorPartition(
                name="orders", partition=1, group_id=int(grown.group_id), start_offset=100)]
            fresh = catalog.topic("orders").partitions[1]
            assert fresh.group_id != grown.group_id and fresh.source_group == 900  # the same source partition
        elif recorded is not None:
            await _until(lambda: grown.group_id in pulls.status and pulls.status[grown.group_id].state == "diverged",
                         "diverged")
            assert "(its group 900, the mirror's record 4242" in (pulls.status[grown.group_id].last_error or "")
            assert proposer.proposed == []
        else:
            await _until(lambda: pauses.count(5.0) >= 3, "the pull waiting")
            assert "identity is not recorded" in (pulls.status[grown.group_id].last_error or "")
            assert proposer.proposed == [] and source.described == 0
        assert catalog.topic("orders").partitions[0].group_id == first  # the first partition untouched
    finally:
        await pulls.stop()
