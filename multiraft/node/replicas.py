"""A node's group replicas: open, close, reopen after a storage failure, reconcile.

Every node applies the catalog and reconciles its groups with it: it opens the
groups the catalog assigns to it (creating them on first sight, bootstrapped
with the replicas the partition was created with as voters; a copy on a node
the partition moved to starts empty) and closes and deletes the rest, a leaving copy
once its group removed it (multiraft/node/reassignment.py). A group
whose storage fails (the disk filled up) is closed and opened again from disk
after a pause, as a restart of the node would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from multiraft.metadata.catalog import Catalog, groups_for_node
from multiraft.metadata.commands import NodeStatus
from multiraft.node import catchup_leader, draining
from multiraft.node.compaction import Boundaries, restore_state
from multiraft.node.machines import CatalogMachine, PartitionMachine
from multiraft.node.mirror_bootstrap import bootstrap_mirror, mirror_start
from multiraft.node.mirror_prefix import PrefixBuilder
from multiraft.node.registry import METADATA_GROUP, TrackedRuntime
from multiraft.node.reopening import Reopening
from multiraft.node.store_settings import (
    apply_topic_config,
    retention_settings,
    topic_store_settings,
)
from multiraft.runtime import failover, heap
from multiraft.runtime.group import GroupDeps, GroupRuntime
from multiraft.runtime.persistence import AckBeforeFsync
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Message, Role
from raftlog.storage import StorageError
from raftlog.types import GroupId, Index, NodeId
from storage.batch import check_stored_batch
from storage.config import StoreConfig
from storage.errors import CorruptionError
from storage.files import make_private_dirs
from storage.prefix import PREFIX_MARKER

if TYPE_CHECKING:
    from multiraft.metadata.catalog_records import LocalGroup
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.config import NodeConfig
    from multiraft.node.faults import Faults
    from multiraft.node.local_storage import LocalStorage
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.histograms import NodeLatencies
    from storage.segments import SegmentStore

__all__ = ["METADATA_GROUP", "Replicas", "retention_settings"]

# The metadata group's log is compacted like a partition's (compaction.py), with the
# catalog as its state: small segments, and about this much log kept behind the
# catalog's latest start point, so a restart replays a few MiB, not the cluster's life.
METADATA_LOG_CONFIG = {"segment_bytes": 1 << 20, "retention_bytes": 8 << 20, "retention_ms": -1}
GROUP_REOPEN_DELAY_S = 1.0  # before a failed group is opened again from disk
# How long (in election timeouts) a new group's other voters wait quietly for its first
# voter's campaign before they start their own clocks (GroupRuntime.hold_for_first_voter).
FIRST_VOTER_WAIT_TIMEOUTS = 4
# Groups opened per loop turn: each open makes a directory, a segment file and database
# writes on the loop (about a millisecond); a thousand in one pass held the loop for
# 1.1-9.5 s, long enough for the peers to count the node silent (docs/scale.md).
OPEN_CHUNK_GROUPS = 32
# At start, how long (in election timeouts) the partition groups wait for the metadata
# group to know a leader: registration needs it, and elections of thousands of partition
# groups beside it would drown it (docs/scale.md, "the storm", step 5).
METADATA_FIRST_WAIT_TIMEOUTS = 10


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaLinks:
    """What a node's group runtimes call back into: the rest of the node, as callables."""

    send: Callable[[GroupId, Message], None]
    on_quiesce: Callable[[GroupId, int, int], None]
    is_live: Callable[[int], bool]
    start_task: Callable[[Coroutine[Any, Any, None], str], None]
    update_peers: Callable[[], None]
    leader_of: Callable[[GroupId], int]  # what this node knows: its replica's view, or the pings'
    node_ticks: Callable[[], int]  # the ticker's count (GroupDeps.node_ticks)
    wake_after_ticks: Callable[[int, Any], None]  # the ticker's timers (GroupDeps.wake_after_ticks)
    # Told of each store whose closed segments changed (the tree sidecar warmer's list).
    segments_changed: Callable[[SegmentStore], None] | None = None
    opened: Callable[[GroupId], None] | None = None  # a group opened here (early vote requests: messaging.py)


