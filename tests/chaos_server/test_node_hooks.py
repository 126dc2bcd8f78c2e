"""Goal: a node applies the chaos hooks it is given (or reads them from the environment),
announces them, and each runtime-level unsafe switch really changes what an in-process
node does when set and changes nothing when unset: ack-before-fsync acknowledges writes
its files still hold unsynced, read-uncommitted serves committed reads past the high
watermark, vote-without-persist lets a restarted node lead a term that already had a
leader (seen, as the chaos runner sees it, in the `became_leader` events)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from multiraft.node.config import NodeConfig
from multiraft.node.faults import (
    Faults,
    ProducerTableWithoutDedup,
    SegmentStoreForgettingVotes,
    framing_only,
)
from multiraft.node.node import Node
from multiraft.node.unsafe import NO_HOOKS, UNSAFE_SWITCHES, ChaosHooks
from multiraft.runtime import persistence as persistence_module
from multiraft.runtime.persistence import AckBeforeFsync
from raftlog.messages import Role
from storage.files import OsFiles
from storage.frames import crc_matches
from storage.segments import SegmentStore
from storage.write_behind import WriteBehindFiles
from tests.node.test_node_cluster import batch, configs, leader_of, produce_retrying, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
TIMEOUT_S = 60


@contextlib.asynccontextmanager
async def started(node_configs: list[NodeConfig], hooks: ChaosHooks | None) -> AsyncIterator[list[Node]]:
    nodes = [Node(c, hooks=hooks) for c in node_configs]
    try:
        async with asyncio.timeout(TIMEOUT_S):
            for node in nodes:
                await node.start()
            await until(lambda: all(len(n.catalog.nodes) == len(nodes) for n in nodes), "registration")
            yield nodes
    finally:
        for node in nodes:
            if node.db is not None:
                await node.stop()


async def _topic(nodes: list[Node], name: str, replication_factor: int) -> None:
    await nodes[0].create_topic(name, 1, replication_factor, {})
    for node in nodes:
        await node.wait_for_topic(name)
    await until(lambda: leader_of(nodes, name, 0) is not None, f"a leader for {name}/0")


def _unsynced_bytes(node: Node, topic: str) -> int:
    handle = node.stores[node.partition_group(topic, 0)].segments[-1].handle
    assert hasattr(handle.node, "tail"), "write-behind files in use"
    return len(handle.node.tail)  # type: ignore[attr-defined]


async def test_hooks_come_from_the_environment_and_are_announced(tmp_path: Path, monkeypatch) -> None:
    # Goal: Node(config) reads the variables itself; every hook reaches the piece it drives; the
    # node logs one warning per kind of hook. Without the variables: OsFiles, no warning.
    (config,) = configs(tmp_path / "safe", 1)
    with structlog.testing.capture_logs() as logs:
        async with started([config], None) as (node,):
            assert node.hooks == NO_HOOKS and isinstance(node.files, OsFiles)
            assert all(type(s) is SegmentStore and s.frame_check is crc_matches for s in node.stores.values())
    assert not {e["event"] for e in logs} & {"chaos_write_behind_files", "unsafe_switches_enabled"}

    monkeypatch.setenv("RAFTLOG_CHAOS_FILES", "write-behind")
    monkeypatch.setenv("RAFTLOG_UNSAFE", ",".join(UNSAFE_SWITCHES))
    (config,) = configs(tmp_path / "unsafe", 1)
    with structlog.testing.capture_logs() as logs:
        async with started([config], None) as (node,):
            await _topic([node], "wired", 1)
            assert node.hooks.unsafe == tuple(sorted(UNSAFE_SWITCHES))
            assert isinstance(node.files, WriteBehindFiles)
            group = node.partition_group("wired", 0)
            for store in node.stores.values():
                assert store.frame_check is framing_only and isinstance(store, SegmentStoreForgettingVotes)
            assert all(isinstance(runtime.persistence, AckBeforeFsync) for runtime in node.groups.values())
            assert isinstance(node.partitions[group].state.producers, ProducerTableWithoutDedup)
    warnings = {e["event"]: e for e in logs if e["log_level"] == "warning"}
    assert "chaos_write_behind_files" in warnings
    assert warnings["unsafe_switches_enabled"]["switches"] == sorted(UNSAFE_SWITCHES)


@pytest.mark.parametrize("unsafe", [False, True])
async def test_ack_before_fsync_acknowledges_unsynced_writes(tmp_path: Path, monkeypatch, unsafe: bool) -> None:
    # Goal: over write-behind files, a quorum ack normally means the record reached the OS and
    # was fsynced (nothing unsynced left in memory); with ack-before-fsync the ack comes while
    # the record is still only in memory, and the deferred sync writes it later.
    monkeypatch.setattr(persistence_module, "UNSAFE_SYNC_DELAY_S", 0.5)
    hooks = ChaosHooks(write_behind_files=True, ack_before_fsync=unsafe)
    async with started(configs(tmp_path, 1), hooks) as (node,):
        await _topic([node], "acks", 1)
        await until(lambda: _unsynced_bytes(node, "acks") == 0, "the election's writes synced")
        answer = await node.produce("acks", 0, batch(b"acknowledged"))
        assert answer.base_offset == 0
        if not unsafe:
            assert _unsynced_bytes(node, "acks") == 0, "acknowledged only once durable"
            return
        assert _unsynced_bytes(node, "acks") > 0, "acknowledged while still unsynced"
        await until(lambda: _unsynced_bytes(node, "acks") == 0, "the deferred sync", timeout_s=5)


async def test_read_uncommitted_serves_past_the_high_watermark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a record the leader holds but no quorum does is invisible to committed reads;
    # with read-uncommitted, committed reads serve it.
    slow_elections = [dataclasses.replace(c, election_timeout_ticks=150) for c in configs(tmp_path)]
    async with started(slow_elections, NO_HOOKS) as nodes:
        await _topic(nodes, "hw", 3)
        await produce_retrying(nodes[0], "hw", 0, batch(b"committed"))  # a new leader may not be ready
        leader = leader_of(nodes, "hw", 0)
        assert leader is not None
        followers = [n for n in nodes if n is not leader]
        await until(lambda: all(n.partitions[n.partition_group("hw", 0)].state.high_watermark == 1
                                for n in followers), "followers applied the committed record")
        await asyncio.gather(*(n.stop() for n in followers))
        await leader.produce("hw", 0, batch(b"uncommitted"), acks="leader")
        group = leader.partition_group("hw", 0)
        assert leader.groups[group].core.role is Role.LEADER, "still leading (3 s election timeout)"
        assert leader.partitions[group].state.high_watermark == 1 and leader.stores[group].log_end_offset == 2

        safe = await leader.reads.consume("hw", 0, 0)
        assert [(base, count) for base, count, _ in safe.batches] == [(0, 1)]
        # The switch picks the read path's end once, at construction (multiraft/node/faults.py):
        # here the same node is handed the read-uncommitted one.
        monkeypatch.setattr(leader.reads, "_read_end", Faults.of(ChaosHooks(read_uncommitted=True)).read_end)
        unsafe = await leader.reads.consume("hw", 0, 0)
        assert [(base, count) for base, count, _ in unsafe.batches] == [(0, 1), (1, 1)]


@pytest.mark.parametrize("unsafe", [False, True])
async def test_vote_without_persist_leads_a_term_twice(tmp_path: Path, unsafe: bool) -> None:
    # Goal: a restarted node normally campaigns in a term above every one it knew; with
    # vote-without-persist it forgets term and vote and is elected again in a term that
    # already had a leader: two `became_leader` events for one (group, term), which is how
    # the chaos runner's end-of-run check catches it.
    hooks = ChaosHooks(vote_without_persist=unsafe)
    (config,) = configs(tmp_path, 1)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # three incarnations, each elected once
            async with started([config], hooks) as (node,):
                await until(lambda n=node: n.groups[0].core.role is Role.LEADER, "metadata leader")
    terms = [e["term"] for e in logs if e["event"] == "became_leader" and e["group_id"] == 0]
    assert len(terms) == 3 and all(e["node_id"] == 1 for e in logs if e["event"] == "became_leader")
    if unsafe:
        assert len(set(terms)) < len(terms), f"a term led twice: {terms}"
    else:
        assert terms == sorted(set(terms)), f"terms only go up: {terms}"
