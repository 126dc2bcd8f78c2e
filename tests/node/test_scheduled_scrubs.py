"""Scheduled scrubs on running nodes (multiraft/node/scheduled_scrubs.py): rot in a follower
is found and repaired without anyone calling verify.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers), byte flips as in
tests/node/test_scrubber.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiraft.http.metrics import node_registry, render
from multiraft.node.node import Node
from tests.node.test_node_cluster import leader_of, running_cluster, until
from tests.node.test_scrubber import _flip_a_byte_at_offset, _holds, _written

INTERVAL_S = 2  # every partition led is scrubbed every 2 s once its first turn came (within 2 s)


def _scheduled(nodes: list[Node], status: str) -> int:
    return sum(n.scheduled_scrubs.results.verdicts[status] for n in nodes)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_short_interval_finds_a_flipped_follower_segment_and_repairs_it(tmp_path: Path) -> None:
    # Goal: with `scrub_interval_s` 2, each leader deep-verifies its partitions on its own:
    # identical replicas come out identical, every build paced (bytes through the scrub
    # rate on every node: followers' builds too); a byte flipped in a follower's committed
    # closed segment, under a sidecar a fast verify would trust, is found `different` by
    # the next scheduled scrub with no verify called, exactly that leaf range, the
    # follower's repair starts and it is refilled, the later scrubs find it identical, and
    # /metrics and GET /v1/admin/scrub's view count it.
    async with running_cluster(tmp_path, timeout_s=120, scrub_interval_s=INTERVAL_S) as nodes:
        values = await _written(nodes, "sched", batches=24)  # 12,000 offsets: three leaves of 4096
        identical_before = _scheduled(nodes, "identical")
        await until(lambda: _scheduled(nodes, "identical") >= identical_before + 2, "scheduled scrubs ran", 30)
        assert _scheduled(nodes, "different") == 0
        assert all(n.scrubber.trees.pace.bytes > 0 for n in nodes), "every node read within its scrub rate"

        leader = leader_of(nodes, "sched", 0)
        assert leader is not None
        follower = next(n for n in nodes if n is not leader)
        group = follower.partition_group("sched", 0)
        store = follower.stores[group]
        _flip_a_byte_at_offset(follower, "sched", 6000)

        await until(lambda: _scheduled(nodes, "different") >= 1, "a scheduled scrub found the rot", 30)
        found = [v.verdict for n in nodes for v in n.scheduled_scrubs.results.latest if v.verdict.status == "different"]
        assert found[0].topic == "sched" and found[0].partition == 0 and found[0].repair_started
        assert found[0].ranges == [(4096, 8192)]
        assert [r.node for r in found[0].replicas if r.status == "different"] == [follower.id]
        await until(lambda: follower.stores.get(group) not in (None, store), "the follower reopened", 30)
        await until(lambda: _holds(follower, "sched", 0, values), "the follower repaired from the leader", 30)
        different = _scheduled(nodes, "different")
        identical = _scheduled(nodes, "identical")
        await until(lambda: _scheduled(nodes, "identical") >= identical + 4, "later scrubs ran", 30)
        assert _scheduled(nodes, "different") == different, "once repaired, identical"
        assert all(n.scrubber.partitions_verified <= sum(n.scheduled_scrubs.results.verdicts.values()) for n in nodes), \
            "no verify but the scheduled ones (a scrub whose leader moved under it is skipped, not counted)"

        finder = next(n for n in nodes if n.scheduled_scrubs.results.verdicts["different"])
        finds = finder.scheduled_scrubs.results.verdicts["different"]  # 2 if a scrub came before the refill
        text = render(node_registry(finder.api)).decode()
        assert f'raftlog_scrub_scheduled_verifies_total{{verdict="different"}} {finds}.0' in text
        assert f"raftlog_scrub_scheduled_repairs_started_total {finder.scheduled_scrubs.results.repairs_started}.0" in text
        assert finder.scheduled_scrubs.results.repairs_started >= 1
        assert "raftlog_scrub_scheduled_differing_ranges_total" in text and "raftlog_scrub_scheduled_partitions" in text
        status = finder.api.scrub_status()
        assert status["interval_s"] == INTERVAL_S and status["verdicts"]["different"] == finds
        shown = [v for v in status["latest_not_identical"] if v["status"] == "different"]
        assert shown[-1]["ranges"] == [[4096, 8192]] and shown[-1]["repair_started"], "the first find, oldest last"
