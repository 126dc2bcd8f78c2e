"""Tree sidecars on running nodes (multiraft/node/tree_sidecars.py): the warmer writes the
sidecar of every closed segment, and a verify then reads only the open segments.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from storage.scrub import valid_sidecar
from tests.node.test_node_cluster import leader_of, running_cluster
from tests.node.test_scrubber import _flip_a_byte_at_offset, _written


@pytest.mark.integration
@pytest.mark.asyncio
async def test_warmed_replicas_verify_from_their_sidecars_and_a_deep_verify_reads_them(tmp_path: Path) -> None:
    # Goal: once the warmer has run, every closed segment of every replica has a matching
    # sidecar; a verify then hashes no more than each replica's open segment and counts its
    # closed segments by their sidecars, with the same verdict a deep verify (the default,
    # which reads them all) gives; rot under a sidecar is found by the deep one only.
    async with running_cluster(tmp_path) as nodes:
        await _written(nodes, "warm", batches=24)  # 12,000 offsets in 4 KiB segments
        for node in nodes:
            async with asyncio.timeout(30):
                while await node.sidecar_warmer.pass_once():
                    pass
        for node in nodes:
            for partition in (0, 1):
                store = node.stores[node.partition_group("warm", partition)]
                closed = [s for s in store.segments if s.closed]
                assert len(closed) > 5 and all(valid_sidecar(store, s) is not None for s in closed)

        trees = [node.scrubber.trees for node in nodes]
        hashed = sum(t.bytes_hashed for t in trees)
        report = (await nodes[0].api.verify(["warm"], 0, deep=False)).to_json()
        assert report["all_identical"], report
        open_bytes = sum(node.stores[node.partition_group("warm", p)].segments[-1].size
                         for node in nodes for p in (0, 1))
        assert 0 < sum(t.bytes_hashed for t in trees) - hashed <= open_bytes, "only the open segments were read"
        assert sum(t.sidecars.counts.segments_from_sidecars for t in trees) > 30

        deep_before = sum(t.bytes_hashed for t in trees)
        report = (await nodes[0].api.verify(["warm"], 0)).to_json()
        assert report["all_identical"], report
        assert sum(t.bytes_hashed for t in trees) - deep_before > 6 * 12_000 * 5, "every replica read its log"

        leader = leader_of(nodes, "warm", 0)
        follower = next(n for n in nodes if n is not leader)
        _flip_a_byte_at_offset(follower, "warm", 6000)
        assert (await nodes[0].api.verify(["warm"], 0, deep=False)).to_json()["all_identical"]
        report = (await nodes[0].api.verify(["warm"], 0)).to_json()
        assert report["partitions"][0]["status"] == "different"
        assert report["partitions"][0]["ranges"] == [[4096, 8192]]
