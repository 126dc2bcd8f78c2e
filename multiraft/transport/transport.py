"""The node's TCP transport: one outbound connection per peer, carrying every group.

    node 1                                         node 2
    send(2, type, group, body) -> PeerLink(2) ---- TCP (dialled by 1) ----> InboundConnection
    InboundConnection <---- TCP (dialled by 2) ---- PeerLink(1) <- send(1, ...)  -> on_frame(2, ...)

Each node dials each peer once, so between two nodes there are two connections,
one per direction; an outbound connection only writes (after the handshake) and
an inbound one only reads. That keeps each side simple: the writer drains one
bounded queue, the inbound connection (a protocol, multiraft/transport/inbound.py) hands
frames to `on_frame` in arrival order, from the callback that read them.

Why a callback rather than a queue we own: `on_frame` is a plain synchronous
call, so the runtime decides how to queue and bound inbound work per group
without a second copy of that policy here. It must not block; if it raises, the
error is logged and counted and the connection goes on.

Every task this module starts (peer links, inbound handshakes) is tracked and
awaited by `stop()`. Faults from a peer (bad handshake, bad frame, oversized
frame) drop that one connection and are counted; they never stop the transport.

Hostile connections: an inbound connection is admitted only while it fits the
bounds of `TransportConfig` (all inbound connections; those still in their
handshake, from strangers and per source address, with known peers' addresses
kept apart: multiraft/transport/inbound_admission.py); otherwise it is closed at once and
counted by reason. Admitted, it must finish the handshake within
`handshake_timeout_s`.

TLS (optional, `tls=PeerTls`): mutual TLS on both directions, the handshake of
the cluster secret inside it. A peer link dials, then upgrades (verifying the
peer's certificate and the host it names, presenting ours); the listener is then
a `multiraft.net.tls_listener.Listener`, which admits a connection by the same bounds
*before* its TLS handshake and runs that handshake, then the secret's, within the
one `handshake_timeout_s`. A client certificate not signed by the CA fails the TLS
handshake (counted in `tls_handshakes_refused`).
See docs/transport.md for the frame and handshake formats and the API.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from multiraft.net.tls import PeerTls
from multiraft.net.tls_listener import AcceptedSocket, Listener, upgrade
from multiraft.transport.frames import FrameTooLarge, TransportError, frame_bytes
from multiraft.transport.handshake import SECRET_BYTES_MIN, accept_handshake
from multiraft.transport.inbound import InboundConnection
from multiraft.transport.inbound_admission import (
    InboundAdmission,
    PendingSlot,
    Refusal,
    normal_address,
)
from multiraft.transport.peer_link import PeerLink, enable_keepalive
from multiraft.transport.side_channel import SideChannel
from multiraft.transport.transport_config import (
    PeerStats,
    TransportConfig,
    TransportCounters,
    TransportStats,
)

__all__ = ["OnFrame", "Transport"]

OnFrame = Callable[[int, int, int, bytes], None]  # (source_node_id, frame_type, group_id, body)

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


class Transport:
    def __init__(
        self,
        node_id: int,
        listen_host: str,
        listen_port: int,
        peers: Mapping[int, tuple[str, int]],
        secret: bytes,
        on_frame: OnFrame,
        *,
        config: TransportConfig | None = None,
        logger: Any = None,
        rng: random.Random | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        if node_id <= 0:
            raise ValueError(f"node_id must be positive, got {node_id}")
        if len(secret) < SECRET_BYTES_MIN:
            raise ValueError(f"the cluster secret must be at least {SECRET_BYTES_MIN} bytes")
        self.node_id = node_id
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._secret = bytes(secret)
        self._on_frame = on_frame
        self._config = config or TransportConfig()
        base_logger = logger if logger is not None else structlog.get_logger("multiraft.transport.transport")
        self._logger = base_logger.bind(node_id=node_id)
        self._rng = rng or random.Random()
        self._tls = tls  # None: plain TCP, as ever
        # Outgoing sockets bind to our own raft host so per-address faults (chaos)
        # cut exactly this node's traffic; a wildcard listen host cannot be bound to.
        self._source_host = None if listen_host in _WILDCARD_HOSTS else listen_host
        # Called with a peer's id when dialling it was refused (nothing listens at its
        # raft address: its process is gone); the node fails over the groups it led.
        self.on_peer_refused: Callable[[int], None] | None = None
        self._counters = TransportCounters()
        self._links: dict[int, PeerLink] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # links being cancelled
        # Inbound connections by the task serving each (None while its TLS handshake runs).
        self._inbound: dict[asyncio.Task[None], InboundConnection | None] = {}
        self._inbound_by_source: dict[int, asyncio.Task[None]] = {}
        self._admission = InboundAdmission(
            pending_max=self._config.handshakes_pending_max,
            pending_per_address_max=self._config.handshakes_pending_per_address_max,
        )
        self._server: asyncio.Server | None = None
        self._listener: Listener | None = None  # instead of _server when TLS is on
        self._running = False
        self._stopped = False
        self.update_peers(peers)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen, then start dialling every peer."""
        assert not self._running and not self._stopped, "a transport starts once"
        if self._tls is not None:
            self._listener = Listener(self._listen_host, self._listen_port, self._accept_tls,
                                      logger=self._logger, name="transport")
            await self._listener.start()
        else:
            self._server = await asyncio.get_running_loop().create_server(
                self._new_inbound, self._listen_host, self._listen_port, reuse_address=True
            )
        self._running = True
        for link in self._links.values():
            link.start()
        self._logger.info(
            "transport_started", address=self.listen_address, peers=sorted(self._links),
            tls=self._tls is not None,
        )

    async def stop(self) -> None:
        """Close the listener and every connection; cancel and await every task."""
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            await self._listener.stop()
        tasks: list[asyncio.Task[None]] = []
        for link in self._links.values():
            task = link.cancel()
            if task is not None:
                tasks.append(task)
        self._links.clear()
        tasks.extend(self._retiring)
        for task, connection in self._inbound.items():
            if connection is not None:
                connection.abort()
            task.cancel()
            tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        assert not self._inbound and not self._retiring
        self._logger.info("transport_stopped")

    @property
    def listen_address(self) -> tuple[str, int]:
        """The bound address (the real port when started with port 0)."""
        if self._listener is not None:
            return self._listener.address
        assert self._server is not None and self._server.sockets, "start() first"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    # ------------------------------------------------------------------ sending

    def send(self, peer_id: int, frame_type: int, group_id: int, body: bytes) -> bool:
        """Queue a frame for `peer_id`; never blocks. False when the peer is unknown
        or the transport is not running. A full queue sheds older frames (counted)
        and still accepts this one. Raises FrameTooLarge above frame_bytes_max."""
        assert 1 <= frame_type <= 255, f"frame type {frame_type} is not a u8 above 0"
        assert 0 <= group_id < 2**64, f"group id {group_id} is not a u64"
        size = frame_bytes(len(body))
        if size > self._config.frame_bytes_max:
            raise FrameTooLarge(size, self._config.frame_bytes_max)
        link = self._links.get(peer_id)
        if link is None or not self._running:
            self._counters.sends_refused += 1
            return False
        link.enqueue(frame_type, group_id, body)
        return True

    def update_peers(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Make `peers` the set of nodes we dial: new ones start, removed ones stop
        (their queues dropped), moved ones redial. Our own id is ignored, so the
        whole cluster map may be passed. Inbound connections are not affected."""
        wanted = {peer_id: tuple(address) for peer_id, address in peers.items()}
        wanted.pop(self.node_id, None)
        self._admission.set_peers({peer_id: address[0] for peer_id, address in wanted.items()})
        for peer_id in sorted(set(self._links) - set(wanted)):
            task = self._links.pop(peer_id).cancel()
            if task is not None:
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            self._logger.info("peer_removed", peer_id=peer_id)
        for peer_id, address in sorted(wanted.items()):
            assert peer_id > 0, f"peer id {peer_id}"
            host, port = address
            link = self._links.get(peer_id)
            if link is not None:
                link.set_address((host, port))
                continue
            link = PeerLink(
                node_id=self.node_id,
                peer_id=peer_id,
                address=(host, port),
                source_host=self._source_host,
                secret=self._secret,
                config=self._config,
                counters=self._counters,
                logger=self._logger,
                rng=self._rng,
                tls_context=self._tls.client if self._tls is not None else None,
            )
            link.on_refused = self._peer_refused
            self._links[peer_id] = link
            if self._running:
                link.start()

    def side_channel(self) -> SideChannel | None:
        """Side connections to peers for bulk bytes (side_channel.py), authenticated by
        this transport's secret; None when peers talk TLS (a side connection would not be
        protected: its callers keep to frames)."""
        if self._tls is not None:
            return None
        return SideChannel(self.node_id, self._secret, self._listen_host, self._peer_address,
                           self._config.handshake_timeout_s, self._config.connect_timeout_s)

    def _peer_address(self, peer_id: int) -> tuple[str, int] | None:
        link = self._links.get(peer_id)
        return None if link is None else link.address

    def _peer_refused(self, peer_id: int) -> None:
        if self.on_peer_refused is not None:
            self.on_peer_refused(peer_id)

    # ------------------------------------------------------------------ observing

    def peer_connected(self, peer_id: int) -> bool:
        link = self._links.get(peer_id)
        return link is not None and link.connected

    def stats(self) -> TransportStats:
        counters = self._counters
        peers: dict[int, PeerStats] = {
            peer_id: link.stats() for peer_id, link in sorted(self._links.items())
        }
        return TransportStats(
            frames_in=counters.frames_in,
            bytes_in=counters.bytes_in,
            frames_out=counters.frames_out,
            bytes_out=counters.bytes_out,
            heartbeats_shed=counters.heartbeats_shed,
            frames_shed=counters.frames_shed,
            sends_refused=counters.sends_refused,
            connects=counters.connects,
            connect_failures=counters.connect_failures,
            handshakes_refused=counters.handshakes_refused,
            handshake_timeouts=counters.handshake_timeouts,
            tls_handshakes_refused=counters.tls_handshakes_refused,
            inbound_refused=counters.inbound_refused,
            protocol_errors=counters.protocol_errors,
            on_frame_errors=counters.on_frame_errors,
            connections_inbound=len(self._inbound_by_source),
            connections_outbound=sum(1 for link in self._links.values() if link.connected),
            handshakes_pending=self._admission.pending,
            inbound_refused_by_reason=dict(counters.inbound_refused_by_reason),
            peers=peers,
        )

    # ------------------------------------------------------------------ receiving

    def _new_inbound(self) -> InboundConnection:
        """The plain listener's protocol factory: one reader per accepted connection,
        admitted (or refused) by `_accept` once connected."""
        return InboundConnection(
            frame_bytes_max=self._config.frame_bytes_max,
            counters=self._counters,
            on_frame=self._on_frame,
            logger=self._logger,
            on_connection=self._accept,
        )

    def _new_inbound_tls(self) -> InboundConnection:
        """The protocol of a TLS connection: admitted before its handshake (`_accept_tls`)."""
        return InboundConnection(
            frame_bytes_max=self._config.frame_bytes_max,
            counters=self._counters,
            on_frame=self._on_frame,
            logger=self._logger,
        )

    def _admit(self, address: str) -> PendingSlot | Refusal:
        if not self._running:
            return Refusal.NOT_RUNNING
        if len(self._inbound) >= self._config.inbound_connections_max:
            return Refusal.CONNECTIONS_FULL
        return self._admission.admit(address)

    def _accept(self, connection: InboundConnection) -> None:
        """A connection was accepted: if it fits the bounds, start its handshake in a
        task of ours (tracked, cancelled and awaited by stop); frames then flow without
        it. Otherwise close it at once and count why."""
        peer_address = _peername(connection)
        admitted = self._admit(_source_address(peer_address))
        if isinstance(admitted, Refusal):
            self._refused(admitted, peer_address)
            connection.abort()
            return
        task = asyncio.create_task(
            self._serve_inbound(connection, admitted, self._handshake_deadline()), name="transport-inbound"
        )
        self._inbound[task] = connection
        task.add_done_callback(self._inbound_done)

    def _accept_tls(self, accepted: AcceptedSocket) -> None:
        """As `_accept`, before the TLS handshake: the same bounds, one deadline for the
        TLS handshake and the secret's together."""
        admitted = self._admit(_source_address(accepted.peer))
        if isinstance(admitted, Refusal):
            self._refused(admitted, accepted.peer)
            accepted.reset()
            return
        task = asyncio.create_task(
            self._serve_inbound_tls(accepted, admitted, self._handshake_deadline()), name="transport-inbound"
        )
        self._inbound[task] = None
        task.add_done_callback(self._inbound_done)
        task.add_done_callback(lambda _: accepted.reset())  # a no-op once a transport has the socket

    def _handshake_deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._config.handshake_timeout_s

    def _refused(self, reason: Refusal, peer_address: object) -> None:
        counters = self._counters
        counters.inbound_refused += 1
        count = counters.inbound_refused_by_reason.get(reason, 0) + 1
        counters.inbound_refused_by_reason[reason] = count
        log = _sampled(self._logger, count)
        log("inbound_refused", reason=str(reason), refused=count, peer_address=peer_address)

    def _inbound_done(self, task: asyncio.Task[None]) -> None:
        self._inbound.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            self._logger.error("inbound_task_failed", error=repr(task.exception()))

    async def _serve_inbound_tls(self, accepted: AcceptedSocket, slot: PendingSlot, deadline: float) -> None:
        """The TLS handshake (client certificate required), then as a plain connection."""
        assert self._tls is not None
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    _, connection = await upgrade(accepted, self._new_inbound_tls, self._tls.server,
                                                  self._config.handshake_timeout_s)
            except (OSError, TimeoutError) as error:
                self._handshake_refused(error, accepted.peer, phase="tls")
                return
            task = asyncio.current_task()
            assert task is not None
            self._inbound[task] = connection
            await self._serve_inbound(connection, slot, deadline)
        finally:
            self._admission.release(slot)  # a no-op when released already

    async def _serve_inbound(self, connection: InboundConnection, slot: PendingSlot, deadline: float) -> None:
        """Authenticate, then let the connection hand its frames on until it closes."""
        source: int | None = None
        try:
            source = await self._authenticate(connection, _peername(connection), deadline)
            self._admission.release(slot)  # authenticated or refused: no longer pending
            if source is None:
                return
            if source in self._links:
                self._admission.learn(source, slot.address)
            connection.start_frames(source)
            await connection.closed
        finally:
            self._admission.release(slot)
            connection.abort()
            if source is not None and self._inbound_by_source.get(source) is asyncio.current_task():
                del self._inbound_by_source[source]

    async def _authenticate(self, connection: InboundConnection, peer_address: object,
                            deadline: float) -> int | None:
        enable_keepalive(connection)
        try:
            async with asyncio.timeout_at(deadline):
                source = await accept_handshake(
                    connection, connection, secret=self._secret, node_id=self.node_id
                )
        except (OSError, TimeoutError, TransportError) as error:
            self._handshake_refused(error, peer_address, phase="secret")
            return None
        # A peer that redialled (restart, healed partition) replaces its old connection,
        # which may be dead without us knowing; one inbound connection per source.
        current = asyncio.current_task()
        assert current is not None
        previous = self._inbound_by_source.get(source)
        if previous is not None and (replaced := self._inbound.get(previous)) is not None:
            replaced.abort()
        self._inbound_by_source[source] = current
        self._logger.info("inbound_connected", source=source, peer_address=peer_address)
        return source

    def _handshake_refused(self, error: BaseException, peer_address: object, *, phase: str) -> None:
        """Count and log an inbound handshake that failed: TLS's (`phase="tls"`: not TLS, no
        certificate or one the CA did not sign) or the secret's; timeouts apart."""
        counters = self._counters
        counters.handshakes_refused += 1
        if isinstance(error, TimeoutError):
            counters.handshake_timeouts += 1
        elif phase == "tls":
            counters.tls_handshakes_refused += 1
        log = _sampled(self._logger, counters.handshakes_refused)
        log("handshake_refused", peer_address=peer_address, phase=phase, error=repr(error),
            refused=counters.handshakes_refused)


def _peername(connection: InboundConnection) -> object:
    return connection.get_extra_info("peername")


def _sampled(logger: Any, count: int) -> Callable[..., Any]:
    """A flood of hostile connections must not become a flood of log lines: every
    refusal is counted, but only the 1st, 2nd, 4th, 8th... of a kind is a warning
    (the count is in the line); the rest are at debug."""
    return logger.warning if count & (count - 1) == 0 else logger.debug


def _source_address(peer_address: object) -> str:
    """The source IP of a connection ("" when the socket no longer knows it)."""
    if isinstance(peer_address, tuple) and peer_address:
        return normal_address(peer_address[0]) or str(peer_address[0])
    return ""
