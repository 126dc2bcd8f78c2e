"""Three real nodes in one event loop (as tests/node/test_node_cluster.py).

Goal: the runtime lets go of the entries its stores cache (multiraft/runtime/group.py
calls `release_cached` after each round; storage/entry_cache.py): once writes settle
every store on every node holds no cached bytes and the node's budget no log; a
leader whose follower is down keeps what that follower lacks; once it is back and
has caught up, nothing is held again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from multiraft.node.node import Node
from raftlog.types import GroupId
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    produce_retrying,
    running_cluster,
    until,
    values_at,
    written_partition,
)


def cached_bytes(node: Node) -> int:
    return sum(store.cached_bytes for store in node.stores.values())


def holds_nothing(nodes: list[Node]) -> bool:
    return all(cached_bytes(node) == 0 and node.storage.entry_cache.holding() == 0
               and node.storage.entry_cache.bytes == 0 for node in nodes)


async def _follower_down_then_written(nodes: list[Node], leader: Node, topic: str,
                                      numbers: range) -> tuple[Node, Node, GroupId]:
    """A follower of `topic`'s partition 0 stopped, then values v<n> written: (the stopped
    follower, the leader, the group), once the leader holds cached what the follower lacks."""
    follower = next(n for n in nodes if n is not leader)
    await follower.stop()
    leader = leader_of([n for n in nodes if n is not follower], topic, 0) or leader
    group = leader.partition_group(topic, 0)
    for i in numbers:
        await produce_retrying(leader, topic, 0, batch(b"v%d" % i))
    await until(lambda: leader.stores[group].cached_bytes > 0, "the leader keeps what the follower lacks")
    return follower, leader, group


@pytest.mark.integration
@pytest.mark.asyncio
async def test_settled_replicas_hold_no_cached_entries_and_a_leader_keeps_a_down_followers(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as nodes:
        leader = await written_partition(nodes, "cached", b"v0")
        values = [b"v0"]
        for i in range(1, 8):
            await produce_retrying(leader, "cached", 0, batch(b"v%d" % i))
            values.append(b"v%d" % i)
        await until(lambda: all(values_at(n, "cached", 0) == values for n in nodes), "every replica holds them")
        await until(lambda: holds_nothing(nodes), "settled: every cache released")

        # A follower goes down: the leader keeps the entries it lacks.
        follower, leader, group = await _follower_down_then_written(nodes, leader, "cached", range(8, 12))
        index = nodes.index(follower)
        values += [b"v%d" % i for i in range(8, 12)]
        await asyncio.sleep(0.3)  # many rounds of the group (ticks of 20 ms): still kept
        assert leader.stores[group].cached_bytes > 0
        assert leader.storage.entry_cache.holding() > 0

        # Back and caught up: nothing held anywhere.
        nodes[index] = restarted = Node(follower.config)
        await restarted.start()
        await restarted.wait_for_topic("cached")
        await until(lambda: group in restarted.partitions and values_at(restarted, "cached", 0) == values,
                    "the restarted follower caught up")
        await until(lambda: holds_nothing(nodes), "caught up: every cache released")


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("failing", ["before_close", "machine"])
async def test_a_close_that_raises_still_closes_the_store_and_refunds_its_cache(tmp_path: Path,
                                                                                failing: str) -> None:
    # Goal: `Replicas._close_group` closes the store whatever raised before it (the caller's
    # `before_close`, or the state machine's close): its cached entries leave the node's
    # budget, its files close.
    async with running_cluster(tmp_path) as nodes:
        leader = await written_partition(nodes, "closing", b"v0")
        follower, leader, group = await _follower_down_then_written(nodes, leader, "closing", range(1, 4))
        index = nodes.index(follower)
        store = leader.stores[group]

        def refuse(*_args: object) -> None:
            raise RuntimeError(f"{failing} failed")

        before_close = refuse if failing == "before_close" else None
        if failing == "machine":
            leader.registry.partitions[group].close = refuse  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match=f"{failing} failed"):
            await leader.replicas.close_group(group, False, before_close=before_close)
        assert store.closed and store.cached_bytes == 0
        budget = leader.storage.entry_cache  # the metadata group's cache may still hold entries
        assert store._cache not in budget._caches
        assert budget.bytes == sum(cache._bytes for cache in budget._caches)
        nodes[index] = restarted = Node(follower.config)  # running_cluster stops every node it holds
        await restarted.start()