@dataclasses.dataclass(slots=True)
class _Chunk:
    """Groups whose stores are open, waiting for `flush` (of the new ones, `flushed`)."""

    opening: list[tuple[GroupId, LocalGroup, list[NodeId], SegmentStore, bool]]
    flushed: list[GroupId]
    flush: asyncio.Future[list[Any]]


class Replicas:
    """The lifecycle of a node's group replicas; the only writer of the `GroupRegistry`."""

    def __init__(self, config: NodeConfig, registry: GroupRegistry, catalog: CatalogHolder, storage: LocalStorage,
                 faults: Faults, latencies: NodeLatencies, links: ReplicaLinks, logger: Any) -> None:
        self.id = config.node_id
        self._config = config
        self._registry = registry
        self._catalog = catalog
        self._storage = storage
        self._faults = faults
        self._latencies = latencies
        self._links = links
        self._logger = logger
        self._rng = random.Random()
        self.replay_floor: dict[GroupId, Index] = {}  # applied index of groups being reopened
        self.repairing: set[GroupId] = set()  # groups reopening because a read met corruption
        self._closing: set[GroupId] = set()  # being closed: not opened again until that is done
        self._dead_seen: set[int] = set()  # nodes the catalog said were dead, at the last look
        self._seen_at_start: set[GroupId] = set()  # once assigned here; unless wanted, deleted next pass
        self._election_timeout_s = timeout_s = config.election_timeout_ticks * config.tick_ms / 1000
        self._campaign_pacer = failover.CampaignPacer(  # campaigns, paced node-wide (failover.py)
            slot_timeout_s=failover.SLOT_TIMEOUTS * timeout_s, others_hold_s=failover.OTHERS_HOLD_TIMEOUTS * timeout_s)
        self._reopening = Reopening(self.id, registry, links.leader_of, links.is_live, self._campaign_pacer,
                                    timeout_s, self._rng)
        self.prefixes = PrefixBuilder(registry, storage, self.close_group, logger)  # mirror resyncs' kept prefixes

    def open_group(self, group_id: GroupId, voters: list[NodeId], machine: Any,
                   topic_config: Mapping[str, Any] | None = None, replicas: Sequence[NodeId] = ()) -> GroupRuntime:
        """Open (or create) a group's replica; a new group's first voter campaigns at once.
        `machine`: a `PartitionMachine`, or group 0's `CatalogMachine`. `topic_config`: the
        topic's `segment_bytes`, `segment_ms`, `retention_ms`, `retention_bytes` and
        `flush` (the node's settings where it has none). `replicas`: the catalog's, which
        with `voters` are whom a replica in repair tells what it holds (`Config.repair_contacts`).
        One group, synced on the loop (the metadata group); `reconcile_loop` opens many in chunks."""
        opened = self.open_store(group_id, voters, topic_config)
        assert opened is not None
        store, created = opened
        if created:
            store.sync()
        return self.start_group(group_id, store, created, voters, machine, replicas)

    def open_store(self, group_id: GroupId, voters: list[NodeId], topic_config: Mapping[str, Any] | None,
                   mirror: tuple[str, int, int, int] | None = None,
                   create: bool = True) -> tuple[SegmentStore, bool] | None:
        """A group's store, and whether it was created now: then it holds the bootstrap entries (a mirror's
        start point: mirror_bootstrap.py), not yet durable (the caller syncs them before the group runs).
        Not `create`: only a store holding a log (None, nothing made, for one that would start empty)."""
        storage = self._storage
        assert storage.db is not None and storage.files is not None and storage.flusher is not None
        directory = storage.groups_directory / str(group_id)
        if not create and (not storage.files.exists(str(directory))  # or a prefix's build unfinished (mirror_prefix.py):
                           or storage.files.exists(str(directory / PREFIX_MARKER))):
            return None
        make_private_dirs(directory)
        store_config = StoreConfig(**topic_store_settings(self._config, topic_config or {}))
        store = self._faults.open_store(group_id, str(directory), storage.db, storage.files, store_config,
                                        self._links.segments_changed, storage.entry_cache)
        # Bootstrap only a replica that never existed: an empty log with a recorded term is
        # a damaged one (needs repair), which learns its log, membership included, from the leader.
        fresh = store.last_index() == 0 and store.initial_state().hard_state.term == 0
        if fresh and not create:
            store.close()
            return None
        created = fresh and self.id in voters
        if created and mirror is not None:
            bootstrap_mirror(store, voters, *mirror)
        elif created:
            entries, hard_state = bootstrap_entries(voters)
            store.append(entries)
            store.set_hard_state(hard_state)
        return store, created

    def start_group(self, group_id: GroupId, store: SegmentStore, created: bool, voters: list[NodeId],
                    machine: Any, replicas: Sequence[NodeId]) -> GroupRuntime:
        """Build, register and start the runtime over `store`, whose bootstrap entries (if
        `created`) are durable: from here on the group may vote and campaign."""
        config, partition = self._config, isinstance(machine, PartitionMachine)
        core_config = Config(
            node_id=self.id,
            election_timeout_ticks=config.election_timeout_ticks,
            heartbeat_interval_ticks=config.heartbeat_interval_ticks,
            replica_lag_time_max_ticks=config.replica_lag_time_max_ticks,
            applied=restore_state(store, machine, use_checkpoint=partition),  # its checkpoint, or its log start
            repair_contacts=frozenset(voters) | frozenset(replicas),
            far_wait_lag_entries=config.far_catchup_lag_entries if partition else 0,
            far_wait_ticks=max(1, math.ceil(3 * catchup_leader.ROUND_S * 1000 / config.tick_ms)),
            far_wait_learners=partition and bool(config.far_catchup_lag_entries or config.far_catchup_lag_bytes))
        logger = self._logger.bind(group_id=group_id)
        core = RaftCore(core_config, store, random.Random(self._rng.random()), logger)
        flusher, links = self._storage.flusher, self._links
        assert flusher is not None
        runtime = TrackedRuntime(self._registry, group_id, core, store, machine, GroupDeps(
            send=links.send, logger=logger, on_role_change=self._on_role_change,
            check_data=check_stored_batch if partition else None,
            on_quiesce=links.on_quiesce, on_failure=self._on_failure,
            is_live=links.is_live, node_ticks=links.node_ticks, wake_after_ticks=links.wake_after_ticks,
            campaign_pacer=self._campaign_pacer,
            latencies=self._latencies,
            sync=flusher.sync, sync_in_background=flusher.sync_in_background,
            store_lazily=flusher.store_lazily, write_states=flusher.write_states,
            boundaries=Boundaries(group_id, self._registry.with_captures, store)
            if partition or isinstance(machine, CatalogMachine) else None,
            # A reopened group (its storage failed) may have applied past the commit it had
            # stored: its readers saw that far, so it serves reads again only from there.
            replay_until=Index(max(store.initial_state().hard_state.commit, self.replay_floor.pop(group_id, 0))),
            # The ack-before-fsync control (RAFTLOG_UNSAFE): a faulty strategy, injected.
            persistence_fault=AckBeforeFsync if self._faults.ack_before_fsync else None,
        ))
        first_voter_wait_s = FIRST_VOTER_WAIT_TIMEOUTS * self._election_timeout_s
        # A partition's first replica campaigns first, unless drained (draining.py).
        first = draining.first_campaigner([NodeId(n) for n in (voters if created else list(replicas) or voters)],
                                          self.id, self._catalog.catalog.drained_nodes(), self._links.is_live) \
            if partition else NodeId(voters[0] if voters else 0)
        if created and first == self.id:
            runtime.request_campaign()
        elif created:
            self._hold(runtime, first_voter_wait_s)
        elif partition and store.last_index() > 0:  # reopened from disk (a restart): reopening.py
            self._reopening.reopened(runtime, first)
        self._registry.add(group_id, runtime, store, machine if partition else None)
        runtime.start()
        if self._links.opened is not None:
            self._links.opened(group_id)
        return runtime

    @staticmethod
    def _hold(runtime: GroupRuntime, hold_s: float) -> None:
        runtime.hold_for_first_voter()
        asyncio.get_running_loop().call_later(hold_s, runtime.release_hold)

    def open_metadata_group(self) -> GroupRuntime:
        return self.open_group(METADATA_GROUP, sorted(self._config.initial_cluster), CatalogMachine(self._catalog),
                               METADATA_LOG_CONFIG)

    async def close_group(self, group_id: GroupId, delete: bool,
                          before_close: Callable[[SegmentStore, bool], None] | None = None) -> None:
        """`before_close(store, synced)`: runs once the group stopped, its store still open;
        `synced`: whether its files were made durable (not when the sync failed, or the group had)."""
        self._closing.add(group_id)
        try:
            await self._close_group(group_id, delete, before_close)
        finally:
            self._closing.discard(group_id)

    async def _close_group(self, group_id: GroupId, delete: bool, before_close: Any = None) -> None:
        runtime, store, machine = self._registry.remove(group_id)
        try:  # whatever raises, the store closes: its files and cached entries (the node's budget) go
            await runtime.stop()
            if machine is not None:
                machine.close()
            synced = not runtime.failed
            if synced:  # a failed store may not sync (disk full): what it lost, a crash loses
                try:
                    store.sync()
                except (OSError, StorageError) as error:
                    synced = False
                    self._logger.error("group_sync_failed_at_close", group_id=group_id, error=repr(error))
            if before_close is not None:
                before_close(store, synced)
        finally:
            store.close()
        if delete:
            self._remove_group_directory(group_id)
        self._logger.info("group_closed", group_id=group_id, deleted=delete)

    def _remove_group_directory(self, group_id: GroupId) -> None:
        """Through `Files.remove_tree`: the chaos write-behind double forgets its names too."""
        files = self._storage.files
        assert files is not None
        files.remove_tree(str(self._storage.groups_directory / str(group_id)))

    def _on_role_change(self, group_id: GroupId, role: Role, term: int) -> None:
        self._registry.note_role(group_id, role, term)
        machine = self._registry.partitions.get(group_id)
        if machine is not None and role is not Role.LEADER:
            machine.state.drop_proposals()

    def _on_failure(self, group_id: GroupId) -> None:
        self._links.start_task(self.reopen_failed(group_id), "reopen-failed")

    async def reopen_failed(self, group_id: GroupId) -> None:
        """A group whose storage failed (say, the disk filled up) is closed and opened again
        from disk after a pause, as a restart of the node would: the recovered log is what a
        crash at that moment leaves, and Raft brings the replica back up to date."""
        await asyncio.sleep(GROUP_REOPEN_DELAY_S)
        runtime = self._registry.groups.get(group_id)
        if runtime is None or not runtime.failed:
            return
        if isinstance(runtime.failure, CorruptionError):  # met reading its log, say to replicate it
            self._registry.stores[group_id].request_full_check()
        await self._reopen(group_id, runtime)

    def report_damage(self, group_id: GroupId) -> None:
        """A read of this replica's log met a frame that fails its checksum. Reopen the group
        with a full check of its segments: recovery cuts the log before the bad frame and
        marks it for repair (no vote until it caught up), and the leader sends the rest
        again, as after a restart that found the damage. Never serves the bad bytes."""
        runtime = self._registry.groups.get(group_id)
        store = self._registry.stores.get(group_id)
        if runtime is None or store is None or group_id in self.repairing:
            return
        self.repairing.add(group_id)
        store.request_full_check()
        self._links.start_task(self._reopen_damaged(group_id), "reopen-damaged")

    async def _reopen_damaged(self, group_id: GroupId) -> None:
        try:
            runtime = self._registry.groups.get(group_id)
            if runtime is not None and not runtime.failed:  # a failed one is reopened by reopen_failed
                await self._reopen(group_id, runtime)
        finally:
            self.repairing.discard(group_id)

    async def _reopen(self, group_id: GroupId, runtime: GroupRuntime) -> None:
        # What its readers may have seen: it applied this far, or (reopened before and failed
        # again before catching up) it was still owed this much.
        self.replay_floor[group_id] = max(runtime.core.applied_index, runtime.replay_until)
        await self.close_group(group_id, delete=False)
        self._logger.warning("group_reopening", group_id=group_id)
        if group_id == METADATA_GROUP:
            self._catalog.replace(Catalog())  # replayed from the log from scratch
            try:
                self.open_metadata_group()
            except OSError as error:
                self._logger.error("group_open_failed", group_id=group_id, error=repr(error))
                raise SystemExit(f"the metadata group cannot be reopened: {error!r}") from None
        self._catalog.changed()  # the reconciler reopens partition groups

    async def reconcile_loop(self) -> None:
        """Open the groups the catalog assigns here, close and delete the others (group 0 elects first)."""
        await self._wait_for_metadata_leader(METADATA_FIRST_WAIT_TIMEOUTS * self._election_timeout_s)
        while True:
            await self._catalog.wait_changed()
            self._links.update_peers()
            await self.reconcile(self._catalog.catalog, readable=self._catalog.readable)

    async def _wait_for_metadata_leader(self, bound_s: float) -> None:
        """Until this node knows group 0's leader (its replica's view, or the pings'), at
        most `bound_s`: a group 0 without a quorum must not keep the partitions shut.
        Meanwhile group 0 replays its log into the catalog: a copy some version of it
        assigned here but the catalog no longer assigns when the wait is over (moved away,
        its topic deleted) is deleted unopened by the first pass (not opened, then closed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        seen_at = None
        while True:
            catalog = self._catalog.catalog
            if seen_at != (id(catalog), catalog.applied_index):
                seen_at = (id(catalog), catalog.applied_index)
                self._seen_at_start |= set(groups_for_node(catalog, self.id))
            if self._links.leader_of(METADATA_GROUP) or loop.time() >= deadline:
                return
            await asyncio.sleep(self._config.tick_ms / 1000)

    async def reconcile(self, catalog: Catalog, readable: bool = True) -> None:
        """One pass: open what `catalog` assigns here and is not open, in chunks; apply
        topic settings to what is open; close and delete what it no longer assigns. Not
        `readable` (finalized above this build's feature level: it may misread what to create
        or delete, multiraft/node/features.py): open only the assigned groups it holds a log
        of, as a restart does; create, close and delete none until it is upgraded."""
        self._wake_leaders_of_dead_nodes(catalog)
        wanted = groups_for_node(catalog, self.id)
        stale, self._seen_at_start = (self._seen_at_start - set(wanted) - set(self._registry.groups), set()) \
            if readable else (set(), self._seen_at_start)
        for group_id in sorted(stale):
            self._remove_group_directory(group_id)
            self._logger.info("group_closed", group_id=group_id, deleted=True, opened=False)
        missing: list[tuple[GroupId, LocalGroup]] = []
        for group_id, local in sorted(wanted.items()):
            if group_id in self._registry.groups:
                topic = catalog.topics.get(local.topic)
                if topic is not None:
                    apply_topic_config(self._registry.stores.get(group_id), self._config, topic.config,
                                       self._logger, group_id)
            elif group_id not in self._closing:  # closing (a reopen): its reopen comes next pass
                missing.append((group_id, local))
        if readable:
            await self.prefixes.prepare(catalog, missing)  # before a new mirror incarnation first opens
        closed = 0
        chunks = [missing[i:i + OPEN_CHUNK_GROUPS] for i in range(0, len(missing), OPEN_CHUNK_GROUPS)]
        pauses: list[float] = []
        self._reopening.pass_begins()
        try:
            opened = await self._open_chunks(catalog, chunks, pauses, create=readable)
        finally:
            self._reopening.pass_over()
        for group_id in sorted(set(self._registry.groups) - set(wanted) - {METADATA_GROUP}) if readable else ():
            await self.close_group(group_id, delete=True)
            closed += 1
        if closed:
            pauses.append(heap.settle())  # what closing allocated; the groups went by refcount
        if pauses:
            self._logger.info("heap_settled", opened=opened, closed=closed, settles=len(pauses),
                              pause_ms_max=round(max(pauses) * 1000, 1), pause_ms_total=round(sum(pauses) * 1000, 1))

    async def _open_chunks(self, catalog: Catalog, chunks: list[list[tuple[GroupId, LocalGroup]]],
                           pauses: list[float], create: bool) -> int:
        """Open the groups of `chunks`, OPEN_CHUNK_GROUPS at a time; returns how many opened.

        Each chunk's new groups have their bootstrap entries made durable in one shared
        flush (the node's flusher: fsyncs on its thread, one synced database write for
        every hard state) instead of a `store.sync()` each on the loop. A group is
        registered and started only once that flush succeeded: until then no message
        reaches it (the inbox drops frames for groups it does not know) and it has no
        task, so it can neither vote nor campaign on entries that are not durable. The
        next chunk is prepared while a chunk's flush runs, and every chunk ends with a
        yield: opening thousands never holds the loop for more than one chunk. Each started
        chunk is settled into the frozen heap at once (`heap.settle`, its pause appended to
        `pauses`): a collection walks one chunk's objects, not a whole topic's."""
        opened = 0
        prepared: list[_Chunk] = []
        try:
            for chunk in chunks:
                prepared.append(self._prepare_chunk(catalog, chunk, create))
                if len(prepared) > 1:
                    opened += await self._start_chunk(prepared.pop(0))
                    pauses.append(heap.settle())
                await asyncio.sleep(0)
            while prepared:
                opened += await self._start_chunk(prepared.pop(0))
                pauses.append(heap.settle())
        except BaseException:  # cancelled (the node stops): nothing prepared here may leak
            for waiting in prepared:
                for _, _, _, store, _ in waiting.opening:
                    store.close()
            raise
        return opened

    def _prepare_chunk(self, catalog: Catalog, chunk: list[tuple[GroupId, LocalGroup]], create: bool) -> _Chunk:
        """Open the chunk's stores (the new ones with their bootstrap entries written) and
        start the one flush that makes those durable."""
        opening: list[tuple[GroupId, LocalGroup, list[NodeId], SegmentStore, bool]] = []
        for group_id, local in chunk:
            if group_id in self._registry.groups or group_id in self._closing:
                continue  # opened or being closed meanwhile (the chunks before yielded)
            topic = catalog.topics.get(local.topic)
            if topic is None or local.partition >= len(topic.partitions) or (
                    topic.partitions[local.partition].group_id != group_id):
                # The catalog changed in place while the pass awaited (a resync replaced the
                # incarnation, the topic went): created now it would take the newer one's start
                # offset and term. Not opened; the next pass deletes its files unless wanted again.
                self._seen_at_start.add(group_id)
                continue
            # A copy on a node the partition moved to (not among the voters it was
            # created with) starts empty and learns its log from the leader.
            voters = list(local.bootstrap_voters or local.replicas)
            try:
                opened = self.open_store(group_id, voters, topic.config, mirror_start(topic, local.partition), create)
            except (OSError, StorageError) as error:
                self._open_failed(group_id, error)
                continue
            if opened is not None:
                opening.append((group_id, local, voters, *opened))
        flusher = self._storage.flusher
        assert flusher is not None
        flushes = {group_id: flusher.sync_in_background(store) for group_id, _, _, store, created in opening if created}
        return _Chunk(opening, list(flushes), asyncio.gather(*flushes.values(), return_exceptions=True))

    async def _start_chunk(self, chunk: _Chunk) -> int:
        """Once the chunk's flush is done, start its groups (a group whose flush failed is
        closed and tried again shortly); returns how many started."""
        results = dict(zip(chunk.flushed, await chunk.flush, strict=True))
        opened = 0
        for group_id, local, voters, store, created in chunk.opening:
            failure = results.get(group_id)
            if isinstance(failure, BaseException):
                store.close()
                self._open_failed(group_id, failure)
                continue
            machine = self._faults.new_partition_machine(local.topic, local.partition)
            self.start_group(group_id, store, created, voters, machine, local.replicas)
            opened += 1
            self._logger.info("group_opened", group_id=group_id, topic=local.topic, partition=local.partition)
        return opened

    def _open_failed(self, group_id: GroupId, error: BaseException) -> None:  # e.g. DiskFullError: again shortly
        self._logger.error("group_open_failed", group_id=group_id, error=repr(error))
        asyncio.get_running_loop().call_later(GROUP_REOPEN_DELAY_S, self._catalog.changed)

    def _wake_leaders_of_dead_nodes(self, catalog: Catalog) -> None:
        """A node the catalog newly says is dead: the quiet groups this node leads with a
        replica there wake, so their leader drops it from the ISR (a silence alone wakes
        no leader: Ticker._on_silence_change)."""
        dead = {node for node, info in catalog.nodes.items() if info.status is NodeStatus.DEAD}
        newly, self._dead_seen = dead - self._dead_seen, dead
        if not newly:
            return
        woken = 0
        for group_id in list(self._registry.led):
            runtime = self._registry.groups[group_id]
            if runtime.quiesced and not newly.isdisjoint(runtime.core.membership.members):
                runtime.wake()
                woken += 1
        self._logger.info("leaders_woken_for_dead_nodes", nodes=sorted(newly), groups=woken)
