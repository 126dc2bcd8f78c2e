"""A replica that comes back short is refilled at once, write or no write (issue 27).

Three real nodes in one event loop (the helpers of test_node_cluster.py). Goal: on an
idle, quiesced partition, a follower restarted cleanly, stopped again, given a damaged
closed segment and restarted (recovery cuts its log at the damage and marks it for
repair) is given back the rest of the log by the leader within seconds *without any
write*, and the leader reports it out of the ISR (the topic view's `isr`, the
under-replicated gauge) until it has caught up, then in again. Before the fix it stayed
short, and in the ISR, until the next write: its quiet leader sent nothing, and a
replica in repair, which may not campaign, sent nothing either.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from multiraft.http.view import partition_view
from multiraft.node.node import Node
from multiraft.runtime.group import GroupRuntime
from raftlog.messages import Message, MessageType
from storage.segment import parse_segment_name
from storage.state_db import CHECKPOINT, StateDatabase, group_key
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    produce_retrying,
    running_cluster,
    until,
    values_at,
)

TOPIC = "quiet"
RECORDS = 2_000
RECORDS_PER_BATCH = 50
SEGMENT_BYTES = 4096  # a few batches per segment: the log spans a dozen or more segments
REFILL_TIMEOUT_S = 10.0  # "within a few seconds": a notice goes out after one election timeout
HOLD_S = 1.0  # the leader's first appends to the short replica wait this long (see below)


def _flip_bytes_in_a_closed_segment(node: Node, group: int, where: str) -> None:
    """Flip 64 bytes of a closed segment (the node is stopped): in the middle of one
    halfway through the log, or at the very start of the log, in the group's first
    configuration entries. Its size still matches its catalog entry, so the open trusts
    it; the replay of the restart meets the bad frame, and the reopen's full check cuts
    the log there. The group's checkpoint goes too (storage/checkpoints.py): from one
    past the damage the open would replay only what follows, and the damage would be
    found by the next read of it (a consumer's, a follower's, the scrubber's) instead."""
    database = StateDatabase(str(node.config.data_dir / "state.db"))
    try:
        batch = database.batch()
        batch.delete(group_key(CHECKPOINT, group))
        database.write(batch, sync=True)
    finally:
        database.close()
    directory = node.config.data_dir / "groups" / str(group)
    segments = sorted((first, name) for name in os.listdir(directory)
                      if (first := parse_segment_name(name)) is not None)
    assert len(segments) >= 6, f"the log spans several segments: {segments}"
    if where == "middle":
        path = directory / segments[len(segments) // 2][1]  # closed: only the newest is open
        position = os.path.getsize(path) // 2
    else:
        path, position = directory / segments[0][1], 0
    with open(path, "r+b") as file:
        file.seek(position)
        data = file.read(64)
        file.seek(-len(data), os.SEEK_CUR)
        file.write(bytes(byte ^ 0xFF for byte in data))


def _hold_appends(node_id: int, group: int, held: list[tuple[Any, Message]]) -> None:
    """Hold the appends reaching node `node_id`'s replica of `group`, so the moment between
    the leader learning it is short and its refill lasts long enough to look at the ISR;
    heartbeats and everything else pass. Installed on the class before the node starts
    (the three nodes share one process): the reopened replica tells its leader where
    its log ends as soon as it opens (`RaftCore.announce`), and the refill begins at once."""
    real = GroupRuntime.deliver

    def hold(runtime: GroupRuntime, message: Message) -> None:
        if message.type is MessageType.APPEND and runtime.group_id == group and runtime.core.id == node_id:
            held.append((lambda m, r=runtime: real(r, m), message))
        else:
            real(runtime, message)

    GroupRuntime.deliver = hold  # type: ignore[method-assign]


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["middle", "start"])
async def test_a_short_replica_of_an_idle_partition_is_refilled_without_a_write(tmp_path: Path, where: str) -> None:
    # "start": the cut takes the configuration entries too, so the replica knows no
    # member to tell; it tells the catalog's replicas (Config.repair_contacts).
    async with running_cluster(tmp_path, timeout_s=120) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {"segment_bytes": SEGMENT_BYTES})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        values = [b"record-%05d" % i for i in range(RECORDS)]
        for start in range(0, RECORDS, RECORDS_PER_BATCH):
            await produce_retrying(nodes[0], TOPIC, 0, batch(*values[start:start + RECORDS_PER_BATCH]))
        leader = leader_of(nodes, TOPIC, 0)
        assert leader is not None
        group = leader.partition_group(TOPIC, 0)
        position = next(i for i, n in enumerate(nodes) if n is not leader)
        await until(lambda: values_at(nodes[position], TOPIC, 0) == values, "the follower holds every record")

        # A clean restart, then quiet: the leader's group is quiesced, crediting the
        # follower with the whole log.
        await nodes[position].stop()
        nodes[position] = Node(nodes[position].config)
        await nodes[position].start()
        await until(lambda: group in nodes[position].groups, "the follower reopened its replica")
        await until(lambda: all(n.groups[group].quiesced for n in nodes), "the partition quiet everywhere", 30)
        assert leader_of(nodes, TOPIC, 0) is leader, "the same leader (the partition's first replica)"
        leader_core = leader.groups[group].core
        last = leader_core.log.last_index()

        # Stopped again, a closed segment damaged, started again: short and in repair.
        await nodes[position].stop()
        _flip_bytes_in_a_closed_segment(nodes[position], group, where)
        follower = nodes[position] = Node(nodes[position].config)
        held: list[tuple[Any, Message]] = []
        real_deliver = GroupRuntime.deliver
        _hold_appends(follower.id, group, held)
        info = leader.catalog.topics[TOPIC].partitions[0]
        try:
            await follower.start()

            def in_repair() -> bool:
                store = follower.stores.get(group)
                return store is not None and store.recovery.needs_repair and group in follower.groups

            await until(in_repair, "the reopen cut the damaged log and marked it for repair", 30)
            assert follower.stores[group].last_index() < last, "the replica is short"
            if where == "start":
                assert follower.stores[group].last_index() == 0, "nothing left, membership included"
            # No write from here on. The leader learns the replica is short (its appends
            # to it begin) and drops it from the ISR at once.
            await until(lambda: held, "the leader starts refilling the short replica", REFILL_TIMEOUT_S)
            assert leader_core.log.last_index() == last, "nothing was written"
            assert follower.id not in partition_view(leader.api, info)["isr"], "short: out of the ISR"
            assert len(leader_core.in_sync_replicas() & leader_core.membership.voters) == 2, "under-replicated"
            await asyncio.sleep(HOLD_S)
            assert follower.id not in partition_view(leader.api, info)["isr"], "still short: still out"
        finally:
            GroupRuntime.deliver = real_deliver  # type: ignore[method-assign]
            for deliver, message in held:
                deliver(message)

        await until(lambda: follower.stores[group].last_index() == last, "the replica refilled", REFILL_TIMEOUT_S)
        await until(lambda: values_at(follower, TOPIC, 0) == values, "every record readable", REFILL_TIMEOUT_S)
        await until(lambda: follower.id in partition_view(leader.api, info)["isr"], "back in the ISR", REFILL_TIMEOUT_S)
        await until(lambda: follower.stores[group].repair_reason is None, "the repair marker cleared")
        assert leader_core.log.last_index() == last, "refilled with no write at all"
