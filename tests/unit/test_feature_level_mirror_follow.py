"""Goal: feature level 2 (`MIRROR_FOLLOW`, multiraft/metadata/features.py) gates what a mirror
following its source writes that an older node cannot read: `GrowMirrorTopic`,
`SetMirrorLinkPolicy`, a link created with `on_source_truncated` other than `stop`, and a
mirror topic made or grown with its source partitions' identities (`source_groups`). Each is
refused below the level by the metadata leader's check (`require_command_level`, at propose
time, on a real catalog) and accepted at it; their older forms never are refused. Discovery
below the level writes a mirror topic's command byte for byte as before identities existed
(tests/unit/test_mirror_truncated_identity.py has the bytes) and names a growth in its
`refused`, telling the operator to finalize, without a failed round or a read spent on it."""

from __future__ import annotations

import dataclasses

import pytest

from multiraft.errors import FeatureLevelUnsupported
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import encode_command
from multiraft.metadata.features import FeatureLevel, FinalizeFeatureLevel, require_command_level
from multiraft.metadata.mirror_commands import (
    CreateMirrorTopic,
    GrowMirrorTopic,
    PromoteMirrorTopic,
    SetMirrorLinkPolicy,
)
from multiraft.node.mirror_links import Discovery, records_source_identity
from raftlog.errors import ClientError
from raftlog.types import Index, NodeId
from tests.unit.test_feature_level import leader_and_follower
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog, _finalized
from tests.unit.test_mirror_discovery import Source, _discovery, _round
from tests.unit.test_mirror_grown_identity import _described

RESYNC_LINK = dataclasses.replace(LINK, name="dr2", on_source_truncated="resync")
POLICY = SetMirrorLinkPolicy(name="dr", on_source_truncated="resync")
GROWTH = GrowMirrorTopic(name="orders", link="dr", count=3, assignments=((NodeId(1),),), start_offsets=(7,))
RECORDED_GROWTH = dataclasses.replace(GROWTH, source_groups=(42,))
RECORDED_MIRROR = CreateMirrorTopic(name="orders-b", link="dr", replication_factor=1, config={},
                                    assignments=((NodeId(1),),), start_offsets=(0,), source_groups=(900,))
GATED = {"a mirror link with on_source_truncated 'resync'": RESYNC_LINK,
         "a mirror link's on_source_truncated changed": POLICY,
         "a mirror topic following its source's partition increase": GROWTH,
         "a mirror topic recording its source partitions' identities": RECORDED_MIRROR}


def test_level_2_gates_the_mirror_follow_commands_and_their_older_forms_never() -> None:
    catalog = _catalog(LINK, MIRROR)  # at 0: a cluster from before the gate
    older = (LINK, dataclasses.replace(RECORDED_MIRROR, source_groups=None), PromoteMirrorTopic(name="orders"),
             FinalizeFeatureLevel(level=2))
    for level in (0, 1):
        if level:
            _finalized(catalog, level)
        assert not records_source_identity(catalog)
        for what, gated in [*GATED.items(), ("a mirror topic following", RECORDED_GROWTH)]:
            with pytest.raises(FeatureLevelUnsupported) as refused:
                require_command_level(catalog, gated)
            assert refused.value.http_status == 409 and refused.value.code == "FEATURE_LEVEL_UNSUPPORTED"
            assert f"{what}" in refused.value.message and "needs feature level 2 (mirror_follow)" in refused.value.message
            assert f"finalized at {level}" in refused.value.message
            assert "raftlog cluster features finalize" in refused.value.message
        for command in older:
            require_command_level(catalog, command)
    # An HTTPS link that resyncs needs both levels: the higher is named.
    with pytest.raises(FeatureLevelUnsupported, match="needs feature level 2"):
        require_command_level(catalog, dataclasses.replace(RESYNC_LINK, source_tls=True))
    _finalized(catalog, FeatureLevel.MIRROR_FOLLOW)
    assert records_source_identity(catalog)
    for command in (*GATED.values(), RECORDED_GROWTH):
        require_command_level(catalog, command)
    for command in (RESYNC_LINK, POLICY, RECORDED_GROWTH, RECORDED_MIRROR):  # and the real catalog takes them
        catalog.validate(command)
        assert catalog.apply(Index(catalog.applied_index + 1), command).ok
    assert catalog.mirror_links["dr"].on_source_truncated == "resync"
    assert [p.source_group for p in catalog.topic("orders").partitions] == [None, None, 42]
    assert catalog.topic("orders-b").partitions[0].source_group == 900


@pytest.mark.asyncio
async def test_the_metadata_leader_refuses_a_link_policy_below_level_2_made_there_or_forwarded() -> None:
    """`MetadataOps.propose` on the leader and on a follower forwarding it over a real RPC
    pair: a policy change and a resync link are refused at level 1, taken at 2."""
    async with leader_and_follower() as (leader, replica, catalog, follower, _):
        assert catalog.apply(Index(3), dataclasses.replace(LINK, token=None)).ok
        assert catalog.apply(Index(4), FinalizeFeatureLevel(level=1)).ok
        for ops in (leader, follower):
            for command in (POLICY, RESYNC_LINK):
                with pytest.raises(ClientError) as refused:
                    await ops.propose(command)
                assert refused.value.code == "FEATURE_LEVEL_UNSUPPORTED"
                assert "needs feature level 2" in refused.value.message
        assert replica.proposed == []
        assert catalog.apply(Index(5), FinalizeFeatureLevel(level=2)).ok
        for ops in (leader, follower):
            assert await ops.propose(POLICY) == {}
    assert replica.proposed == [encode_command(POLICY)] * 2


@pytest.mark.asyncio
@pytest.mark.parametrize("level", [0, 1])
async def test_discovery_below_level_2_names_a_growth_and_makes_mirrors_as_before(level: int) -> None:
    catalog: Catalog = _catalog(LINK, MIRROR)
    source = Source({"orders": 4, "orders-b": 1}, {("orders-b", 0): "5"}, {"orders-b": _described(1, groups=900)})
    links, metadata = _discovery(catalog, source, level=level)
    discovery = await _round(links, Discovery())
    assert discovery.failures == 0 and discovery.last_error is None
    why = discovery.refused["orders"]
    assert "the source says 4 partitions; the mirror keeps its 2" in why and "feature level 2 (mirror_follow)" in why
    assert f"finalized at {level}" in why and "raftlog cluster features finalize" in why
    assert source.reads == [("orders-b", 0)]  # no read spent on the growth
    [made] = metadata.proposed
    assert made == CreateMirrorTopic(name="orders-b", link="dr", replication_factor=1, config={},
                                     assignments=((NodeId(1),),), start_offsets=(5,))
    assert encode_command(made) == (b'{"assignments":[[1]],"config":{},"link":"dr","name":"orders-b",'
                                    b'"replication_factor":1,"start_offsets":[5],"type":"create_mirror_topic","v":1}')
    assert len(catalog.topic("orders").partitions) == 2
    # Finalized at 2, the next round grows it, with the new partitions' identities.
    await metadata.propose(FinalizeFeatureLevel(level=FeatureLevel.MIRROR_FOLLOW))
    source.described["orders"] = _described(4)
    await _round(links, discovery)
    assert discovery.refused == {} and discovery.failures == 0
    [_, _, grown] = metadata.proposed
    assert isinstance(grown, GrowMirrorTopic) and (grown.count, grown.source_groups) == (4, (72, 73))
    assert [p.source_group for p in catalog.topic("orders").partitions] == [None, None, 72, 73]
