"""Raft traffic between nodes: frames out (heartbeats coalesced), frames in (dispatched).

Out: every group's messages go to the transport at once, except compactable
heartbeats, which wait for the end of the event-loop turn and leave as one
`HEARTBEATS` frame per peer carrying every group's (CockroachDB's coalesced
heartbeats). In: each frame goes to the group it names, to the RPC layer, or to
peer liveness (pings, the leaders a peer announces). A peer whose raft address
refuses connections has no process behind it: the groups it led fail over now.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.node.early_votes import EarlyVotes
from multiraft.node.move_throttle import THROTTLED_TYPES, throttled
from multiraft.transport.frames import FrameTooLarge, FrameType
from multiraft.transport.rpc import FRAME_RPC_REQUEST, FRAME_RPC_RESPONSE
from raftlog.messages import Message
from raftlog.types import GroupId, NodeId
from raftlog.wire import (
    WireError,
    decode_heartbeats,
    decode_message,
    encode_heartbeats,
    encode_message,
    heartbeat_is_compactable,
)

if TYPE_CHECKING:
    from multiraft.node.move_throttle import MoveThrottle
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.liveness import PeerLiveness
    from multiraft.transport.transport import Transport

QUIESCE = struct.Struct(">QQQ")  # group id, term, log end index


class Outbox:
    """What this node's groups send, and its pings."""

    def __init__(self, node_id: NodeId, transport: Transport, registry: GroupRegistry, logger: Any) -> None:
        self._id = node_id
        self._transport = transport
        self._registry = registry
        self._logger = logger
        self._heartbeats: dict[int, list[tuple[GroupId, Message]]] = {}
        self._flush_scheduled = False
        self.throttle: MoveThrottle | None = None  # set by the node

    def send(self, group_id: GroupId, message: Message) -> None:
        # The metadata group's learners are nodes that joined, not copies being made: their
        # catalog must not wait behind a move's bulk.
        if message.type in THROTTLED_TYPES and self.throttle is not None and group_id != 0:
            runtime = self._registry.groups.get(group_id)
            if runtime is not None and throttled(message, runtime.core.membership.learners):
                self.throttle.offer(group_id, message)  # a copy being made (move_throttle.py)
                return
        self.send_now(group_id, message)

    def send_now(self, group_id: GroupId, message: Message) -> None:
        if heartbeat_is_compactable(message):
            self._heartbeats.setdefault(message.target, []).append((group_id, message))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_heartbeats)
            return
        try:
            self._transport.send(message.target, FrameType.RAFT_MESSAGE, group_id, encode_message(message))
        except FrameTooLarge:
            # Raft retries; an append this big means message_bytes_max is set above the frame limit.
            self._logger.error("raft_message_too_large", group_id=group_id, type=message.type.name)

    def _flush_heartbeats(self) -> None:
        """One frame per peer for every group's heartbeats of this loop turn."""
        self._flush_scheduled = False
        beats, self._heartbeats = self._heartbeats, {}
        for peer, batch in beats.items():
            self._transport.send(peer, FrameType.HEARTBEATS, 0, encode_heartbeats(batch))

    def on_quiesce(self, group_id: GroupId, term: int, index: int) -> None:
        core = self._registry.groups[group_id].core
        body = QUIESCE.pack(group_id, term, index)
        for member in sorted(core.membership.members - {self._id}):
            self._transport.send(member, FrameType.QUIESCE, group_id, body)

    def ping(self, peers: list[int], liveness: PeerLiveness) -> None:
        """A ping to every peer, carrying now and then the groups this node leads (the
        registry keeps that list from role changes: no walk over every group)."""
        led = self._registry.led
        body = liveness.next_ping(lambda: list(led.items()))
        for peer in peers:
            self._transport.send(peer, FrameType.PING, 0, body)


class Inbox:
    """Frames from peers, to the groups, the RPC layer or peer liveness they are for."""

    def __init__(self, node_id: NodeId, registry: GroupRegistry, liveness: PeerLiveness,
                 rpc_frame: Callable[[int, int, bytes], None], logger: Any) -> None:
        self._id = node_id
        self._registry = registry
        self._liveness = liveness
        self._rpc_frame = rpc_frame
        self._logger = logger
        self.early_votes = EarlyVotes()  # for groups not open here yet (early_votes.py)

    def on_frame(self, source: int, frame_type: int, group_id: int, body: bytes) -> None:
        self._liveness.heard(source)
        try:
            if frame_type == FrameType.RAFT_MESSAGE:
                self._deliver(source, GroupId(group_id), decode_message(body))
            elif frame_type == FrameType.HEARTBEATS:
                for beat_group, message in decode_heartbeats(body):
                    self._deliver(source, beat_group, message)
            elif frame_type == FrameType.QUIESCE:
                group_id_, term, index = QUIESCE.unpack(body)
                runtime = self._registry.groups.get(GroupId(group_id_))
                if runtime is not None:
                    runtime.request_quiesce(source, term, index)
            elif frame_type == FrameType.PING and body:
                self._liveness.on_leaders(source, body)
            elif frame_type in (FRAME_RPC_REQUEST, FRAME_RPC_RESPONSE):
                self._rpc_frame(source, frame_type, body)
        except (WireError, struct.error) as error:
            self._logger.warning("bad_frame_dropped", source=source, error=str(error))

    def on_peer_refused(self, peer: int) -> None:
        """Nothing listens at `peer`'s raft address: its process is gone (a kill -9, a
        crash; a live node never refuses). It counts as silent at once, and the groups
        it led fail over now instead of after an election timeout (GroupRuntime._leader_gone)."""
        self._liveness.gone(peer)  # calls waiting on it fail now (rpc), quiet groups wake
        led = [runtime for runtime in self._registry.groups.values() if runtime.core.leader == peer]
        if led:
            self._logger.info("peer_refused_leader_gone", peer=peer, groups=len(led))
        for runtime in led:
            runtime.leader_gone(peer)

    def _deliver(self, source: int, group_id: GroupId, message: Message) -> None:
        if message.source != source or message.target != self._id:
            self._logger.warning("misaddressed_message_dropped", source=source, claimed=message.source)
            return
        runtime = self._registry.groups.get(group_id)
        if runtime is not None:
            runtime.deliver(message)
        else:
            self.early_votes.keep(group_id, message)

    def opened(self, group_id: GroupId) -> None:
        """A group just opened here: the vote requests that came before it, now."""
        runtime = self._registry.groups.get(group_id)
        for message in self.early_votes.take(group_id):
            if runtime is not None:
                runtime.deliver(message)
