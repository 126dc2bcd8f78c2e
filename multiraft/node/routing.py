"""Where a group's work goes from this node, and how a forwarded call fails.

`Routing` answers from this node's view: its own replicas (the registry), what the
leaders' pings said (`PeerLiveness`), and the catalog. `call_peer` sends one RPC
and turns every way it can fail into the typed client error the caller answers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, NamedTuple

from multiraft.transport.remote_errors import error_from_body
from multiraft.transport.rpc import RemoteError, Rpc, RpcError, RpcOutcomeUnknown
from raftlog.errors import NotLeader, OutcomeUnknown
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.metadata.catalog import PartitionInfo
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime
    from multiraft.runtime.liveness import PeerLiveness


class LedPartition(NamedTuple):
    group_id: GroupId
    runtime: GroupRuntime
    topic: str
    info: PartitionInfo


class Routing:
    def __init__(self, node_id: NodeId, initial_cluster: Collection[int], registry: GroupRegistry,
                 catalog: CatalogHolder, liveness: PeerLiveness) -> None:
        self.id = node_id
        self._initial_cluster = frozenset(initial_cluster)
        self.registry = registry
        self.catalog = catalog
        self.liveness = liveness
        self._led_cache: tuple[tuple[int, int, int], list[LedPartition]] | None = None

    def is_live(self, node: int) -> bool:
        return self.liveness.is_live(node)

    def peer_ids(self) -> list[int]:
        peers = set(self._initial_cluster) | set(self.catalog.catalog.nodes)
        peers.discard(self.id)
        return sorted(peers)

    def leadership_version(self) -> tuple[int, int]:
        """Changes whenever a leadership this node knows of may have changed: a role of
        its own replicas (the registry's `led_version`) or a peer's list of the groups
        it leads (the pings). What the balancer's idle check keys on."""
        return self.registry.led_version, self.liveness.leaders_version

    def leader_of(self, group_id: GroupId) -> int:
        """This node's best knowledge of a group's leader (0: unknown): its own replica's
        view when it hosts one, else what the leader's pings said."""
        leader = self.registry.local_leader(group_id)
        return leader if leader else self.liveness.leader_heard(group_id)

    def forward_target(self, group_id: GroupId, replicas: Sequence[int]) -> int:
        """Where to send a leader's work for a group: its known leader; with no replica
        here and no news of one, the first replica (which knows, or forwards). 0: none."""
        leader = self.leader_of(group_id)
        if leader == 0 and group_id not in self.registry.groups:
            return replicas[0]
        return leader

    def led_partitions(self) -> list[LedPartition]:
        """The partition groups this node leads, with their catalog entries (a group of a
        topic being deleted is left out): what leadership balancing and replica moves act on.
        Kept until the catalog or a role here changes (the registry's `led_version`): built
        from the led groups only, not every hosted one. Callers must not change the list."""
        catalog = self.catalog.catalog
        key = (id(catalog), int(catalog.applied_index), self.registry.led_version)
        if self._led_cache is not None and self._led_cache[0] == key:
            return self._led_cache[1]
        led = []
        partitions = self.registry.partitions
        for group_id in sorted(self.registry.led):
            machine = partitions.get(group_id)
            runtime = self.registry.leading(group_id)
            if machine is None or runtime is None:
                continue
            topic = catalog.topics.get(machine.state.topic)
            if topic is None or machine.state.partition >= len(topic.partitions):
                continue
            led.append(LedPartition(group_id, runtime, topic.name, topic.partitions[machine.state.partition]))
        self._led_cache = (key, led)
        return led

async def call_peer(rpc: Rpc, peer: int, method: str, body: bytes, timeout_s: float, *, write: bool) -> bytes:
    """Forward to `peer`. A write whose answer never came may have happened: OUTCOME_UNKNOWN.
    A read may simply be retried: NOT_LEADER (retriable) either way."""
    try:
        return await rpc.call(peer, method, body, timeout_s)
    except RemoteError as error:
        raise error_from_body(error.body) from None
    except RpcOutcomeUnknown as error:
        if write:
            raise OutcomeUnknown(f"forwarded to node {peer}, no answer: {error}") from None
        raise NotLeader(peer, f"forwarding to node {peer} failed: {error}") from None
    except RpcError as error:
        raise NotLeader(peer, f"forwarding to node {peer} failed: {error}") from None
