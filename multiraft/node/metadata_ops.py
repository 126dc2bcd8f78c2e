"""Changes to the catalog, from any node: proposed on the metadata leader, forwarded there.

Topic admin (create, delete, alter), producer ids, linearizable catalog reads
(`sync_catalog`), and the RPC handlers a metadata leader serves for the others.
Creating a topic is the controller's (the metadata leader's) act: it places the
replicas and checks that every host has file descriptors left for them.

A create during start-up (this node started moments ago, or a node of the initial
cluster has not registered yet) first waits, briefly, for a metadata leader and
for as many live nodes as its replication factor needs, instead of refusing at
once ("replication factor 3 exceeds the 0 live nodes" a second after start).
Past the wait it goes on, and is refused, as any other.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidPartitions
from multiraft.metadata.catalog import NodeInfo, ProducerIdBlock, TopicInfo
from multiraft.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfig,
    Command,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    SetNodeDecommissioning,
    SetNodeDrained,
    decode_command,
    encode_command,
)
from multiraft.metadata.features import require_command_level
from multiraft.metadata.mirror_growth import check_growable
from multiraft.metadata.placement import PlacementNode, place_replicas
from multiraft.node import open_files
from multiraft.node.registry import METADATA_GROUP
from multiraft.node.routing import call_peer
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer, error_answer
from raftlog.errors import (
    ClientError,
    LeadershipTransferInProgress,
    NotLeader,
    OutcomeUnknown,
    ProposalDropped,
)
from raftlog.messages import EntryKind, Role
from raftlog.types import NodeId

# How long a create during start-up waits for the nodes it needs: a few seconds cover a
# metadata election (0.5-1 s) and every node's registration, inside the HTTP answer's
# bound (15 s) with room for the create itself.
CREATE_START_UP_WAIT_S = 5.0
# A node is starting up for this long after it started (a whole cluster started together
# registers within seconds; later, too few live nodes is the cluster's state, refused at once).
START_UP_S = 30.0
START_UP_POLL_S = 0.05
# A drain's mark is proposed again, this much later each time (times the attempt, a
# second at most), while its outcome is unknown (see `set_drained`) and for this long in
# all: within the HTTP answer's bound (15 s), past a metadata election on a loaded box
# (four attempts in 3 s were not always enough under the fuzz pass beside a chaos run).
SET_DRAINED_WAIT_S = 8.0
SET_DRAINED_RETRY_S = 0.5
SET_DRAINED_PAUSE_MAX_S = 1.0
READ_ATTEMPT_S = 2.0  # one ReadIndex round trip, many times over
SYNC_CATALOG_WAIT_S = 12.0

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime


class MetadataOps:
    def __init__(self, node_id: NodeId, registry: GroupRegistry, catalog: CatalogHolder, rpc: Rpc,
                 open_files_limit: Callable[[], int], initial_cluster: Collection[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.id = node_id
        self._initial_cluster = frozenset(initial_cluster)
        self._clock = clock
        self._started = clock()
        self._registry = registry
        self._catalog = catalog
        self._rpc = rpc
        self._open_files_limit = open_files_limit
        # Nodes placement leaves out besides the catalog's (below the feature level: FeatureGate.below_level).
        self.unplaceable: Callable[[], frozenset[NodeId]] = frozenset
        rpc.register("metadata.propose", self._serve_propose)
        rpc.register("metadata.create_topic", self._serve_create_topic)
        rpc.register("metadata.create_partitions", self._serve_create_partitions)

    @property
    def _runtime(self) -> GroupRuntime:
        return self._registry.groups[METADATA_GROUP]

    async def propose(self, command: Command) -> Any:
        """Apply `command` through the metadata leader (forwarded if that is another node)."""
        runtime = self._runtime
        if runtime.core.role is Role.LEADER:
            # The feature gate (multiraft/metadata/features.py): here, at propose time, never on apply.
            require_command_level(self._catalog.catalog, command)
            self._catalog.catalog.validate(command)
            (result,) = await runtime.propose([encode_command(command)], EntryKind.META)
            if result.error is not None:
                raise result.error
            return _catalog_value(result.value)
        body = await self.call_leader("metadata.propose", encode_command(command))
        return json.loads(body)

    async def call_leader(self, method: str, body: bytes) -> bytes:
        """Call `method` on the metadata leader (NotLeader while none is known)."""
        leader = self._runtime.core.leader
        if leader == 0 or leader == self.id:
            raise NotLeader(leader, "no leader known yet for this group")
        return await call_peer(self._rpc, leader, method, body, RPC_TIMEOUT_S, write=True)

    async def create_topic(self, name: str, partitions: int, replication_factor: int, config: dict[str, Any]) -> None:
        """Create a topic: the controller places its replicas, the catalog records them."""
        request = {"name": name, "partitions": partitions, "replication_factor": replication_factor, "config": config}
        if self._starting_up():
            await self._wait_for_nodes(replication_factor, CREATE_START_UP_WAIT_S)
        if self._runtime.core.role is Role.LEADER:
            await self._create_topic_as_controller(request)
        else:
            await self.call_leader("metadata.create_topic", json.dumps(request).encode())

    def _starting_up(self) -> bool:
        if self._clock() - self._started < START_UP_S:
            return True
        return not self._initial_cluster <= set(self._catalog.catalog.nodes)

    def placeable_nodes(self) -> list[NodeInfo]:
        """The nodes new replicas may go to: the catalog's (live, not decommissioning) but
        those whose heartbeats said they support less than the finalized feature level."""
        left_out = self.unplaceable()
        return [n for n in self._catalog.catalog.placeable_nodes() if n.node_id not in left_out]

    def _enough_nodes(self, replication_factor: int) -> bool:
        return self._runtime.core.leader != 0 and len(self.placeable_nodes()) >= replication_factor

    async def _wait_for_nodes(self, replication_factor: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a metadata leader and `replication_factor` live nodes
        in this node's catalog; whether they came."""
        deadline = self._clock() + timeout_s
        while not self._enough_nodes(replication_factor):
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(START_UP_POLL_S)
        return True

    async def _create_topic_as_controller(self, request: dict[str, Any]) -> None:
        catalog = self._catalog.catalog
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self.placeable_nodes()]
        assignments = place_replicas(
            nodes, request["partitions"], request["replication_factor"], start=catalog.next_group_id,
            drained=catalog.drained_nodes(),
        )
        self.check_files(assignments)
        command = CreateTopic(
            name=request["name"],
            partitions=request["partitions"],
            replication_factor=request["replication_factor"],
            config=request["config"],
            assignments=tuple(tuple(r) for r in assignments),
        )
        await self.propose(command)

    async def create_partitions(self, name: str, count: int) -> None:
        """Grow a topic to `count` partitions (increase only, as Kafka's CreatePartitions):
        the controller places the new ones as it would a new topic's, counting the topic's
        current replicas, and every host opens them through its reconciler; each new
        partition's first replica campaigns at once, as at creation. Refused for a mirror
        topic not promoted (MIRROR_PARTITIONS_FIXED)."""
        # A clear UNKNOWN_TOPIC or MIRROR_PARTITIONS_FIXED before going to the controller.
        check_growable(self._catalog.catalog.topic(name))
        request = {"name": name, "count": count}
        if self._runtime.core.role is Role.LEADER:
            await self._create_partitions_as_controller(request)
        else:
            await self.call_leader("metadata.create_partitions", json.dumps(request).encode())

    async def _create_partitions_as_controller(self, request: dict[str, Any]) -> None:
        catalog = self._catalog.catalog
        topic = catalog.topic(request["name"])
        check_growable(topic)
        current = len(topic.partitions)
        if not isinstance(request["count"], int) or request["count"] <= current:
            raise InvalidPartitions(f"topic {topic.name!r} has {current} partitions; partitions can only be "
                                    f"added, so the new count must be above {current}, got {request['count']}")
        nodes = [PlacementNode(n.node_id, n.rack or None) for n in self.placeable_nodes()]
        assignments = place_replicas(nodes, request["count"] - current, topic.replication_factor,
                                     start=catalog.next_group_id, existing=[p.replicas for p in topic.partitions],
                                     drained=catalog.drained_nodes())
        self.check_files(assignments)
        await self.propose(CreatePartitions(name=topic.name, count=request["count"],
                                            assignments=tuple(tuple(r) for r in assignments)))

    def check_files(self, assignments: list[list[NodeId]]) -> None:
        """Refuse new replicas a host has no file descriptors left for (InvalidPartitions,
        open_files.py): topics and partitions added here, mirrors made or grown by discovery."""
        open_files.check_new_replicas(assignments, self._open_files_limit())

    async def set_drained(self, node_id: NodeId, drained: bool) -> None:
        """Mark a node drained (its leaderships leave it, multiraft/node/draining.py) or clear it.

        Idempotent, so proposed again when its outcome is unknown or no leader is known:
        draining the metadata leader's own node starts moving the metadata leadership
        as the mark applies, and the proposal's answer can be lost in that handover
        (the fuzz pass met a 504 OUTCOME_UNKNOWN there)."""
        await self._propose_mark(SetNodeDrained(node_id=node_id, drained=drained))

    async def set_decommissioning(self, node_id: NodeId, decommissioning: bool) -> None:
        """Start or cancel a node's decommission (multiraft/node/decommission.py); proposed
        again like a drain's mark, for the same reason: the node leaving may lead the
        metadata group."""
        await self._propose_mark(SetNodeDecommissioning(node_id=node_id, decommissioning=decommissioning))

    async def _propose_mark(self, command: SetNodeDrained | SetNodeDecommissioning) -> None:
        """Propose an idempotent node mark, again when its outcome is unknown or no leader
        is known, for SET_DRAINED_WAIT_S at most."""
        deadline = self._clock() + SET_DRAINED_WAIT_S
        for attempt in itertools.count(1):
            try:
                await self.propose(command)
                return
            except ClientError as error:
                pause = min(SET_DRAINED_RETRY_S * attempt, SET_DRAINED_PAUSE_MAX_S)
                if not _worth_again(error) or self._clock() + pause >= deadline:
                    raise
                await asyncio.sleep(pause)  # a new leader is elected meanwhile

    async def delete_topic(self, name: str) -> None:
        self._catalog.catalog.topic(name)  # a clear UNKNOWN_TOPIC before going to the controller
        await self.propose(DeleteTopic(name=name))

    async def alter_topic_config(self, name: str, changes: dict[str, Any]) -> None:
        """Set (or, with None, remove) topic settings; replicas pick them up as they apply
        the catalog (retention and segment size at once, min_insync_replicas per produce)."""
        self._catalog.catalog.topic(name)  # a clear UNKNOWN_TOPIC before going to the controller
        await self.propose(AlterTopicConfig(name=name, changes=changes))

    async def allocate_producer_id(self) -> tuple[int, int]:
        """A fresh producer id (epoch 0) for an idempotent producer."""
        block = await self.propose(AllocateProducerIds(count=1))
        return int(block["first"]), 0

    async def sync_catalog(self) -> None:
        """Return once this node's catalog holds every metadata change completed anywhere
        before the call: a ReadIndex on the metadata group (a follower or learner asks
        the metadata leader for its commit index, the leader confirms it still leads
        with a round of heartbeats), then a wait until this node applied that far. What
        makes catalog reads linearizable where the API offers them.

        A read forwarded to the leader is lost when that leader steps down or hands its
        leadership over before confirming it (the core drops it with its read queue), and
        on a lost message: each attempt is bounded by READ_ATTEMPT_S and the read is asked
        again, of the leader known then (a drain of the node leading the metadata group
        moves that leadership while the drain's own propagation waits on this; the fuzz
        pass met it as a 504 after 15 s). At most SYNC_CATALOG_WAIT_S in all (under the HTTP
        answer's 15 s), then the last refusal (NOT_LEADER: retriable) is the answer."""
        deadline = time.monotonic() + SYNC_CATALOG_WAIT_S
        for attempt in itertools.count(1):
            try:
                async with asyncio.timeout(min(READ_ATTEMPT_S, max(0.0, deadline - time.monotonic()))):
                    await self._runtime.read_index()
                return
            except (TimeoutError, NotLeader, ProposalDropped) as error:
                pause = min(SET_DRAINED_RETRY_S * attempt, SET_DRAINED_PAUSE_MAX_S)
                if time.monotonic() + pause >= deadline:
                    if isinstance(error, ClientError):
                        raise
                    raise NotLeader(NodeId(0), f"no metadata leader confirmed a read within {SYNC_CATALOG_WAIT_S:.0f} s") \
                        from None
                await asyncio.sleep(pause)

    async def wait_for_topic(self, name: str, timeout_s: float = 10.0, present: bool = True) -> None:
        """Wait until this node's catalog holds `name` (after a create elsewhere), or no
        longer holds it with `present=False` (after a delete)."""
        async with asyncio.timeout(timeout_s):
            while (name in self._catalog.catalog.topics) != present:
                await asyncio.sleep(0.02)

    async def _serve_propose(self, source: int, body: bytes) -> tuple[int, bytes]:
        return await answer(self.propose(decode_command(body)), lambda value: json.dumps(value).encode())

    async def _serve_create_partitions(self, source: int, body: bytes) -> tuple[int, bytes]:
        return await self._serve_as_controller(body, self._create_partitions_as_controller)

    async def _serve_create_topic(self, source: int, body: bytes) -> tuple[int, bytes]:
        return await self._serve_as_controller(body, self._create_topic_as_controller)

    async def _serve_as_controller(self, body: bytes,
                                   work: Callable[[dict[str, Any]], Awaitable[Any]]) -> tuple[int, bytes]:
        """A placement forwarded here: done only while this node leads the metadata group."""
        core = self._runtime.core
        if core.role is not Role.LEADER:
            return error_answer(NotLeader(core.leader))
        return await answer(work(json.loads(body)), lambda _: b"{}")


def _catalog_value(value: Any) -> dict[str, Any]:
    """A catalog result as JSON-able data (it crosses nodes when forwarded): a topic changed
    names it (a mirror resync that replaced its incarnation does; one that changed nothing
    answers `{}`, as does a metadata leader of an earlier version)."""
    if isinstance(value, ProducerIdBlock):
        return {"first": value.first, "count": value.count}
    if isinstance(value, TopicInfo):
        return {"topic": value.name}
    return {}


def _worth_again(error: ClientError) -> bool:
    """A node mark's proposal that may be made again: its outcome unknown, no leader known,
    or dropped while the metadata leader hands its leadership over (a drain of the node
    leading it moves that first; the fuzz pass met the 503). Forwarded from the leader,
    the transfer comes back by its code, not its class."""
    return (isinstance(error, OutcomeUnknown | NotLeader | LeadershipTransferInProgress)
            or getattr(error, "code", None) == LeadershipTransferInProgress.code)
