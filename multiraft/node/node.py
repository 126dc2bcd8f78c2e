"""A raftlog node: the composition root that builds its parts and starts and stops them.

One process, one `Node`. It builds, once, and hands each part only the
collaborators it uses (never the node):
- the `GroupRegistry` (multiraft/node/registry.py), the one owner of the group
  runtimes, stores and partition state machines, written by `Replicas` alone;
- the `CatalogHolder`, the node's current catalog (group 0 applies it);
- one `Transport` (one connection per peer, all groups) with RPC on top, frames out
  and in (`messaging.py`: coalesced heartbeats, dispatch) and the `Ticker`
  (`ticker.py`: one timer for every group, pings, silence detection);
- local storage (`local_storage.py`: the state database, the flusher, the files);
- the services: replica lifecycle and reconcile (`replicas.py`), catalog changes
  (`metadata_ops.py`), admission, registration and node liveness (`controller.py`),
  produce (`produce.py`), reads and offsets (`partition_ops.py`), consumer groups
  (`group_coordinator.py` on the metadata leader, `group_reads.py` anywhere), leadership
  balancing, replica moves, compaction, offsets retention;
- `api`, the narrow `NodeApi` the HTTP edge is given (`api.py`).

The chaos runner's switches (`unsafe.py`) are turned into collaborators here, once
(`faults.py`): no part reads a switch on its hot path.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import structlog

from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import Command
from multiraft.node import leadership, move_throttle, offsets_retention, open_files, reassignment
from multiraft.node.acks import Acks
from multiraft.node.api import NodeApi
from multiraft.node.catalog_holder import CatalogHolder
from multiraft.node.catchup_follower import CatchUpFollower
from multiraft.node.catchup_leader import CatchUpLeader
from multiraft.node.compaction import compaction_loop
from multiraft.node.config import NodeConfig
from multiraft.node.consumer_instances import ConsumerInstances
from multiraft.node.controller import Controller, host_port
from multiraft.node.faults import Faults
from multiraft.node.features import FeatureGate
from multiraft.node.group_admin import GroupAdmin
from multiraft.node.group_coordinator import GroupCoordinator
from multiraft.node.group_reads import GroupReads
from multiraft.node.local_storage import LocalStorage
from multiraft.node.machines import PartitionMachine
from multiraft.node.messaging import Inbox, Outbox
from multiraft.node.metadata_ops import MetadataOps
from multiraft.node.mirror_links import MirrorLinks
from multiraft.node.mirror_pull import MirrorPulls
from multiraft.node.mirror_trees import PartitionTrees
from multiraft.node.mirror_verify import MirrorVerifier
from multiraft.node.move_throttle import BytePace, MoveThrottle
from multiraft.node.partition_ops import PartitionOps
from multiraft.node.produce import Produce
from multiraft.node.produce_result import ProduceResult
from multiraft.node.registry import METADATA_GROUP, GroupRegistry
from multiraft.node.replicas import ReplicaLinks, Replicas
from multiraft.node.routing import Routing
from multiraft.node.scheduled_scrubs import ScheduledScrubs
from multiraft.node.scrub_schedule import ScrubSchedule
from multiraft.node.scrub_trees import ReplicaTrees
from multiraft.node.scrubber import Scrubber
from multiraft.node.ticker import Ticker
from multiraft.node.tree_sidecars import ChangedStores, SidecarWarmer
from multiraft.node.unsafe import ChaosHooks
from multiraft.runtime.group import GroupRuntime, GroupStatus
from multiraft.runtime.histograms import NodeLatencies
from multiraft.runtime.loop_lag import watch_loop_lag
from multiraft.runtime.supervision import supervised, watch
from multiraft.transport.rpc import Rpc
from multiraft.transport.transport import Transport
from raftlog.types import GroupId, NodeId
from storage.batch import BatchHeader
from storage.files import Files
from storage.segments import SegmentStore
from storage.state_db import StateDatabase

__all__ = ["METADATA_GROUP", "Node"]

STOP_CHUNK_GROUPS = 256  # group runtimes stopped together (each cancels and awaits its task)


class Node:
    def __init__(self, config: NodeConfig, logger: Any = None, hooks: ChaosHooks | None = None) -> None:
        """`hooks`: the chaos runner's switches (multiraft/node/unsafe.py); None reads the environment."""
        self.config = config
        self.id = config.node_id
        self.logger = (logger or structlog.get_logger()).bind(node_id=self.id)
        self.hooks = hooks if hooks is not None else ChaosHooks.from_environment()
        self.faults = Faults.of(self.hooks)
        self.registry = GroupRegistry()
        self.catalog_holder = CatalogHolder(self.faults.new_groups_state, self.hooks.supported_level)
        self.latencies = NodeLatencies()  # fsync, replicate and apply histograms (/metrics)
        self.ticker = Ticker(config, self.registry, self.logger)
        self.liveness = self.ticker.liveness
        self.routing = Routing(self.id, config.initial_cluster, self.registry, self.catalog_holder, self.liveness)
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.open_files_limit = 0  # the soft RLIMIT_NOFILE, raised at start (multiraft/node/open_files.py)
        self._build_network()
        self.storage = LocalStorage(config.data_dir, self.faults, self.latencies, self.logger,
                                    config.entry_cache_bytes)
        self.changed_stores = ChangedStores()  # for the tree sidecar warmer (multiraft/node/tree_sidecars.py)
        self.replicas = Replicas(config, self.registry, self.catalog_holder, self.storage, self.faults,
                                 self.latencies, ReplicaLinks(
                                     send=self.outbox.send, on_quiesce=self.outbox.on_quiesce,
                                     is_live=self.liveness.is_live, start_task=self.start_task,
                                     update_peers=self.update_peers, leader_of=self.routing.leader_of,
                                     node_ticks=self.ticker.now, wake_after_ticks=self.ticker.wake_after,
                                     segments_changed=self.changed_stores.note, opened=self.inbox.opened,
                                 ), self.logger)
        self._build_services()

    def _build_network(self) -> None:
        """The transport, RPC over it, and the node's frames in and out."""
        config = self.config
        peers = {n: (a.host, a.port) for n, a in config.initial_cluster.items() if n != self.id}
        # The transport hands frames to the inbox, which hands RPC frames to the RPC layer,
        # which sends over the transport: the one loop of the wiring, closed here.
        self.transport = Transport(
            self.id, config.raft_addr.host, config.raft_addr.port, peers,
            config.cluster_secret, lambda *frame: self.inbox.on_frame(*frame), logger=self.logger,
            tls=config.peer_tls(),
        )
        self.rpc = Rpc(self.transport.send, self.logger)
        self.rpc.peer_alive = self.liveness.is_live
        self.inbox = Inbox(self.id, self.registry, self.liveness, self.rpc.on_frame, self.logger)
        self.transport.on_peer_refused = self.inbox.on_peer_refused
        self.outbox = Outbox(self.id, self.transport, self.registry, self.logger)
        self.move_throttle = MoveThrottle(self._move_rate, self.outbox.send_now, self.logger,
                                          on_drop=self._dropped_on_the_way)
        self.outbox.throttle = self.move_throttle

    def _build_services(self) -> None:
        self.metadata = MetadataOps(self.id, self.registry, self.catalog_holder, self.rpc,
                                    lambda: self.open_files_limit, self.config.initial_cluster)
        # The cluster's feature level (multiraft/node/features.py): its answer rides on the node heartbeat's.
        self.features = FeatureGate(self.id, self.registry, self.catalog_holder, self.metadata, self.rpc, self.logger,
                                    initial_voters=sorted(self.config.initial_cluster))
        self.controller = Controller(self.config, self.registry, self.catalog_holder, self.metadata, self.rpc,
                                     self.transport, self.logger, heartbeat_answer=self.features.heartbeat_answer,
                                     heard=self.features.heard)
        self.metadata.unplaceable = self.features.below_level  # placement leaves out a node below the level
        self.producer = Produce(self.routing, self.catalog_holder, self.rpc, self.metadata.sync_catalog)
        self.reads = PartitionOps(self.routing, self.catalog_holder, self.rpc, self.faults.read_end,
                                  self.replicas.report_damage, self.logger)
        self.group_coordinator = GroupCoordinator(self.registry, self.catalog_holder, self.rpc,
                                                  self.reads.commit_offsets, self.logger)
        self.group_reads = GroupReads(self.group_coordinator, self.reads, self.routing, self.catalog_holder, self.rpc)
        self.group_admin = GroupAdmin(self.group_coordinator, self.group_reads, self.reads, self.catalog_holder,
                                      self.registry)
        self.consumer_instances = ConsumerInstances(self.group_coordinator, self.group_reads, self.reads, self.registry,
                                                    self.catalog_holder, self.rpc, self.logger)
        self.balancer = leadership.Balancer(self.routing, leadership.BalanceSettings.of(self.config), self.logger)
        leadership.serve_balance(self.balancer, self.rpc)
        # Scheduled scrubs (scheduled_scrubs.py): None when off; seeded apart per node, so
        # nodes restarted together do not draw the same first due times.
        schedule = ScrubSchedule(self.config.scrub_interval_s, random.Random()) \
            if self.config.scrub_interval_s > 0 else None
        trees = ReplicaTrees(self.registry, self.replicas.report_damage, logger=self.logger,
                             pace=BytePace(self.config.scrub_bytes_per_s),
                             read_whole=lambda group_id: schedule.note_scrubbed(group_id, time.time())
                             if schedule is not None else None)
        self.scrubber = Scrubber(self.registry, self.catalog_holder, self.routing, self.rpc, trees)
        self.scheduled_scrubs = ScheduledScrubs(self.id, self.scrubber, self.registry, schedule, self.logger)
        self.sidecar_warmer = SidecarWarmer(self.registry, self.scrubber.trees.sidecars, self.changed_stores,
                                            self.logger, self.config.tree_sidecar_bytes_per_s)
        self.scrubber.serve(self.rpc)
        self.catchup_leader = CatchUpLeader(self.registry, self.rpc, (self.config.far_catchup_lag_entries,
                                                                       self.config.far_catchup_lag_bytes),
                                            self.move_throttle.acquire, self.liveness.is_live, self.start_task,
                                            self.logger, side=self.transport.side_channel())
        self.catchup_leader.serve(self.rpc)
        self.catchup_follower = CatchUpFollower(self.registry, self.catalog_holder, self.storage, self.rpc,
                                                self.replicas.close_group, self.start_task, self.logger,
                                                side=self.transport.side_channel())
        self.catchup_follower.serve(self.rpc)
        # The sink reads its sources from this node's own address, as its Raft links do
        # (firewall rules between two clusters on one host match it: chaos/mirror.py).
        source_host = None if self.config.http_addr.host in ("", "0.0.0.0", "::") else self.config.http_addr.host
        self.mirror_pulls = MirrorPulls(self.registry, self.catalog_holder, self.logger, local_host=source_host,
                                        chunk_filter=self.faults.mirror_chunk, metadata=self.metadata)
        # The full sync (docs/mirror.md): the source serves trees, the sink's leaders compare.
        self.partition_trees = PartitionTrees(self.scrubber.trees, self.registry, self.catalog_holder, self.routing,
                                              self.rpc)
        self.partition_trees.serve(self.rpc)
        self.mirror_verifier = MirrorVerifier(self.registry, self.catalog_holder, self.routing, self.rpc,
                                              self.scrubber.trees, self.metadata, self.logger,
                                              local_host=source_host)
        self.mirror_verifier.serve(self.rpc)
        self.mirrors = MirrorLinks(self.id, self.catalog_holder, self.metadata, self.routing, self.rpc,
                                   self.mirror_pulls, self.logger, self.mirror_verifier)
        self.api = NodeApi(
            config=self.config, hooks=self.hooks, registry=self.registry, catalog=self.catalog_holder,
            routing=self.routing, metadata=self.metadata, controller=self.controller, produce=self.producer,
            reads=self.reads, groups=self.group_coordinator, group_reads=self.group_reads,
            group_admin=self.group_admin, instances=self.consumer_instances, ticker=self.ticker,
            transport=self.transport, latencies=self.latencies,
            balance_leaders=self.balance_leaders, scrubber=self.scrubber, throttle=self.move_throttle,
            scheduled_scrubs=self.scheduled_scrubs,
            catchup_counts=self._catchup_counts,
            mirrors=self.mirrors, trees=self.partition_trees, features=self.features,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        config = self.config
        self.open_files_limit = open_files.raise_soft_limit()
        self.storage.open()
        self._announce_chaos_hooks()
        self._started = True
        await self.transport.start()
        if config.join is not None:
            await self.controller.join(config.join)
        self.replicas.open_metadata_group()
        controller, routing, logger = self.controller, self.routing, self.logger
        for name, loop in (
            ("ticker", lambda: self.ticker.run(routing.peer_ids, lambda peers: self.outbox.ping(peers, self.liveness))),
            ("reconciler", self.replicas.reconcile_loop),
            ("registrar", controller.register),
            ("node-heartbeats", controller.send_heartbeats),
            ("controller", controller.watch_liveness),
            ("decommissions", controller.run_decommissions),
            ("leader-balancer", self.balancer.run),
            ("replica-mover", lambda: reassignment.move_loop(routing, self.metadata.propose, logger)),
            ("compaction", lambda: compaction_loop(self.registry, logger)),
            ("loop-lag", lambda: watch_loop_lag(self.latencies.loop_lag)),
            ("offsets-retention", lambda: offsets_retention.retention_loop(self.registry, config, logger)),
            ("group-coordinator", self.group_coordinator.run),
            ("move-throttle", self.move_throttle.run),
            ("far-catchup", self.catchup_leader.run),
            ("mirror-pulls", self.mirror_pulls.run),  # docs/mirror.md
            ("mirror-links", self.mirrors.run),
            ("mirror-verify", self.mirror_verifier.run),
            ("tree-sidecars", self.sidecar_warmer.run),
            ("scheduled-scrubs", self.scheduled_scrubs.run),  # docs/mirror.md "Scheduled scrubs"
            ("features", self.features.run),  # a new cluster's first level; a node below it says so
        ):
            self._tasks.append(asyncio.create_task(supervised(name, loop, logger), name=f"node-{self.id}-{name}"))
        logger.info("node_started", raft_addr=str(config.raft_addr), http_addr=str(config.http_addr),
                    open_files_limit=self.open_files_limit)

    def _announce_chaos_hooks(self) -> None:
        """Announce the chaos runner's switches (multiraft/node/unsafe.py), if any."""
        hooks = self.hooks
        if hooks.write_behind_files:
            self.logger.warning("chaos_write_behind_files",
                                detail="unsynced segment writes stay in memory: kill -9 loses them")
        if hooks.unsafe:
            self.logger.warning("unsafe_switches_enabled", switches=list(hooks.unsafe),
                                detail="this node may lose, duplicate or corrupt acknowledged data; "
                                       "chaos negative controls only")

    async def stop(self) -> None:
        """Stop cleanly: tasks, groups (their waiters fail with OutcomeUnknown), network, files."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.move_throttle.clear()
        await self.scrubber.trees.sidecars.close()
        runtimes = list(self.registry.groups.values())
        for start in range(0, len(runtimes), STOP_CHUNK_GROUPS):  # one by one, 3,000 took over 10 s
            chunk = runtimes[start:start + STOP_CHUNK_GROUPS]
            for runtime, outcome in zip(chunk, await asyncio.gather(*(r.stop() for r in chunk),
                                                                    return_exceptions=True), strict=True):
                if isinstance(outcome, Exception):  # stopping goes on: the files still close
                    self.logger.error("group_stop_failed", group_id=runtime.group_id, error=repr(outcome))
        await self.rpc.stop()
        self.catchup_leader.close()
        self.catchup_follower.close()
        if self._started:
            await self.transport.stop()
        await self.storage.close(self.registry.stores)
        self.registry.clear()
        self.logger.info("node_stopped")

    def _catchup_counts(self) -> dict[str, int]:
        follower = self.catchup_follower.counts
        return {**self.catchup_leader.counts, "follower_installed": follower["installed"],
                "follower_failed": follower["failed"], "bytes_received": follower["bytes_received"],
                "bytes_reused": follower["bytes_reused"]}

    def _move_rate(self) -> int:
        """Bytes/s for copies being made: the cluster setting, else this node's own."""
        return move_throttle.effective_rate(self.catalog.cluster_config, self.config.replica_move_bytes_per_s)

    def _dropped_on_the_way(self, group_id: GroupId, target: int) -> None:
        runtime = self.registry.groups.get(group_id)
        if runtime is not None:
            runtime.report_unreachable(target)

    def start_task(self, coroutine: Coroutine[Any, Any, None], name: str = "background") -> None:
        """Run node work in the background; stopped with the node, its failure logged."""
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(watch(asyncio.get_running_loop().create_task(coroutine), name, self.logger))

    def update_peers(self) -> None:
        """Dial every node the catalog knows, where it says it listens."""
        peers = {n: (a.host, a.port) for n, a in self.config.initial_cluster.items()}
        for node in self.catalog.nodes.values():
            peers[node.node_id] = host_port(node.raft_addr)
        peers.pop(self.id, None)
        self.transport.update_peers(peers)

    # ------------------------------------------------------------------ views (tests, the CLI)

    @property
    def catalog(self) -> Catalog:
        return self.catalog_holder.catalog

    @property
    def groups(self) -> Mapping[GroupId, GroupRuntime]:
        return self.registry.groups

    @property
    def stores(self) -> Mapping[GroupId, SegmentStore]:
        return self.registry.stores

    @property
    def partitions(self) -> Mapping[GroupId, PartitionMachine]:
        return self.registry.partitions

    @property
    def files(self) -> Files | None:
        return self.storage.files

    @property
    def db(self) -> StateDatabase | None:
        return self.storage.db

    @property
    def registered(self) -> asyncio.Event:
        return self.controller.registered

    @property
    def peer_silences(self) -> int:
        return self.ticker.peer_silences

    @property
    def groups_back_to_quiet(self) -> int:
        return self.ticker.groups_back_to_quiet

    @property
    def ticks_skipped(self) -> int:
        return self.ticker.ticks_skipped

    def catalog_changed(self) -> None:
        self.catalog_holder.changed()

    def is_live(self, node: int) -> bool:
        return self.liveness.is_live(node)

    def leader_of(self, group_id: GroupId) -> int:
        return self.routing.leader_of(group_id)

    def forward_target(self, group_id: GroupId, replicas: list[int]) -> int:
        return self.routing.forward_target(group_id, replicas)

    def quiesced_groups(self) -> int:
        return self.registry.quiesced()

    def group_status(self, group_id: GroupId) -> GroupStatus | None:
        return self.registry.status(group_id)

    def group_statuses(self) -> list[GroupStatus]:
        return self.registry.statuses()

    def partition_group(self, topic: str, partition: int) -> GroupId:
        return self.catalog_holder.partition_group(topic, partition)

    # ------------------------------------------------------------------ entry points (delegated)

    async def propose_metadata(self, command: Command) -> Any:
        return await self.metadata.propose(command)

    async def create_topic(self, name: str, partitions: int, replication_factor: int, config: dict[str, Any]) -> None:
        await self.metadata.create_topic(name, partitions, replication_factor, config)

    async def delete_topic(self, name: str) -> None:
        await self.metadata.delete_topic(name)

    async def create_partitions(self, name: str, count: int) -> None:
        await self.metadata.create_partitions(name, count)

    async def set_drained(self, node_id: NodeId, drained: bool) -> None:
        await self.metadata.set_drained(node_id, drained)

    async def set_decommissioning(self, node_id: NodeId, decommissioning: bool) -> None:
        await self.metadata.set_decommissioning(node_id, decommissioning)

    def decommission_progress(self, node_id: NodeId) -> Any:
        return self.api.decommission_progress(node_id)

    async def alter_topic_config(self, name: str, changes: dict[str, Any]) -> None:
        await self.metadata.alter_topic_config(name, changes)

    async def allocate_producer_id(self) -> tuple[int, int]:
        return await self.metadata.allocate_producer_id()

    async def sync_catalog(self) -> None:
        await self.metadata.sync_catalog()

    async def wait_for_topic(self, name: str, timeout_s: float = 10.0, present: bool = True) -> None:
        await self.metadata.wait_for_topic(name, timeout_s, present)

    async def add_node(self, node_id: NodeId, raft_addr: str, http_addr: str, rack: str | None) -> dict[str, str]:
        """Admit a joining node (multiraft/node/controller.py)."""
        return await self.controller.add_node(node_id, raft_addr, http_addr, rack)

    async def balance_leaders(self) -> dict[int, int]:
        """One balancing round on every node now; transfers started, by node."""
        return await leadership.balance_everywhere(self.balancer, self.routing, self.rpc)

    async def produce(self, topic: str, partition: int, batch: bytes, acks: Acks | str = Acks.QUORUM,
                      header: BatchHeader | None = None) -> ProduceResult:
        return await self.producer.produce(topic, partition, batch, acks, header)
