"""A raftlog node: the metadata group, the partition groups, and what ties them together.

One process, one `Node`. It owns:
- one `Transport` (one connection per peer, all groups), with RPC on top;
- one `StateDatabase` (rocksdict) and one `SegmentStore` per group;
- group 0, the metadata group, whose state machine is the `Catalog`;
- one group per partition replica this node hosts, with a `PartitionState`;
- one ticker for every group, coalesced heartbeats (one frame per peer per
  event-loop turn carrying every group's heartbeats), and topic placement when
  it leads group 0.

Elsewhere: the group replicas' lifecycle and the reconcile loop
(`multiraft/node/replicas.py`), node admission, registration and liveness
(`multiraft/node/controller.py`), peer liveness and the leaders table
(`multiraft/runtime/liveness.py`), reads and offset commits (`multiraft/node/partition_ops.py`),
consumer offsets retention (`multiraft/node/offsets_retention.py`).
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
from collections.abc import Sequence
from typing import Any

import structlog

from multiraft.errors import InvalidBatch, InvalidRequest, UnknownProducerId, UnknownTopic
from multiraft.metadata.catalog import Catalog, ProducerIdBlock
from multiraft.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfig,
    Command,
    CreateTopic,
    DeleteTopic,
    decode_command,
    encode_command,
)
from multiraft.metadata.placement import PlacementNode, place_replicas
from multiraft.node import (
    leadership,
    offsets_retention,
    open_files,
    partition_ops,
    reassignment,
    replicas,
)
from multiraft.node.acks import Acks
from multiraft.node.batch_checks import validate_off_loop
from multiraft.node.compaction import compaction_loop
from multiraft.node.config import NodeConfig
from multiraft.node.controller import Controller, host_port
from multiraft.node.machines import PartitionMachine
from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from multiraft.node.unsafe import ChaosHooks
from multiraft.runtime.flusher import Flusher
from multiraft.runtime.group import GroupRuntime, GroupStatus
from multiraft.runtime.histograms import NodeLatencies
from multiraft.runtime.liveness import PeerLiveness
from multiraft.runtime.loop_lag import watch_loop_lag
from multiraft.runtime.supervision import supervised, watch
from multiraft.state.partition import ApplyResult
from multiraft.state.producers import Accept, Duplicate, DuplicatePending
from multiraft.transport.frames import FrameTooLarge, FrameType
from multiraft.transport.remote_errors import error_from_body
from multiraft.transport.rpc import (
    FRAME_RPC_REQUEST,
    FRAME_RPC_RESPONSE,
    RPC_TIMEOUT_S,
    RemoteError,
    Rpc,
    RpcError,
    RpcOutcomeUnknown,
    answer,
    error_answer,
)
from multiraft.transport.transport import Transport
from raftlog.errors import (
    LeaderNotAvailable,
    NotLeader,
    OutcomeUnknown,
    ProposalDropped,
)
from raftlog.messages import EntryKind, Message, Role
from raftlog.storage import StorageError
from raftlog.types import GroupId, Index, NodeId
from raftlog.wire import (
    WireError,
    decode_heartbeats,
    decode_message,
    encode_heartbeats,
    encode_message,
    heartbeat_is_compactable,
)
from storage.batch import BatchHeader
from storage.errors import InvalidBatchError
from storage.files import Files, OsFiles, make_private_dirs
from storage.segments import SegmentStore
from storage.state_db import StateDatabase
from storage.write_behind import WriteBehindFiles

METADATA_GROUP = replicas.METADATA_GROUP
_PRODUCE = struct.Struct(">QB")  # group id, acks
_QUIESCE = struct.Struct(">QQQ")  # group id, term, log end index
# Quiet groups wake when a member's node has been silent this many election timeouts.
# Waking is dear (every group a node shares with the silent one starts ticking), so a
# stall of a busy peer must not pass for a death; a dead leader of an idle group is
# replaced a little later instead (Kafka waits 9 s for a broker's session to expire).
WAKE_SILENCE_PERIODS = 2


class Node:
    def __init__(self, config: NodeConfig, logger: Any = None, hooks: ChaosHooks | None = None) -> None:
        """`hooks`: the chaos runner's switches (multiraft/node/unsafe.py); None reads the environment."""
        self.config = config
        self.id = config.node_id
        self.logger = (logger or structlog.get_logger()).bind(node_id=self.id)
        self.hooks = hooks if hooks is not None else ChaosHooks.from_environment()
        self.catalog = Catalog()
        self.groups: dict[GroupId, GroupRuntime] = {}
        self.stores: dict[GroupId, SegmentStore] = {}
        self.partitions: dict[GroupId, PartitionMachine] = {}
        self.files: Files = OsFiles()
        self.rng = random.Random()
        self._heartbeats: dict[int, list[tuple[GroupId, Message]]] = {}
        self._flush_scheduled = False
        self._catalog_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Silence is counted in the ticks this node ran, not in wall time: after a stall of
        # our own, peers' frames still wait in our sockets and must not look like silence.
        self.ticks_run = 0
        self.liveness = PeerLiveness(
            config.election_timeout_ticks * config.tick_ms / 1000,
            clock=lambda: self.ticks_run * config.tick_ms / 1000,
        )
        self.ticks_skipped = 0
        self._silent: set[int] = set()
        self.peer_silences = 0  # peers that fell silent long enough to wake quiet groups
        self.groups_back_to_quiet = 0  # groups such a silence woke for nothing (sleep_again)
        self.latencies = NodeLatencies()  # fsync, replicate and apply histograms (/metrics)
        self.replay_floor: dict[GroupId, Index] = {}  # applied index of groups being reopened
        self.repairing: set[GroupId] = set()  # groups reopening because a read met corruption
        self.controller = Controller(self)
        self.registered = asyncio.Event()
        self.open_files_limit = 0  # the soft RLIMIT_NOFILE, raised at start (multiraft/node/open_files.py)
        self.db: StateDatabase | None = None
        self.transport: Transport | None = None
        self.rpc: Rpc | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        config = self.config
        self.open_files_limit = open_files.raise_soft_limit()
        make_private_dirs(config.data_dir / "groups")  # 0700, as every directory the node makes
        self._start_chaos_hooks()
        self.db = StateDatabase(str(config.data_dir / "state.db"))
        self.flusher = Flusher(self.db, self.logger)
        self.flusher.latency = self.latencies.fsync
        peers = {n: (a.host, a.port) for n, a in config.initial_cluster.items() if n != self.id}
        self.transport = Transport(
            self.id, config.raft_addr.host, config.raft_addr.port, peers,
            config.cluster_secret, self._on_frame, logger=self.logger, tls=config.peer_tls(),
        )
        self.transport.on_peer_refused = self._on_peer_refused
        self.rpc = Rpc(self.transport.send, self.logger)
        self.rpc.peer_alive = self.is_live
        self.rpc.register("metadata.propose", self._serve_metadata_propose)
        self.rpc.register("metadata.create_topic", self._serve_create_topic)
        self.rpc.register("metadata.add_learner", self.controller.serve_add_learner)
        self.rpc.register("node.heartbeat", self.controller.serve_heartbeat)
        self.rpc.register("partition.produce", self._serve_produce)
        self.rpc.register("leaders.balance", self._serve_balance)
        self.rpc.register("partition.read", lambda s, b: partition_ops.serve_read(self, s, b))
        self.rpc.register("partition.commit_offset", lambda s, b: partition_ops.serve_commit(self, s, b))
        self.rpc.register("partition.fetch_offset", lambda s, b: partition_ops.serve_fetch(self, s, b))
        self.rpc.register("partition.delete_group", lambda s, b: partition_ops.serve_delete_group(self, s, b))
        await self.transport.start()
        if config.join is not None:
            await self.controller.join(config.join)
        replicas.open_metadata_group(self)
        controller = self.controller
        for name, loop in (
            ("ticker", self._ticker),
            ("reconciler", lambda: replicas.reconcile_loop(self, self._catalog_event)),
            ("registrar", controller.register),
            ("node-heartbeats", controller.send_heartbeats),
            ("controller", controller.watch_liveness),
            ("leader-balancer", lambda: leadership.balance_loop(self)),
            ("replica-mover", lambda: reassignment.move_loop(self)),
            ("compaction", lambda: compaction_loop(self)),
            ("loop-lag", lambda: watch_loop_lag(self.latencies.loop_lag)),
            ("offsets-retention", lambda: offsets_retention.retention_loop(self)),
        ):
            self._tasks.append(asyncio.create_task(supervised(name, loop, self.logger), name=f"node-{self.id}-{name}"))
        self.logger.info("node_started", raft_addr=str(config.raft_addr), http_addr=str(config.http_addr),
                         open_files_limit=self.open_files_limit)

    def _start_chaos_hooks(self) -> None:
        """Apply and announce the chaos runner's switches (multiraft/node/unsafe.py), if any."""
        hooks = self.hooks
        if hooks.write_behind_files:
            self.files = WriteBehindFiles(str(self.config.data_dir / "groups"))
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
        for runtime in list(self.groups.values()):
            await runtime.stop()
        if self.rpc is not None:
            await self.rpc.stop()
        if self.transport is not None:
            await self.transport.stop()
        if self.db is not None:
            await self.flusher.close()  # fsyncs under way finish before their files close
        for group_id, store in self.stores.items():
            try:
                store.sync()
            except (OSError, StorageError) as error:  # what it could not sync, a crash loses too
                self.logger.error("group_sync_failed_at_stop", group_id=group_id, error=repr(error))
            store.close()
        self.groups.clear()
        self.stores.clear()
        if self.db is not None:
            self.db.close()
            self.db = None
        self.logger.info("node_stopped")

    # ------------------------------------------------------------------ groups

    def catalog_changed(self) -> None:
        self._catalog_event.set()

    def start_task(self, coroutine: Any, name: str = "background") -> None:
        """Run node work in the background; stopped with the node, its failure logged."""
        self._tasks.append(watch(asyncio.get_running_loop().create_task(coroutine), name, self.logger))

    def update_peers(self) -> None:
        assert self.transport is not None
        peers = {n: (a.host, a.port) for n, a in self.config.initial_cluster.items()}
        for node in self.catalog.nodes.values():
            peers[node.node_id] = host_port(node.raft_addr)
        peers.pop(self.id, None)
        self.transport.update_peers(peers)

    def on_role_change(self, group_id: GroupId, role: Role, term: int) -> None:
        machine = self.partitions.get(group_id)
        if machine is not None and role is not Role.LEADER:
            machine.state.drop_proposals()

    # ------------------------------------------------------------------ network

    def send(self, group_id: GroupId, message: Message) -> None:
        assert self.transport is not None
        if heartbeat_is_compactable(message):
            self._heartbeats.setdefault(message.target, []).append((group_id, message))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_heartbeats)
            return
        try:
            self.transport.send(message.target, FrameType.RAFT_MESSAGE, group_id, encode_message(message))
        except FrameTooLarge:
            # Raft retries; an append this big means message_bytes_max is set above the frame limit.
            self.logger.error("raft_message_too_large", group_id=group_id, type=message.type.name)

    def _flush_heartbeats(self) -> None:
        """One frame per peer for every group's heartbeats of this loop turn."""
        self._flush_scheduled = False
        beats, self._heartbeats = self._heartbeats, {}
        if self.transport is None:
            return
        for peer, batch in beats.items():
            self.transport.send(peer, FrameType.HEARTBEATS, 0, encode_heartbeats(batch))

    def _on_frame(self, source: int, frame_type: int, group_id: int, body: bytes) -> None:
        self.liveness.heard(source)
        try:
            if frame_type == FrameType.RAFT_MESSAGE:
                self._deliver(source, GroupId(group_id), decode_message(body))
            elif frame_type == FrameType.HEARTBEATS:
                for beat_group, message in decode_heartbeats(body):
                    self._deliver(source, beat_group, message)
            elif frame_type == FrameType.QUIESCE:
                group_id_, term, index = _QUIESCE.unpack(body)
                runtime = self.groups.get(GroupId(group_id_))
                if runtime is not None:
                    runtime.request_quiesce(source, term, index)
            elif frame_type == FrameType.PING and body:
                self.liveness.on_leaders(source, body)
            elif frame_type in (FRAME_RPC_REQUEST, FRAME_RPC_RESPONSE):
                assert self.rpc is not None
                self.rpc.on_frame(source, frame_type, body)
        except (WireError, struct.error) as error:
            self.logger.warning("bad_frame_dropped", source=source, error=str(error))

    def _on_peer_refused(self, peer: int) -> None:
        """Nothing listens at `peer`'s raft address: its process is gone (a kill -9, a
        crash; a live node never refuses). It counts as silent at once, and the groups
        it led fail over now instead of after an election timeout (GroupRuntime._leader_gone)."""
        self.liveness.gone(peer)  # calls waiting on it fail now (rpc), quiet groups wake
        led = [runtime for runtime in self.groups.values() if runtime.core.leader == peer]
        if led:
            self.logger.info("peer_refused_leader_gone", peer=peer, groups=len(led))
        for runtime in led:
            runtime.leader_gone(peer)

    def _deliver(self, source: int, group_id: GroupId, message: Message) -> None:
        if message.source != source or message.target != self.id:
            self.logger.warning("misaddressed_message_dropped", source=source, claimed=message.source)
            return
        runtime = self.groups.get(group_id)
        if runtime is not None:
            runtime.deliver(message)

    async def _ticker(self) -> None:
        """One timer for every group; also node pings and waking quiet groups of dead leaders."""
        config = self.config
        interval = config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        count = 0
        while True:
            next_tick += interval
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            if loop.time() - next_tick > interval:
                # Overloaded: drop the missed ticks rather than fire them in a burst, which
                # would time out elections whose answers are merely queued (etcd does too).
                self.ticks_skipped += int((loop.time() - next_tick) / interval)
                next_tick = loop.time()
            count += 1
            self.ticks_run = count
            if count % config.heartbeat_interval_ticks == 0:
                self._ping_peers()
            silent = self.liveness.silent(self._peer_ids(), WAKE_SILENCE_PERIODS)
            if silent != self._silent:
                self._on_silence_change(silent)
            for runtime in list(self.groups.values()):
                if runtime.quiesced:
                    # Quiet groups cost nothing per tick unless some peer node fell silent.
                    if not silent or not self._depends_on(runtime, silent):
                        continue
                    runtime.wake_for_silence()  # a member's node went silent: elect, or update the ISR
                runtime.tick()

    def _on_silence_change(self, silent: set[int]) -> None:
        """Log which peers fell silent or came back; a peer back before its followers here
        campaigned was slow, not dead: they go quiet again rather than disturb its leaders."""
        back = self._silent - silent
        slept = sum(1 for r in self.groups.values() if r.sleep_again()) if back else 0
        self.logger.info("peers_silent", silent=sorted(silent), heard_again=sorted(back), back_to_quiet=slept)
        self.peer_silences += len(silent - self._silent)
        self.groups_back_to_quiet += slept
        self._silent = silent

    def _depends_on(self, runtime: GroupRuntime, silent: set[int]) -> bool:
        core = runtime.core
        if core.role is not Role.LEADER:
            return core.leader == 0 or core.leader in silent
        return not silent.isdisjoint(core.membership.members)

    def is_live(self, node: int) -> bool:
        return self.liveness.is_live(node)

    async def balance_leaders(self) -> dict[int, int]:
        """One balancing round on every node now; transfers started, by node."""
        started = {self.id: leadership.balance_now(self)}
        assert self.rpc is not None
        for peer in self._peer_ids():
            try:
                answer = await self.rpc.call(peer, "leaders.balance", b"", RPC_TIMEOUT_S)
                started[peer] = int(answer)
            except (RpcError, RemoteError, ValueError):
                started[peer] = -1  # not reached: reported, not fatal
        return started

    async def _serve_balance(self, source: int, body: bytes) -> tuple[int, bytes]:
        return await answer(_balance_here(self), lambda count: str(count).encode())

    def _ping_peers(self) -> None:
        assert self.transport is not None
        body = self.liveness.next_ping(
            lambda: [(g, r.core.term) for g, r in self.groups.items() if r.core.role is Role.LEADER]
        )
        for peer in self._peer_ids():
            self.transport.send(peer, FrameType.PING, 0, body)

    def group_status(self, group_id: GroupId) -> GroupStatus | None:
        """The group's status as the edge sees it (None: no replica here)."""
        runtime = self.groups.get(group_id)
        return runtime.status() if runtime is not None else None

    def group_statuses(self) -> list[GroupStatus]:
        """Every hosted group's status, in group order."""
        return [runtime.status() for _, runtime in sorted(self.groups.items())]

    def leader_of(self, group_id: GroupId) -> int:
        """This node's best knowledge of a group's leader (0: unknown): its own replica's
        view when it hosts one, else what the leader's pings said."""
        runtime = self.groups.get(group_id)
        if runtime is not None and runtime.core.leader:
            return runtime.core.leader
        return self.liveness.leader_heard(group_id)

    def forward_target(self, group_id: GroupId, replicas: Sequence[int]) -> int:
        """Where to send a leader's work for a group: its known leader; with no replica
        here and no news of one, the first replica (which knows, or forwards). 0: none."""
        leader = self.leader_of(group_id)
        if leader == 0 and group_id not in self.groups:
            return replicas[0]
        return leader

    def _peer_ids(self) -> list[int]:
        peers = set(self.config.initial_cluster) | set(self.catalog.nodes)
        peers.discard(self.id)
        return sorted(peers)

    def on_quiesce(self, group_id: GroupId, term: int, index: int) -> None:
        assert self.transport is not None
        core = self.groups[group_id].core
        body = _QUIESCE.pack(group_id, term, index)
        for member in sorted(core.membership.members - {self.id}):
            self.transport.send(member, FrameType.QUIESCE, group_id, body)

    def quiesced_groups(self) -> int:
        return sum(1 for runtime in self.groups.values() if runtime.quiesced)

    # ------------------------------------------------------------------ metadata

    async def propose_metadata(self, command: Command) -> Any:
        """Apply `command` through the metadata leader (forwarded if that is another node)."""
        runtime = self.groups[METADATA_GROUP]
        if runtime.core.role is Role.LEADER:
            self.catalog.validate(command)
            (result,) = await runtime.propose([encode_command(command)], EntryKind.META)
            if result.error is not None:
                raise result.error
            return _catalog_value(result.value)
        body = await self.call_leader(runtime, "metadata.propose", encode_command(command))
        return json.loads(body)

    async def create_topic(self, name: str, partitions: int, replication_factor: int, config: dict[str, Any]) -> None:
        """Create a topic: the controller places its replicas, the catalog records them."""
        runtime = self.groups[METADATA_GROUP]
        request = {"name": name, "partitions": partitions, "replication_factor": replication_factor, "config": config}
        if runtime.core.role is Role.LEADER:
            await self._create_topic_as_controller(request)
        else:
            await self.call_leader(runtime, "metadata.create_topic", json.dumps(request).encode())

    async def _create_topic_as_controller(self, request: dict[str, Any]) -> None:
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self.catalog.live_nodes()]
        assignments = place_replicas(
            nodes, request["partitions"], request["replication_factor"], start=self.catalog.next_group_id
        )
        per_node: dict[int, int] = {}
        for replicas_of_partition in assignments:
            for host in replicas_of_partition:
                per_node[host] = per_node.get(host, 0) + 1
        open_files.check_room(per_node, self.open_files_limit, open_files.open_now())
        command = CreateTopic(
            name=request["name"],
            partitions=request["partitions"],
            replication_factor=request["replication_factor"],
            config=request["config"],
            assignments=tuple(tuple(r) for r in assignments),
        )
        await self.propose_metadata(command)

    async def delete_topic(self, name: str) -> None:
        self.catalog.topic(name)  # a clear UNKNOWN_TOPIC before going to the controller
        await self.propose_metadata(DeleteTopic(name=name))

    async def alter_topic_config(self, name: str, changes: dict[str, Any]) -> None:
        """Set (or, with None, remove) topic settings; replicas pick them up as they apply
        the catalog (retention and segment size at once, min_insync_replicas per produce)."""
        self.catalog.topic(name)  # a clear UNKNOWN_TOPIC before going to the controller
        await self.propose_metadata(AlterTopicConfig(name=name, changes=changes))

    async def allocate_producer_id(self) -> tuple[int, int]:
        """A fresh producer id (epoch 0) for an idempotent producer."""
        block = await self.propose_metadata(AllocateProducerIds(count=1))
        return int(block["first"]), 0

    async def sync_catalog(self) -> None:
        """Return once this node's catalog holds every metadata change completed anywhere
        before the call: a ReadIndex on the metadata group (a follower or learner asks
        the metadata leader for its commit index, the leader confirms it still leads
        with a round of heartbeats), then a wait until this node applied that far. What
        makes catalog reads linearizable where the API offers them."""
        await self.groups[METADATA_GROUP].read_index()

    async def wait_for_topic(self, name: str, timeout_s: float = 10.0, present: bool = True) -> None:
        """Wait until this node's catalog holds `name` (after a create elsewhere), or no
        longer holds it with `present=False` (after a delete)."""
        async with asyncio.timeout(timeout_s):
            while (name in self.catalog.topics) != present:
                await asyncio.sleep(0.02)

    async def call_leader(self, runtime: GroupRuntime, method: str, body: bytes) -> bytes:
        leader = runtime.core.leader
        if leader == 0 or leader == self.id:
            raise NotLeader(leader, "no leader known yet for this group")
        assert self.rpc is not None
        try:
            return await self.rpc.call(leader, method, body, RPC_TIMEOUT_S)
        except RemoteError as error:
            raise error_from_body(error.body) from None
        except RpcOutcomeUnknown as error:
            raise OutcomeUnknown(f"forwarded to node {leader}, no answer: {error}") from None
        except RpcError as error:
            raise NotLeader(leader, f"forwarding to node {leader} failed: {error}") from None

    async def _serve_metadata_propose(self, source: int, body: bytes) -> tuple[int, bytes]:
        return await answer(self.propose_metadata(decode_command(body)), lambda value: json.dumps(value).encode())

    async def _serve_create_topic(self, source: int, body: bytes) -> tuple[int, bytes]:
        request = json.loads(body)
        if self.groups[METADATA_GROUP].core.role is not Role.LEADER:
            return error_answer(NotLeader(self.groups[METADATA_GROUP].core.leader))
        return await answer(self._create_topic_as_controller(request), lambda _: b"{}")

    async def add_node(self, node_id: NodeId, raft_addr: str, http_addr: str, rack: str | None) -> dict[str, str]:
        """Admit a joining node (multiraft/node/controller.py)."""
        return await self.controller.add_node(node_id, raft_addr, http_addr, rack)

    # ------------------------------------------------------------------ produce / consume

    def partition_group(self, topic: str, partition: int) -> GroupId:
        info = self.catalog.topic(topic)
        if not 0 <= partition < len(info.partitions):
            raise UnknownTopic(f"topic {topic!r} has no partition {partition}")
        return info.partitions[partition].group_id

    async def produce(self, topic: str, partition: int, batch: bytes, acks: Acks | str = Acks.QUORUM,
                      header: BatchHeader | None = None) -> ProduceResult:
        """Append one record batch to a partition; forwarded to its leader if needed.

        `acks`: "none" (answer at once), "leader" (after the leader's fsync),
        "quorum" (after commit, the default), "all" (after every in-sync replica).
        `header`: what `validate_batch` returned, when the caller already validated
        `batch` (the HTTP layer does, to answer 400 before anything else): not twice.
        """
        acks = Acks.parse(acks)
        group_id = self.partition_group(topic, partition)
        runtime = self.groups.get(group_id)
        if runtime is not None and runtime.core.role is Role.LEADER:
            return await self._produce_local(group_id, batch, acks, header)
        leader = self.forward_target(group_id, self.catalog.topic(topic).partitions[partition].replicas)
        if leader == 0:
            raise LeaderNotAvailable("the partition has no leader yet")
        assert self.rpc is not None
        try:
            body = _PRODUCE.pack(group_id, acks.code) + batch
            answer = await self.rpc.call(leader, "partition.produce", body, RPC_TIMEOUT_S)
        except RemoteError as error:
            raise error_from_body(error.body) from None
        except RpcOutcomeUnknown as error:
            raise OutcomeUnknown(f"forwarded to node {leader}, no answer: {error}") from None
        except RpcError as error:
            raise NotLeader(leader, f"forwarding to node {leader} failed: {error}") from None
        return ProduceResult.from_json(answer)

    async def _produce_local(self, group_id: GroupId, batch: bytes, acks: Acks,
                             header: BatchHeader | None = None) -> ProduceResult:
        if header is None:  # first: nothing below may be separated from the proposal by an await
            try:
                header = await validate_off_loop(batch)
            except InvalidBatchError as error:
                raise InvalidBatch(str(error)) from None
        if header.producer_id >= self.catalog.next_producer_id:  # before the checks below: it may await
            await self._require_allocated(header.producer_id)
        runtime = self.groups.get(group_id)
        if runtime is None or runtime.core.role is not Role.LEADER:
            raise NotLeader(runtime.core.leader if runtime else 0, "this node no longer leads the partition")
        machine = self.partitions[group_id]
        core = runtime.core
        if acks in (Acks.QUORUM, Acks.ALL):
            topic = self.catalog.topic(machine.state.topic)
            core.check_min_insync(int(topic.config.get("min_insync_replicas", 1)))
        if core.applied_index < core.commit_index or core.log.term_or_none(core.commit_index) != core.term:
            # Until this leader applied its own term's NOOP, its producer table may lag.
            raise ProposalDropped("the new leader is not ready yet; retry")
        decision = machine.state.check_produce(header)
        if isinstance(decision, Duplicate):
            return ProduceResult(base_offset=decision.base_offset, count=decision.record_count, duplicate=True)
        if isinstance(decision, DuplicatePending):
            raise ProposalDropped("this batch is still being replicated; retry for its offsets")
        assert isinstance(decision, Accept)
        machine.state.record_proposal(header)
        if acks is Acks.NONE:
            task = asyncio.create_task(runtime.propose([batch]))
            task.add_done_callback(_consume_task)
            return ProduceResult(base_offset=NO_OFFSET, count=header.record_count, duplicate=False)
        (result,) = await runtime.propose([batch], acks=acks)
        if acks is Acks.LEADER:  # durable here, not committed: the offset the leader's log gives it (Kafka's acks=1)
            base_offset = self.stores[group_id].offset_after(Index(result - 1))
            return ProduceResult(base_offset=int(base_offset), count=header.record_count, duplicate=False)
        return _applied(result)

    async def _require_allocated(self, producer_id: int) -> None:
        """Refuse a producer id the cluster never handed out (UNKNOWN_PRODUCER_ID), so a
        client cannot fill the partition's producer table with invented ids. This node's
        catalog may trail the allocation a client just got elsewhere, so it first catches
        up with every allocation completed before (a ReadIndex on the metadata group);
        only ids above the catalog's next id pay that."""
        await self.sync_catalog()
        if producer_id >= self.catalog.next_producer_id:
            raise UnknownProducerId(producer_id, self.catalog.next_producer_id)

    async def _serve_produce(self, source: int, body: bytes) -> tuple[int, bytes]:
        group_id, acks_code = _PRODUCE.unpack_from(body)
        try:
            acks = Acks.from_code(acks_code)
        except InvalidRequest as error:
            return error_answer(error)
        runtime = self.groups.get(GroupId(group_id))
        if runtime is None or runtime.core.role is not Role.LEADER:
            leader = runtime.core.leader if runtime else 0
            return error_answer(NotLeader(leader))
        work = self._produce_local(GroupId(group_id), body[_PRODUCE.size :], acks)
        return await answer(work, ProduceResult.to_json)


async def _balance_here(node: Node) -> int:
    return leadership.balance_now(node)


def _consume_task(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # acks=none: nobody waits; the outcome is dropped on purpose


def _catalog_value(value: Any) -> dict[str, Any]:
    """A catalog result as JSON-able data (it crosses nodes when forwarded)."""
    if isinstance(value, ProducerIdBlock):
        return {"first": value.first, "count": value.count}
    return {}


def _applied(result: ApplyResult) -> ProduceResult:
    """A committed batch's apply result as the producer's answer; a batch the state
    machine refused (found out of order or fenced only at apply) raises its error here,
    inside the produce, so a forwarded produce answers it as a typed error too."""
    if result.error is not None:
        raise result.error
    assert result.base_offset is not None, "an applied DATA entry has offsets"
    return ProduceResult(base_offset=int(result.base_offset), count=result.count, duplicate=result.duplicate)
