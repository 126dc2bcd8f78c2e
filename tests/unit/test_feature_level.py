"""Goal: the cluster's feature level in the catalog (multiraft/metadata/features.py): the
finalize command's encoding and bounds, a catalog at level 0 snapshotting byte for byte as
before the gate (and older snapshots restoring at 0), the level in a snapshot once raised,
apply raising it and never lowering it, and the proposer's check of gated commands, which the
metadata leader makes before it proposes one, made there or forwarded (MetadataOps.propose)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.errors import FeatureLevelUnsupported, InvalidRequest, SnapshotFormatError
from multiraft.metadata import Catalog, CreateTopic, RegisterNode, decode_command, encode_command
from multiraft.metadata.features import (
    FEATURE_LEVEL_MAX,
    SUPPORTED_LEVEL,
    FeatureLevel,
    FinalizeFeatureLevel,
    require_command_level,
    supports,
)
from multiraft.metadata.mirror_commands import CreateMirrorLink, ResyncMirrorPartition
from multiraft.node.catalog_holder import CatalogHolder
from multiraft.node.metadata_ops import MetadataOps
from multiraft.transport.rpc import Rpc
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import Index, NodeId
from tests.unit.test_rpc import pair

# What the catalog below snapshotted as before the gate (e076bc8, encode_catalog: sorted
# keys, no spaces): a catalog at level 0 must still, so older nodes read it and nothing
# that compares snapshot bytes sees a change.
BEFORE_THE_GATE = (
    b'{"applied_index":2,"cluster_config":{},"decommissioning":[],"drained":[],"next_group_id":2,'
    b'"next_producer_id":0,"nodes":[[1,"127.0.0.1:7000","127.0.0.1:8000","a","alive"]],"tokens":[],'
    b'"topics":[{"assignments":[[1]],"config":{"retention_ms":5},"group_ids":[1],"initial":[[]],"leaving":[[]],'
    b'"name":"orders","replication_factor":1}],"v":1}')
# The same catalog once finalized at level 1 (entry 3): the one key more.
FINALIZED = BEFORE_THE_GATE.replace(b'"applied_index":2', b'"applied_index":3').replace(
    b'"drained":[],', b'"drained":[],"feature_level":1,')


def _catalog() -> Catalog:
    catalog = Catalog()
    for index, command in enumerate([
            RegisterNode(node_id=NodeId(1), raft_addr="127.0.0.1:7000", http_addr="127.0.0.1:8000", rack="a"),
            CreateTopic(name="orders", partitions=1, replication_factor=1, config={"retention_ms": 5},
                        assignments=((NodeId(1),),))], start=1):
        assert catalog.apply(Index(index), command).ok
    return catalog


def test_the_finalize_command_round_trips_and_is_bounded() -> None:
    command = FinalizeFeatureLevel(level=1)
    assert encode_command(command) == b'{"level":1,"type":"finalize_feature_level","v":1}'
    assert decode_command(encode_command(command)) == command
    # A level a later build knows decodes here too: the node learns it is behind (features.py).
    assert decode_command(b'{"level":7,"type":"finalize_feature_level","v":1}') == FinalizeFeatureLevel(level=7)
    for bad in (0, -1, FEATURE_LEVEL_MAX + 1, True, "1", None):
        with pytest.raises(InvalidRequest):
            FinalizeFeatureLevel(level=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        decode_command(b'{"level":1,"type":"finalize_feature_level","v":1,"force":true}')


def test_the_levels_are_ordered_and_described() -> None:
    assert [int(level) for level in FeatureLevel] == list(range(len(FeatureLevel)))
    assert SUPPORTED_LEVEL == max(FeatureLevel) == FeatureLevel.MIRROR_FILTER == 3
    assert all(what in FeatureLevel.MIRROR_FILTER.description for what in ("record_filter", "gap batches"))
    assert all(level.description for level in FeatureLevel)
    assert "prefix" in FeatureLevel.BASELINE.description and "HTTPS" in FeatureLevel.BASELINE.description
    assert all(what in FeatureLevel.MIRROR_FOLLOW.description for what in (
        "GrowMirrorTopic", "source_groups", "on_source_truncated", "SetMirrorLinkPolicy"))


def test_a_catalog_at_level_0_snapshots_as_before_the_gate_and_the_level_once_raised() -> None:
    catalog = _catalog()
    assert catalog.feature_level == 0 and catalog.snapshot() == BEFORE_THE_GATE
    assert Catalog.restore(BEFORE_THE_GATE).feature_level == 0  # an older snapshot: not finalized
    assert catalog.apply(Index(3), FinalizeFeatureLevel(level=1)).ok
    assert catalog.feature_level == 1 and catalog.snapshot() == FINALIZED
    restored = Catalog.restore(FINALIZED)
    assert restored.feature_level == 1 and restored.snapshot() == FINALIZED


@pytest.mark.parametrize("value", [0, -1, True, "1", None, FEATURE_LEVEL_MAX + 1])
def test_a_snapshot_with_a_malformed_level_is_refused(value: object) -> None:
    document = json.loads(FINALIZED)
    document["feature_level"] = value  # 0 is never written: absent means 0
    with pytest.raises(SnapshotFormatError):
        Catalog.restore(json.dumps(document).encode())


def test_apply_raises_the_level_and_refuses_to_lower_it() -> None:
    catalog = _catalog()
    assert catalog.apply(Index(3), FinalizeFeatureLevel(level=2)).ok and catalog.feature_level == 2
    assert catalog.apply(Index(4), FinalizeFeatureLevel(level=2)).ok  # the same again: nothing changes
    before = catalog.snapshot()
    refused = catalog.apply(Index(5), FinalizeFeatureLevel(level=1))
    assert isinstance(refused.error, InvalidRequest) and "only ever raised" in refused.error.message
    assert catalog.feature_level == 2 and catalog.applied_index == 5
    assert catalog.snapshot() == before.replace(b'"applied_index":4', b'"applied_index":5')
    with pytest.raises(InvalidRequest):  # and the leader's check before proposing says the same
        catalog.validate(FinalizeFeatureLevel(level=1))


def test_gated_commands_are_refused_below_their_level_and_their_older_forms_never() -> None:
    catalog = _catalog()
    kept = ResyncMirrorPartition(name="orders", partition=0, group_id=1, start_offset=0, prefix_index=9,
                                 prefix_term=2, prefix_offset=30, prefix_voters=(NodeId(1),))
    whole = ResyncMirrorPartition(name="orders", partition=0, group_id=1, start_offset=0)
    https = CreateMirrorLink(name="dr", sources=("src:443",), pattern="*", source_tls=True)
    plain = CreateMirrorLink(name="dr", sources=("src:80",), pattern="*")
    assert not supports(catalog, FeatureLevel.BASELINE)
    for gated in (kept, https):
        with pytest.raises(FeatureLevelUnsupported) as refused:
            require_command_level(catalog, gated)
        assert refused.value.http_status == 409 and refused.value.code == "FEATURE_LEVEL_UNSUPPORTED"
        assert "finalized at 0" in refused.value.message and "raftlog cluster features finalize" in refused.value.message
    for older in (whole, plain, FinalizeFeatureLevel(level=1)):
        require_command_level(catalog, older)
    assert catalog.apply(Index(3), FinalizeFeatureLevel(level=1)).ok
    assert supports(catalog, FeatureLevel.BASELINE)
    for gated in (kept, https):
        require_command_level(catalog, gated)


class _MetadataReplica:
    """Group 0's replica as `MetadataOps.propose` sees it: its role, the leader it knows, and
    what it was handed to propose."""

    def __init__(self, role: Role, leader: int) -> None:
        self.core = SimpleNamespace(role=role, leader=NodeId(leader))
        self.proposed: list[bytes] = []

    async def propose(self, entries: list[bytes], kind: object) -> list[Any]:
        self.proposed += entries
        return [SimpleNamespace(error=None, value=None)]


def _ops(node_id: int, role: Role, rpc: Rpc) -> tuple[MetadataOps, _MetadataReplica, CatalogHolder]:
    holder, replica = CatalogHolder(), _MetadataReplica(role, leader=2)
    holder.catalog = _catalog()
    registry = SimpleNamespace(groups={0: replica})
    return MetadataOps(NodeId(node_id), registry, holder, rpc, lambda: 0), replica, holder  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def leader_and_follower() -> AsyncIterator[tuple[MetadataOps, _MetadataReplica, Catalog, MetadataOps, Catalog]]:
    """The metadata leader's `MetadataOps` (node 2: its replica, its catalog) and a follower's
    (node 1: its catalog) forwarding to it over a real RPC pair (tests/unit/test_rpc.py), for 10 s."""
    follower_rpc, leader_rpc, _ = pair()
    leader, replica, leader_holder = _ops(2, Role.LEADER, leader_rpc)
    follower, _, follower_holder = _ops(1, Role.FOLLOWER, follower_rpc)
    try:
        async with asyncio.timeout(10):
            yield leader, replica, leader_holder.catalog, follower, follower_holder.catalog
    finally:
        await follower_rpc.stop()
        await leader_rpc.stop()


@pytest.mark.asyncio
async def test_the_metadata_leader_checks_what_it_proposes_made_there_or_forwarded() -> None:
    """`MetadataOps.propose` on the leader (node 2) and on a follower (node 1) that forwards
    it: the leader's catalog decides."""
    https = CreateMirrorLink(name="dr", sources=("src:443",), pattern="dr-*", source_tls=True)
    async with leader_and_follower() as (leader, replica, leader_catalog, follower, follower_catalog):
        assert follower_catalog.apply(Index(3), FinalizeFeatureLevel(level=1)).ok  # not the leader's
        for ops in (leader, follower):
            with pytest.raises(ClientError) as refused:
                await ops.propose(https)
            assert refused.value.code == "FEATURE_LEVEL_UNSUPPORTED" and "finalized at 0" in refused.value.message
        assert replica.proposed == []
        assert leader_catalog.apply(Index(3), FinalizeFeatureLevel(level=1)).ok
        for ops in (leader, follower):
            assert await ops.propose(https) == {}
    assert replica.proposed == [encode_command(https)] * 2
