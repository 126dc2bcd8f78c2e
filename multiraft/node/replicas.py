"""A node's group replicas: open, close, reopen after a storage failure, reconcile.

Every node applies the catalog and reconciles its groups with it: it opens the
groups the catalog assigns to it (creating them on first sight, bootstrapped
with the replicas the partition was created with as voters; a copy on a node
the partition moved to starts empty) and closes and deletes the rest, a copy
that is leaving only once its group removed it (multiraft/node/reassignment.py). A group
whose storage fails (the disk filled up) is closed and opened again from disk
after a pause, as a restart of the node would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from multiraft.metadata.catalog import Catalog, PartitionInfo, groups_for_node
from multiraft.node.compaction import Boundaries
from multiraft.node.machines import CatalogMachine, PartitionMachine
from multiraft.runtime import heap
from multiraft.runtime.group import GroupDeps, GroupRuntime
from multiraft.runtime.persistence import AckBeforeFsync
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Role
from raftlog.storage import StorageError
from raftlog.types import GroupId, Index, NodeId
from storage.batch import check_stored_batch
from storage.config import FlushPolicy, StoreConfig
from storage.errors import CorruptionError
from storage.files import make_private_dirs
from storage.segments import SegmentStore

if TYPE_CHECKING:
    from multiraft.node.node import Node

METADATA_GROUP = GroupId(0)
# The metadata group's log is compacted like a partition's (compaction.py), with the
# catalog as its state: small segments, and about this much log kept behind the
# catalog's latest start point, so a restart replays a few MiB, not the cluster's life.
METADATA_LOG_CONFIG = {"segment_bytes": 1 << 20, "retention_bytes": 8 << 20, "retention_ms": -1}
GROUP_REOPEN_DELAY_S = 1.0  # before a failed group is opened again from disk
# How long (in election timeouts) a new group's other voters wait quietly for its first
# voter's campaign before they start their own clocks (GroupRuntime.hold_for_first_voter).
FIRST_VOTER_WAIT_TIMEOUTS = 4


def open_group(node: Node, group_id: GroupId, voters: list[NodeId], machine: Any,
               topic_config: Mapping[str, Any] | None = None, replicas: Sequence[NodeId] = ()) -> GroupRuntime:
    """Open (or create) a group's replica; a new group's first voter campaigns at once.
    `topic_config`: the topic's `segment_bytes`, `segment_ms`, `retention_ms`,
    `retention_bytes` and `flush` (the node's settings where it has none). `replicas`:
    the catalog's, which with `voters` are whom a replica in repair tells what it holds
    (`Config.repair_contacts`)."""
    config = node.config
    assert node.db is not None
    directory = config.data_dir / "groups" / str(group_id)
    make_private_dirs(directory)
    store_config = StoreConfig(
        verify_crc=not node.hooks.skip_crc, persist_vote=not node.hooks.vote_without_persist,
        **topic_store_settings(node, topic_config or {}),
    )
    store = SegmentStore(group_id, str(directory), node.db, node.files, store_config)
    # Bootstrap only a replica that never existed: an empty log with a recorded term is
    # a damaged one (needs repair), which learns its log, membership included, from the leader.
    created = store.last_index() == 0 and store.initial_state().hard_state.term == 0 and node.id in voters
    if created:
        entries, hard_state = bootstrap_entries(voters)
        store.append(entries)
        store.set_hard_state(hard_state)
        store.sync()
    core_config = Config(
        node_id=node.id,
        election_timeout_ticks=config.election_timeout_ticks,
        heartbeat_interval_ticks=config.heartbeat_interval_ticks,
        replica_lag_time_max_ticks=config.replica_lag_time_max_ticks,
        applied=Index(store.first_index() - 1),
        repair_contacts=frozenset(voters) | frozenset(replicas),
    )
    logger = node.logger.bind(group_id=group_id)
    start = store.snapshot()
    if start.meta.index > 0 and start.data is not None:
        machine.restore(start.data, start.meta.index)  # the state the compacted log began from
    core = RaftCore(core_config, store, random.Random(node.rng.random()), logger)
    partition = isinstance(machine, PartitionMachine)
    runtime = GroupRuntime(group_id, core, store, machine, GroupDeps(
        send=node.send, logger=logger, on_role_change=node.on_role_change,
        check_data=check_stored_batch if partition else None,
        on_quiesce=node.on_quiesce, on_failure=lambda failed: _on_failure(node, failed),
        is_live=node.is_live, latencies=node.latencies,
        sync=node.flusher.sync, sync_in_background=node.flusher.sync_in_background,
        store_lazily=node.flusher.store_lazily, write_states=node.flusher.write_states,
        boundaries=Boundaries() if partition or isinstance(machine, CatalogMachine) else None,
        # A reopened group (its storage failed) may have applied past the commit it had
        # stored: its readers saw that far, so it serves reads again only from there.
        replay_until=Index(max(store.initial_state().hard_state.commit, node.replay_floor.pop(group_id, 0))),
        # The ack-before-fsync control (RAFTLOG_UNSAFE): a faulty strategy, injected.
        persistence_fault=AckBeforeFsync if node.hooks.ack_before_fsync else None,
    ))
    if created and voters[0] == node.id:
        runtime.request_campaign()
    elif created:
        runtime.hold_for_first_voter()
        hold_s = FIRST_VOTER_WAIT_TIMEOUTS * config.election_timeout_ticks * config.tick_ms / 1000
        asyncio.get_running_loop().call_later(hold_s, runtime.release_hold)
    node.groups[group_id] = runtime
    node.stores[group_id] = store
    runtime.start()
    return runtime


async def close_group(node: Node, group_id: GroupId, delete: bool) -> None:
    runtime = node.groups.pop(group_id)
    await runtime.stop()
    machine = node.partitions.pop(group_id, None)
    store = node.stores.pop(group_id)
    if machine is not None:
        machine.close()
    if not runtime.failed:  # a failed store may not sync (disk full): what it lost, a crash loses
        try:
            store.sync()
        except (OSError, StorageError) as error:
            node.logger.error("group_sync_failed_at_close", group_id=group_id, error=repr(error))
    store.close()
    if delete:
        shutil.rmtree(node.config.data_dir / "groups" / str(group_id), ignore_errors=True)
    node.logger.info("group_closed", group_id=group_id, deleted=delete)


def _on_failure(node: Node, group_id: GroupId) -> None:
    node.start_task(reopen_failed(node, group_id))


async def reopen_failed(node: Node, group_id: GroupId) -> None:
    """A group whose storage failed (say, the disk filled up) is closed and opened again
    from disk after a pause, as a restart of the node would: the recovered log is what a
    crash at that moment leaves, and Raft brings the replica back up to date."""
    await asyncio.sleep(GROUP_REOPEN_DELAY_S)
    runtime = node.groups.get(group_id)
    if runtime is None or not runtime.failed:
        return
    if isinstance(runtime.failure, CorruptionError):  # met reading its log, say to replicate it
        node.stores[group_id].request_full_check()
    await _reopen(node, group_id, runtime)


def report_damage(node: Node, group_id: GroupId) -> None:
    """A read of this replica's log met a frame that fails its checksum. Reopen the group
    with a full check of its segments: recovery cuts the log before the bad frame and
    marks it for repair (no vote until it caught up), and the leader sends the rest
    again, as after a restart that found the damage. Never serves the bad bytes."""
    runtime = node.groups.get(group_id)
    store = node.stores.get(group_id)
    if runtime is None or store is None or group_id in node.repairing:
        return
    node.repairing.add(group_id)
    store.request_full_check()
    node.start_task(_reopen_damaged(node, group_id))


async def _reopen_damaged(node: Node, group_id: GroupId) -> None:
    try:
        runtime = node.groups.get(group_id)
        if runtime is not None and not runtime.failed:  # a failed one is reopened by reopen_failed
            await _reopen(node, group_id, runtime)
    finally:
        node.repairing.discard(group_id)


async def _reopen(node: Node, group_id: GroupId, runtime: GroupRuntime) -> None:
    # What its readers may have seen: it applied this far, or (reopened before and failed
    # again before catching up) it was still owed this much.
    node.replay_floor[group_id] = max(runtime.core.applied_index, runtime.replay_until)
    await close_group(node, group_id, delete=False)
    node.logger.warning("group_reopening", group_id=group_id)
    if group_id == METADATA_GROUP:
        node.catalog = Catalog()  # replayed from the log from scratch
        try:
            open_metadata_group(node)
        except OSError as error:
            node.logger.error("group_open_failed", group_id=group_id, error=repr(error))
            raise SystemExit(f"the metadata group cannot be reopened: {error!r}") from None
    node.catalog_changed()  # the reconciler reopens partition groups


def open_metadata_group(node: Node) -> GroupRuntime:
    return open_group(node, METADATA_GROUP, sorted(node.config.initial_cluster), CatalogMachine(node),
                      METADATA_LOG_CONFIG)


async def reconcile_loop(node: Node, changed: asyncio.Event) -> None:
    """Open the partition groups the catalog assigns here; close and delete the others."""
    while True:
        await changed.wait()
        changed.clear()
        node.update_peers()
        wanted = groups_for_node(node.catalog, node.id)
        opened = closed = 0
        for group_id, local in sorted(wanted.items()):
            if group_id not in node.groups:
                machine = PartitionMachine(local.topic, local.partition, dedup=not node.hooks.no_dedup)
                node.partitions[group_id] = machine
                topic = node.catalog.topics.get(local.topic)
                try:
                    # A copy on a node the partition moved to (not among the voters it was
                    # created with) starts empty and learns its log from the leader.
                    open_group(node, group_id, list(local.bootstrap_voters or local.replicas), machine,
                               topic.config if topic is not None else None, local.replicas)
                except (OSError, StorageError) as error:  # e.g. the disk is full (DiskFullError): try again shortly
                    node.partitions.pop(group_id, None)
                    node.logger.error("group_open_failed", group_id=group_id, error=repr(error))
                    asyncio.get_running_loop().call_later(GROUP_REOPEN_DELAY_S, node.catalog_changed)
                    continue
                opened += 1
                node.logger.info("group_opened", group_id=group_id, topic=local.topic, partition=local.partition)
            else:
                topic = node.catalog.topics.get(local.topic)
                if topic is not None:
                    apply_topic_config(node, group_id, topic.config)
        for group_id in sorted(set(node.groups) - set(wanted) - {METADATA_GROUP}):
            await close_group(node, group_id, delete=True)
            closed += 1
        if opened or closed:
            pause = heap.settle(groups_closed=closed > 0)
            node.logger.info("heap_settled", opened=opened, closed=closed, pause_ms=round(pause * 1000, 1))


def topic_store_settings(node: Node, topic_config: Mapping[str, Any]) -> dict[str, Any]:
    """The StoreConfig fields a topic's config decides, with the defaults for keys it
    does not set (so removing a key restores the default)."""
    defaults = StoreConfig()
    return {"segment_bytes_max": node.config.segment_bytes_max, "segment_ms_max": defaults.segment_ms_max,
            "retention_ms": defaults.retention_ms, "retention_bytes": defaults.retention_bytes,
            "flush": node.config.flush} | retention_settings(topic_config)


def apply_topic_config(node: Node, group_id: GroupId, topic_config: Mapping[str, Any]) -> None:
    """A topic's settings changed after its replica opened: the store takes them at once
    (retention at the next compaction round, segment size at the next roll)."""
    store = node.stores.get(group_id)
    if store is None:
        return
    wanted = dataclasses.replace(store.config, **topic_store_settings(node, topic_config))
    if wanted != store.config:
        store.config = wanted
        node.logger.info("topic_config_applied", group_id=group_id, segment_bytes_max=wanted.segment_bytes_max,
                         segment_ms_max=wanted.segment_ms_max, retention_ms=wanted.retention_ms,
                         retention_bytes=wanted.retention_bytes, flush=wanted.flush.mode.value)


def retention_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """StoreConfig fields from a topic's config (Kafka's segment.bytes, segment.ms,
    retention.ms, retention.bytes, spelled with underscores, and the flush policy);
    absent keys keep the defaults."""
    settings: dict[str, Any] = {}
    if "segment_bytes" in config:
        settings["segment_bytes_max"] = int(config["segment_bytes"])
    if "segment_ms" in config:
        settings["segment_ms_max"] = int(config["segment_ms"])
    if "flush" in config:
        settings["flush"] = FlushPolicy.parse(str(config["flush"]))
    for key in ("retention_ms", "retention_bytes"):
        if key in config:
            value = int(config[key])
            settings[key] = None if value < 0 else value  # -1: unlimited, as in Kafka
    return settings


class LedPartition(NamedTuple):
    group_id: GroupId
    runtime: GroupRuntime
    topic: str
    info: PartitionInfo


def led_partitions(node: Node) -> list[LedPartition]:
    """The partition groups this node leads, with their catalog entries (a group of a
    topic being deleted is left out): what leadership balancing and replica moves act on."""
    led = []
    for group_id, machine in sorted(node.partitions.items()):
        runtime = node.groups.get(group_id)
        if runtime is None or runtime.core.role is not Role.LEADER:
            continue
        topic = node.catalog.topics.get(machine.state.topic)
        if topic is None or machine.state.partition >= len(topic.partitions):
            continue
        led.append(LedPartition(group_id, runtime, topic.name, topic.partitions[machine.state.partition]))
    return led
