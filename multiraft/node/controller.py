"""Cluster membership duties: admitting and registering nodes, and node liveness.

Every node registers itself (addresses, rack) in the catalog at start and, when
it was started with `--join`, first asks an existing node to admit it (register
it and make it a learner of the metadata group). Every node sends a heartbeat
to the metadata leader each interval; the metadata leader (the controller)
marks nodes dead or alive from them and logs the transitions, not the beats.

A node silent for `replica_move_after_ms` loses its replicas: the controller
names a live node in each one's place (`ReplaceReplica`, placement's
`replacement_for`), and each partition's leader moves the copy
(multiraft/node/reassignment.py). A decommissioning node's replicas move the same
way, a bounded number at a time, and it then leaves the metadata group
(multiraft/node/decommission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.metadata.commands import (
    NodeStatus,
    RegisterNode,
    ReplaceReplica,
    SetNodeStatus,
    encode_command,
)
from multiraft.metadata.placement import PlacementNode, replacement_for
from multiraft.net.tls import node_http_client_context
from multiraft.node import admission, decommission, metadata_voters
from multiraft.node.registry import METADATA_GROUP
from multiraft.transport.rpc import RPC_TIMEOUT_S, STATUS_OK, Rpc, RpcError, answer, error_answer
from raftlog.errors import ClientError, MembershipChangeInProgress, NotLeader
from raftlog.messages import ConfChange, ConfChangeOp, Role
from raftlog.types import NodeId

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.config import NodeConfig
    from multiraft.node.metadata_ops import MetadataOps
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime
    from multiraft.transport.transport import Transport

JOIN_TIMEOUT_S = 60.0
NODE_HEARTBEAT_INTERVAL_S = 0.5
CONTROLLER_INTERVAL_S = 0.5
# A decommission's own steps follow the catalog this closely (each step of a leaving
# node waited up to a whole interval: its moves' start, its metadata changes at the end).
DECOMMISSION_POLL_S = 0.1
# A relayed registration waits this long for an answer that may never come back (see
# Controller._relay_registration): the proposal reaches the leader either way.
RELAY_TIMEOUT_S = 1.0
REPLICA_MOVES_PER_ROUND_MAX = 100  # catalog entries per round; the copies themselves run per partition
# A leaving voter takes two changes (a learner promoted in its place, then its removal):
# both in one round, the second as soon as the first applied, not a round later.
METADATA_CHANGES_PER_ROUND_MAX = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    """Whether the cluster is ready as this node sees it: a metadata leader known, this node
    registered, and every known node (the initial cluster's and every registered one)
    registered and alive in the catalog (the controller's view, the one topic creation
    places replicas by)."""

    metadata_leader: int  # 0: none known
    registered: bool
    nodes: tuple[int, ...]  # every known node
    unregistered: tuple[int, ...]  # known (the initial cluster) but not in the catalog yet
    dead: tuple[int, ...]  # in the catalog, not alive

    @property
    def ready(self) -> bool:
        return self.metadata_leader != 0 and self.registered and not self.unregistered and not self.dead

    def missing(self) -> str:
        """What keeps the cluster from being ready, for people ('' when ready)."""
        parts = []
        if self.metadata_leader == 0:
            parts.append("no metadata leader known yet")
        if not self.registered:
            parts.append("this node has not registered yet")
        if self.unregistered:
            parts.append(f"nodes not registered yet: {', '.join(map(str, self.unregistered))}")
        if self.dead:
            parts.append(f"nodes not live: {', '.join(map(str, self.dead))}")
        return "; ".join(parts)


class Controller:
    def __init__(self, config: NodeConfig, registry: GroupRegistry, catalog: CatalogHolder, metadata: MetadataOps,
                 rpc: Rpc, transport: Transport, logger: Any, heartbeat_answer: Callable[[], bytes] = bytes,
                 heard: Callable[[int, bytes], None] = lambda source, body: None) -> None:
        """`heartbeat_answer`: this node's feature levels (multiraft/node/features.py), which it
        sends with its node heartbeat and answers one with (any node may ask it that way);
        `heard(source, body)`: told of each heartbeat's body (an older node's is empty)."""
        self.id = config.node_id
        self._config = config
        self._registry = registry
        self._catalog = catalog
        self._metadata = metadata
        self._rpc = rpc
        self._transport = transport
        self._logger = logger
        self._heartbeat_answer = heartbeat_answer
        self._heard = heard
        self.registered = asyncio.Event()
        self._last_seen: dict[NodeId, float] = {}
        self._was_controller = False
        self.decommission_waiting = ""  # why a decommission waits, as the controller sees it
        rpc.register("metadata.add_learner", self.serve_add_learner)
        rpc.register("metadata.promote", self.serve_promote)
        rpc.register("node.heartbeat", self.serve_heartbeat)

    @property
    def _runtime(self) -> GroupRuntime:
        return self._registry.groups[METADATA_GROUP]

    # ------------------------------------------------------------------ admission

    async def add_node(self, node_id: NodeId, raft_addr: str, http_addr: str, rack: str | None) -> dict[str, str]:
        """Admit a joining node: register it, make it a learner of the metadata group.

        Idempotent (a restarted joiner asks again). Returns the raft addresses of the
        registered nodes, so the joiner can dial the cluster.
        """
        await self._metadata.propose(
            RegisterNode(node_id=node_id, raft_addr=raft_addr, http_addr=http_addr, rack=rack)
        )
        if self._runtime.core.role is Role.LEADER:
            await self._add_learner(node_id)
        else:
            await self._metadata.call_leader("metadata.add_learner", json.dumps({"node_id": node_id}).encode())
        return {str(n.node_id): n.raft_addr for n in self._catalog.catalog.nodes.values()}

    async def _add_learner(self, node_id: NodeId) -> None:
        runtime = self._runtime
        async with asyncio.timeout(RPC_TIMEOUT_S):
            while node_id not in runtime.core.membership.members:
                try:
                    await runtime.propose_membership(ConfChange(ConfChangeOp.ADD_LEARNER, node_id))
                except MembershipChangeInProgress:
                    await asyncio.sleep(0.05)  # one change at a time: wait for the previous one

    async def serve_add_learner(self, source: int, body: bytes) -> tuple[int, bytes]:
        core = self._runtime.core
        if core.role is not Role.LEADER:
            return error_answer(NotLeader(core.leader))
        node_id = NodeId(int(json.loads(body)["node_id"]))
        return await answer(self._add_learner(node_id), lambda _: b"{}")

    async def promote(self, node_id: NodeId, replace: NodeId | None) -> None:
        """Make metadata learner `node_id` a voter, in place of `replace` if given
        (metadata_voters.py); done by the metadata leader, wherever asked."""
        if self._runtime.core.role is Role.LEADER:
            await self._promote(node_id, replace)
        else:
            body = json.dumps({"node_id": node_id, "replace": replace}).encode()
            await self._metadata.call_leader("metadata.promote", body)

    async def serve_promote(self, source: int, body: bytes) -> tuple[int, bytes]:
        core = self._runtime.core
        if core.role is not Role.LEADER:
            return error_answer(NotLeader(core.leader))
        request = json.loads(body)
        replace = request["replace"]
        return await answer(self._promote(NodeId(int(request["node_id"])),
                                          None if replace is None else NodeId(int(replace))), lambda _: b"{}")

    async def _promote(self, node_id: NodeId, replace: NodeId | None) -> None:
        runtime = self._runtime
        core = runtime.core
        matches = {n: p.match for n in core.membership.members if (p := core.progress(n)) is not None}
        steps = metadata_voters.promotion(self._catalog.catalog, core.membership, self.id, matches,
                                          core.commit_index, node_id, replace)
        async with asyncio.timeout(RPC_TIMEOUT_S):
            for change in steps:
                self._logger.info("metadata_voters_change", op=change.op.name, node=change.node_id)
                while True:
                    try:
                        await runtime.propose_membership(change)
                        break
                    except MembershipChangeInProgress:
                        await asyncio.sleep(0.05)  # one change at a time: wait for the previous one

    async def join(self, address: Any) -> None:
        """Ask a node of an existing cluster (its HTTP address) to admit this one. A node
        whose own HTTP API serves TLS calls over HTTPS too (the scheme is the cluster's
        setting), trusting the system's CAs and the cluster's peer CA (multiraft/net/tls.py)."""
        import aiohttp

        config = self._config
        body = {"node_id": self.id, "raft_addr": str(config.raft_addr), "http_addr": str(config.http_addr),
                "rack": config.rack or None}
        scheme = "https" if config.http_tls else "http"
        tls = node_http_client_context(config.peer_tls_ca) if config.http_tls else None
        url = f"{scheme}://{address}/v1/admin/nodes"
        data = json.dumps(body).encode()
        # Admitting a node is an admin's act: with auth on, the joiner shows the admin token;
        # always, it signs its addresses with the cluster secret (multiraft/node/admission.py).
        headers = {"Authorization": f"Bearer {config.admin_token.decode()}"} if config.admin_token else {}
        delay = 0.1
        async with asyncio.timeout(JOIN_TIMEOUT_S), aiohttp.ClientSession() as session:
            while True:
                signed = {**headers, "Content-Type": "application/json",
                          **admission.sign(config.cluster_secret, data, time.time())}
                try:
                    async with session.post(url, data=data, headers=signed, ssl=tls or True) as response:
                        reply = await response.json()
                        if response.status == 200:
                            break
                        self._logger.info("join_retry", status=response.status, error=reply.get("error_code"))
                except (aiohttp.ClientError, ValueError) as error:
                    self._logger.info("join_retry", error=repr(error))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        peers = {int(n): a for n, a in reply["nodes"].items() if int(n) != self.id}
        self._transport.update_peers({n: host_port(a) for n, a in peers.items()})
        self._logger.info("joined", via=str(address), peers=sorted(peers))

    async def register(self) -> None:
        """Register this node (addresses, rack) with the catalog; retry until it is in."""
        config = self._config
        command = RegisterNode(
            node_id=self.id, raft_addr=str(config.raft_addr), http_addr=str(config.http_addr),
            rack=config.rack or None,
        )
        delay = 0.05
        while True:
            try:
                await self._metadata.propose(command)
                self.registered.set()
                self._logger.info("node_registered")
                return
            except ClientError as error:
                self._logger.debug("registration_retry", error=error.code)
                if self._runtime.core.leader == 0:
                    await self._relay_registration(command)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _relay_registration(self, command: RegisterNode) -> None:
        """Hand this node's registration to any peer, which forwards it to the metadata leader.

        A node whose catalog entry holds addresses it does not listen on (rewritten by a
        bug or an old unsigned admission) hears from no leader: every message to it goes
        to the wrong place. Its own outbound links still reach the others, so a peer can
        carry the registration; once it is applied, the cluster dials the node where it
        is. The peer's answer may not come back (it travels the same wrong way): the
        registration loop learns the outcome from the next round.
        """
        peers = {n for n in self._config.initial_cluster} | set(self._catalog.catalog.nodes)
        for peer in sorted(peers - {self.id}):
            with contextlib.suppress(RpcError, ClientError):
                await self._rpc.call(peer, "metadata.propose", encode_command(command), RELAY_TIMEOUT_S)
                return

    def readiness(self) -> Readiness:
        catalog = self._catalog.catalog
        known = set(self._config.initial_cluster) | set(catalog.nodes) | {self.id}
        alive = {n.node_id for n in catalog.live_nodes()}
        leaving = catalog.decommissioning_nodes()  # may be stopped: the cluster does not wait for them
        return Readiness(
            metadata_leader=self._runtime.core.leader, registered=self.registered.is_set(),
            nodes=tuple(sorted(known - leaving)), unregistered=tuple(sorted(known - set(catalog.nodes))),
            dead=tuple(sorted(set(catalog.nodes) - alive - leaving)),
        )

    # ------------------------------------------------------------------ liveness

    async def send_heartbeats(self) -> None:
        runtime = self._runtime
        while True:
            await asyncio.sleep(NODE_HEARTBEAT_INTERVAL_S)
            leader = runtime.core.leader
            if leader == self.id:
                self._last_seen[self.id] = time.monotonic()
            elif leader != 0:
                with contextlib.suppress(RpcError):
                    # The body is read by a leader of this build on (its placement), ignored before.
                    await self._rpc.call(leader, "node.heartbeat", self._heartbeat_answer(), RPC_TIMEOUT_S)

    async def serve_heartbeat(self, source: int, body: bytes) -> tuple[int, bytes]:
        self._last_seen[NodeId(source)] = time.monotonic()
        self._heard(source, body)
        return STATUS_OK, self._heartbeat_answer()

    async def watch_liveness(self) -> None:
        """On the metadata leader: mark nodes dead/alive from their heartbeats (transitions logged)."""
        runtime = self._runtime
        dead_after = self._config.node_dead_after_ms / 1000
        while True:
            await asyncio.sleep(CONTROLLER_INTERVAL_S)
            leading = runtime.core.role is Role.LEADER
            if leading and not self._was_controller:
                now = time.monotonic()  # a new controller gives everyone a fresh grace period
                self._last_seen = {member: now for member in self._catalog.catalog.nodes}
            self._was_controller = leading
            if not leading:
                continue
            now = time.monotonic()
            for member in list(self._catalog.catalog.nodes.values()):
                # A node never heard from ages from when this controller first found it in the
                # catalog: an admitted node that never speaks goes dead and gets no placement.
                seen = self._last_seen.setdefault(member.node_id, now)
                status = NodeStatus.ALIVE if now - seen < dead_after else NodeStatus.DEAD
                if status is not member.status:
                    self._logger.info("node_status_changed", node=member.node_id, status=status.value)
                    with contextlib.suppress(ClientError):
                        await self._metadata.propose(SetNodeStatus(node_id=member.node_id, status=status))
            move_after = self._config.replica_move_after_ms / 1000
            if move_after >= 0:
                gone = {m.node_id for m in self._catalog.catalog.nodes.values() if m.status is NodeStatus.DEAD
                        and now - self._last_seen.get(m.node_id, now) >= move_after}
                if gone:
                    await self.replace_replicas_of(gone)

    async def run_decommissions(self) -> None:
        """On the metadata leader: a decommission round within DECOMMISSION_POLL_S of a
        catalog command or a change of the metadata group's membership (a mark, a move
        started or ended, a voter promoted), else every CONTROLLER_INTERVAL_S (a learner
        catching up shows in neither). Its own task, apart from `watch_liveness`: a
        membership change can wait seconds for its commit, and marking nodes dead must
        not wait behind it."""
        seen: tuple[int, Any] | None = None
        last = float("-inf")
        while True:
            await asyncio.sleep(DECOMMISSION_POLL_S)
            core = self._runtime.core
            if core.role is not Role.LEADER:
                seen = None
                continue
            now = time.monotonic()
            key = (self._catalog.topics_index, core.membership)
            if key == seen and now - last < CONTROLLER_INTERVAL_S:
                continue
            seen, last = key, now
            await self.decommission_round()

    async def decommission_round(self) -> None:
        """On the controller: the next steps of every decommission (decommission.py): moves
        of the nodes' replicas up to the cluster's bound, then the metadata group's
        membership change for a node that holds nothing any more."""
        catalog = self._catalog.catalog
        await self._readmit_non_members(catalog)
        leaving = catalog.decommissioning_nodes()
        if not leaving:
            self.decommission_waiting = ""
            return
        holding = {n for n in leaving if decommission.replicas_held(catalog, n)}
        allowed = decommission.moves_allowed(catalog)
        moves = await self.replace_replicas_of(holding, limit=allowed) if holding and allowed else 0
        why = ""
        for _ in range(METADATA_CHANGES_PER_ROUND_MAX):
            changed, why = await self._metadata_step(leaving - holding)
            if not changed:
                break
        self.decommission_waiting = why or decommission.moves_waiting(catalog, holding, allowed, moves)

    async def _metadata_step(self, leaving: set[NodeId] | frozenset[NodeId]) -> tuple[bool, str]:
        """Take the metadata group's next change for the nodes that hold nothing any more;
        (whether one went through, why none can be taken)."""
        core = self._runtime.core
        if core.role is not Role.LEADER:
            return False, ""
        matches = {n: p.match for n in core.membership.members if (p := core.progress(n)) is not None}
        change, why = decommission.metadata_step(self._catalog.catalog, core.membership, self.id, matches,
                                                 core.commit_index, leaving)
        if change is None:
            return False, why
        self._logger.info("decommission_metadata_change", op=change.op.name, node=change.node_id)
        try:
            async with asyncio.timeout(RPC_TIMEOUT_S):
                await self._runtime.propose_membership(change)
        except (MembershipChangeInProgress, ClientError, TimeoutError) as error:  # the next round asks again
            self._logger.info("decommission_metadata_change_deferred", node=change.node_id, error=repr(error))
            return False, ""
        return True, ""

    async def _readmit_non_members(self, catalog: Any) -> None:
        """A registered node that is no member of the metadata group and not leaving joins
        it again as a learner (as at its admission): a node recommissioned after it left the
        group, so a recommission undoes a finished decommission too, and a dead voter
        removed by `promote --replace` (metadata_voters.py: a retry of that promote is
        still a no-op). Registered nodes are otherwise always members: the initial voters,
        and every admitted node as a learner. Whatever its status: a node out of the group
        sends its heartbeats to the leader it last knew, so a later controller marks it
        dead (a dead learner costs nothing; readmitted, it hears the leader and beats again)."""
        members = self._runtime.core.membership.members
        for info in catalog.nodes.values():
            if info.node_id in members or info.decommissioning:
                continue
            self._logger.info("node_readmitted", node=info.node_id)
            try:
                await self._add_learner(info.node_id)
            except (ClientError, TimeoutError) as error:  # the next round asks again
                self._logger.info("readmission_deferred", node=info.node_id, error=repr(error))
            return  # one membership change per round

    async def replace_replicas_of(self, gone: set[NodeId], limit: int = REPLICA_MOVES_PER_ROUND_MAX) -> int:
        """Name a live node (not decommissioning) in place of each replica on a `gone`
        node; returns the moves proposed. One move per partition at a time (a partition
        with a copy still leaving waits); at most `limit` per call."""
        catalog = self._catalog.catalog
        live = [PlacementNode(n.node_id, n.rack or None) for n in self._metadata.placeable_nodes()
                if n.node_id not in gone]
        loads: dict[NodeId, int] = {}
        for topic in catalog.topics.values():
            for partition in topic.partitions:
                for host in partition.hosts:
                    loads[host] = loads.get(host, 0) + 1
        moves = 0
        for name, topic in sorted(catalog.topics.items()):
            for partition in topic.partitions:
                old = next((r for r in partition.replicas if r in gone), None)
                if old is None or partition.leaving:
                    continue
                others = [r for r in partition.replicas if r != old]
                new = replacement_for(live, others, partition.hosts, loads)
                if new is None:
                    continue
                try:
                    await self._metadata.propose(ReplaceReplica(topic=name, partition=partition.partition,
                                                               old=old, new=new))
                except ClientError as error:  # the topic went, or leadership moved: next round
                    self._logger.warning("replica_move_refused", topic=name, partition=partition.partition,
                                        error=repr(error))
                    return moves
                self._logger.info("replica_moving", topic=name, partition=partition.partition, old=old, new=new)
                loads[new] = loads.get(new, 0) + 1
                moves += 1
                if moves >= limit:
                    return moves
        return moves


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
