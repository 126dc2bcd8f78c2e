"""Goal: a closed group holds no reference cycle, so it is freed by reference counting
as its last reference goes.

Why it matters: a node freezes its long-lived heap (multiraft/runtime/heap.py) and
never hands it back to the collector, because a full collection over thousands of
groups stalls the event loop for tens to hundreds of milliseconds (a topic deletion
used to cost every node that pause). A cycle inside a group would then keep a
deleted group's objects, its recent entries and buffers included, for the life of
the process. The check is exact: the heap is unfrozen here and collected with
DEBUG_SAVEALL, which keeps every object the collector found unreachable; none of them
may be one of raftlog's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path

import pytest

from multiraft.node.unsafe import ChaosHooks
from multiraft.runtime import heap
from raftlog.errors import ClientError
from storage.write_behind import WriteBehindFiles
from tests.chaos_server.test_node_hooks import started
from tests.node.test_node_cluster import (
    batch,
    configs,
    leader_of,
    produce_retrying,
    running_cluster,
    until,
    written_partition,
)

PARTITIONS = 6


def _ours(garbage: list[object]) -> list[str]:
    return sorted({type(o).__qualname__ for o in garbage
                   if type(o).__module__.startswith(("multiraft.", "raftlog.", "storage."))})


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_deleted_topics_groups_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    gc.unfreeze()
    gc.collect()  # what earlier tests left frozen is not this test's
    try:
        async with running_cluster(tmp_path) as nodes:
            await nodes[0].create_topic("doomed", PARTITIONS, 3, {})
            for node in nodes:
                await node.wait_for_topic("doomed")
            await until(lambda: all(leader_of(nodes, "doomed", p) for p in range(PARTITIONS)), "leaders", 60)
            for partition in range(PARTITIONS):  # leaders write in the background, followers apply
                await produce_retrying(nodes[0], "doomed", partition, batch(b"a", b"b", b"c"))
                leader = leader_of(nodes, "doomed", partition)
                assert leader is not None and (await leader.reads.consume("doomed", partition, 0)).batches
            waiting = asyncio.create_task(nodes[2].reads.consume("doomed", 0, 3, wait_ms=20_000))
            await asyncio.sleep(0.2)
            heap.settle()  # as after an open: everything above is frozen
            await nodes[0].delete_topic("doomed")
            await until(lambda: all(len(node.groups) == 1 for node in nodes), "the groups closed", 60)
            with contextlib.suppress(Exception):  # answered or refused: the test is about what is left
                await asyncio.wait_for(waiting, 20)
            await asyncio.sleep(0.5)  # background writes and timers of the closed groups end
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.unfreeze()
            gc.collect()
            left = _ours(gc.garbage)
            assert not left, f"closed groups left reference cycles holding: {left}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()


def _left_after_unfreezing() -> list[str]:
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.unfreeze()
    gc.collect()
    return _ours(gc.garbage)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_group_failed_and_reopened_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    # A failed group keeps its failure, whose traceback holds the frames that raised it,
    # the group's own task among them: a cycle, once its objects are frozen never freed
    # (review finding: a disk that stays full leaked a whole group per reopen).
    gc.unfreeze()
    gc.collect()
    hooks = ChaosHooks(write_behind_files=True)
    try:
        async with started(configs(tmp_path), hooks) as nodes:
            leader = await written_partition(nodes, "full", b"before")
            files = leader.files
            assert isinstance(files, WriteBehindFiles)
            heap.settle()
            files.free_bytes = 0
            for _ in range(3):
                with contextlib.suppress(ClientError):
                    await leader.produce("full", 0, batch(b"refused"))
            group = leader.partition_group("full", 0)
            await until(lambda: group not in leader.groups or leader.groups[group].failed, "the group failed")
            files.free_bytes = None
            await until(lambda: group in leader.groups and not leader.groups[group].failed, "reopened", 20)
            await produce_retrying(nodes[0], "full", 0, batch(b"after"), timeout_s=30)
            await asyncio.sleep(2)  # the failed runtime's last references (timers, tasks) go
            for node in nodes:  # the leaders list cached per catalog index may still name it
                node.routing._led_cache = None
            left = _left_after_unfreezing()
            assert not left, f"the failed group's runtime was kept by a cycle: {left}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
