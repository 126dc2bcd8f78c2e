"""Goal: a mirror partition knows which source partition it copies (docs/mirror.md "The source
truncated past a mirror"): the source partition's group id (never reused at the source: a topic
deleted and made again gets new ones), recorded by `CreateMirrorTopic.source_groups` when
discovery makes the mirror, kept in the catalog and its snapshots, and across resyncs. A resync
after the source truncated past the mirror fires only when the source's identity equals the
one recorded: another one (the source topic made again) is `diverged`, and none recorded (a
mirror made before this version) waits as `stop` does, saying why.

The encodings without it are those from before it, byte for byte, so older nodes apply the
commands and read the snapshots of mirrors that have none.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from multiraft.errors import InvalidRequest, SnapshotFormatError
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import decode_command, encode_command
from multiraft.metadata.features import FeatureLevel
from multiraft.metadata.mirror_commands import CreateMirrorTopic, ResyncMirrorPartition
from multiraft.node import mirror_links
from multiraft.node.mirror_follow import ReadBudget
from multiraft.node.mirror_links import MirrorLinks, source_groups
from raftlog.types import Index, NodeId
from tests.unit.test_mirror_catalog import _catalog, _finalized
from tests.unit.test_mirror_link_tls import _link
from tests.unit.test_mirror_pull import FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)
from tests.unit.test_mirror_truncated import MIRROR, CatalogProposer, SimpleHolder, _setup

asynchronous = pytest.mark.asyncio(loop_scope="function")
UNRECORDED = dataclasses.replace(MIRROR, source_groups=None)
# `MIRROR` without identities as it was encoded before they existed, and a catalog holding it.
OLDER_COMMAND = (b'{"assignments":[[1]],"config":{},"link":"dr","name":"orders","replication_factor":1,'
                 b'"start_offsets":[0],"type":"create_mirror_topic","v":1}')
OLDER_SNAPSHOT = (b'{"applied_index":3,"cluster_config":{},"decommissioning":[],"drained":[],"mirror_links":'
                  b'[["dr",["h:1"],"t","normal","running",null]],"next_group_id":2,"next_producer_id":0,"nodes":'
                  b'[[1,"a:1","a:2",null,"alive"]],"tokens":[],"topics":[{"assignments":[[1]],"config":{},'
                  b'"group_ids":[1],"initial":[[]],"leaving":[[]],"mirror_link":"dr","name":"orders",'
                  b'"replication_factor":1}],"v":1}')


def test_the_command_round_trips_with_and_without_identities() -> None:
    two = CreateMirrorTopic(name="t", link="dr", replication_factor=1, config={},
                            assignments=((NodeId(1),), (NodeId(1),)), start_offsets=(0, 5), source_groups=(7, 2**63 - 1))
    for command in (MIRROR, UNRECORDED, two):
        assert decode_command(encode_command(command)) == command
    assert encode_command(UNRECORDED) == OLDER_COMMAND  # written as before the field existed
    assert decode_command(OLDER_COMMAND) == UNRECORDED
    assert json.loads(encode_command(MIRROR))["source_groups"] == [900]
    for bad in ((), (900, 901), (0,), (-1,), (True,), (2**63,), ("900",), [900]):
        with pytest.raises(InvalidRequest, match="source_groups"):
            dataclasses.replace(MIRROR, source_groups=bad)  # type: ignore[arg-type]


def test_the_catalog_keeps_identities_in_snapshots_and_across_resyncs() -> None:
    assert _catalog(_link(), UNRECORDED).snapshot() == OLDER_SNAPSHOT  # byte for byte as before
    assert Catalog.restore(OLDER_SNAPSHOT).topic("orders").partitions[0].source_group is None
    catalog = _catalog(_link(), MIRROR)
    assert catalog.topic("orders").partitions[0].source_group == 900
    row = json.loads(catalog.snapshot())["topics"][0]
    assert row["source_groups"] == [900]
    assert Catalog.restore(catalog.snapshot()).topics == catalog.topics
    old = catalog.topic("orders").partitions[0].group_id
    assert catalog.apply(Index(catalog.applied_index + 1), ResyncMirrorPartition(
        name="orders", partition=0, group_id=int(old), start_offset=50)).ok
    fresh = catalog.topic("orders").partitions[0]
    assert fresh.group_id != old and fresh.source_group == 900  # the same source partition, copied again
    for bad in ([None, 900], [0], ["900"], [2**63], "900"):
        document = json.loads(catalog.snapshot())
        document["topics"][0]["source_groups"] = bad
        with pytest.raises(SnapshotFormatError):
            Catalog.restore(json.dumps(document).encode())
    document = json.loads(catalog.snapshot())
    del document["topics"][0]["mirror_link"]
    del document["mirror_links"]
    with pytest.raises(SnapshotFormatError):  # a plain topic records no source
        Catalog.restore(json.dumps(document).encode())


def test_discovery_reads_the_identities_from_the_source_description() -> None:
    def view(partition: int, group: object) -> dict[str, object]:
        return {"partition": partition, "group_id": group, "log_start_offset": None, "high_watermark": None,
                "replicas": [1]}

    assert source_groups({"partitions": [view(1, 12), view(0, 11)]}, range(2)) == (11, 12)
    for described in ({"partitions": [view(0, 11)]}, {"partitions": [view(0, 11), view(1, None)]},
                      {"partitions": [view(0, 0), view(1, 3)]}, {}):
        assert source_groups(described, range(2)) is None  # made all the same, without identities


# Goal: the source topic was deleted and made again (its partition's group id another than the
# mirror recorded) and its log starts past the mirror's position: `diverged`, no resync, the
# status naming both identities.
@asynchronous
async def test_a_recreated_source_topic_is_diverged_not_resynced(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100)})
    source.group = 4242
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    try:
        await pulls.scan()
        await _until(lambda: source.described >= 2 and pulls.status[old].state == "diverged", "diverged")
        shown = pulls.status[old].last_error or ""
        assert "another partition than this mirror copies (its group 4242, the mirror's record 900" in shown, shown
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


# Goal: a mirror made before identities were recorded keeps `stop`'s behaviour under `resync`,
# and says why; the source is not even asked to confirm.
@asynchronous
async def test_a_mirror_without_a_recorded_identity_waits_as_stop(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100)})
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses),
                                              mirror=UNRECORDED)
    try:
        await pulls.scan()
        await _until(lambda: pauses.count(5.0) >= 3, "the pull waiting")
        status = pulls.status[old]
        assert status.state == "source_truncated" and "deleted offsets 0..99" in (status.last_error or "")
        assert ("the source partition's identity is not recorded: resync needs a mirror made by this version"
                in (status.last_error or ""))
        assert proposer.proposed == [] and source.described == 0
        assert catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


# Goal: the source's nodes disagree on the partition's identity (one's catalog lags: the topic
# made again there or not yet): nothing is confirmed, nothing proposed, and it is not taken for
# a diverged source either: the pull waits, its status naming the groups, and reads again.
@asynchronous
async def test_source_nodes_disagreeing_on_the_identity_confirm_nothing(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    source = FakeSource({0: _log(5, first=100)})
    source.replica_starts, source.replica_groups = [100, 100, 100], [900, 4242, 900]
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", source=source, clock=lambda: sum(pauses))
    try:
        await pulls.scan()
        await _until(lambda: source.described >= 3, "confirmations")
        status = pulls.status[old]
        assert status.state == "source_truncated", status.state
        assert "the source's nodes disagree on the partition's identity (groups [900, 4242])" in (
            status.last_error or ""), status.last_error
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
    finally:
        await pulls.stop()


class _DescribedSource(FakeSource):
    """A source of one partition whose log starts at 0, and whose topic description (what
    discovery reads with `get_json`) gives the partition's group id 900."""

    def __init__(self) -> None:
        super().__init__({0: _log(5)})

    async def get_json(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return {"name": "orders", "replication_factor": 1, "config": {}, "partitions": [
            {"partition": 0, "group_id": 900, "log_start_offset": 0, "high_watermark": 10, "replicas": [1]}]}


# Goal: discovery records the source partitions' identities only once the sink is finalized at
# feature level 2 (`records_source_identity`: MIRROR_FOLLOW); below it, the mirror topic's command
# is the one from before identities existed, byte for byte (an older node applies it), and the
# metadata leader's check (`require_command_level`, in the proposer here) lets it through.
@asynchronous
@pytest.mark.parametrize("level", [0, 1, 2])
async def test_discovery_records_identities_only_at_feature_level_2(level: int) -> None:
    catalog = _catalog(_link())
    if level:
        _finalized(catalog, level)
    records = level >= FeatureLevel.MIRROR_FOLLOW
    proposer = CatalogProposer(catalog)
    assert mirror_links.records_source_identity(catalog) is records
    links = MirrorLinks(NodeId(1), SimpleHolder(catalog), proposer, None, SimpleNamespace(register=lambda *_: None),  # type: ignore[arg-type]
                        None, structlog.get_logger(), None)  # type: ignore[arg-type]
    assert await links._create_mirror(_DescribedSource(), catalog.mirror_links["dr"], "orders",  # type: ignore[arg-type]
                                      ReadBudget()) is None
    assert proposer.proposed == [MIRROR if records else UNRECORDED]
    assert (encode_command(proposer.proposed[0]) == OLDER_COMMAND) is not records
    assert catalog.topic("orders").partitions[0].source_group == (900 if records else None)
