"""Limits and counters of the transport: every bound is a named, validated field."""

from __future__ import annotations

from dataclasses import dataclass, field

from multiraft.transport.frames import FRAME_HEADER_BYTES, FrameType

__all__ = ["PeerStats", "TransportConfig", "TransportCounters", "TransportStats"]

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """Transport limits. Defaults suit a LAN cluster; tests shrink the timeouts."""

    # Frames waiting for one peer. 4,096 frames is seconds of traffic at full rate,
    # and more would only be stale by the time it went out (Raft resends).
    send_queue_frames_max: int = 4096
    # Bodies waiting for one peer; bounds memory when frames are large.
    send_queue_bytes_max: int = 64 * MIB
    # Whole frame, length field included. Matches storage's BATCH_BYTES_MAX (16 MiB)
    # plus room for a message around one batch.
    frame_bytes_max: int = 16 * MIB + 64 * 1024
    # A connection must finish the handshake within this time or it is closed. Until
    # then it has proven nothing, yet holds a socket, a task and a buffer (and one of
    # the pending slots below): this bounds how long a silent or trickling stranger
    # keeps them. A peer needs two round trips on a LAN, well under a second.
    handshake_timeout_s: float = 5.0
    connect_timeout_s: float = 5.0
    reconnect_backoff_initial_s: float = 0.05
    reconnect_backoff_max_s: float = 2.0
    # A write that cannot drain this long means the path is dead (a partition that
    # drops packets): reconnecting beats waiting out TCP's retransmission backoff.
    write_stall_timeout_s: float = 10.0
    write_batch_frames_max: int = 256
    write_batch_bytes_max: int = 1 * MIB
    # Inbound connections of any kind (authenticated or not): bounds the sockets and
    # tasks the listener can be made to hold. Above handshakes_pending_max, so strangers
    # alone never fill it.
    inbound_connections_max: int = 256
    # Connections not yet authenticated, from addresses that are not known peers, all
    # together: a flood of strangers costs at most this many sockets and tasks, each for
    # at most handshake_timeout_s, and cannot crowd out peers (whose addresses have slots
    # of their own, multiraft/transport/inbound_admission.py). go-ethereum's MaxPendingPeers (50)
    # bounds the same phase; a raft node expects a handful of peers, not thousands.
    handshakes_pending_max: int = 16
    # Connections not yet authenticated from one source address, known peers included:
    # one host cannot take the whole pending pool (go-ethereum throttles inbound
    # attempts per IP, Kafka caps max.connections.per.ip). A node dials us once; two
    # overlap at most while a redial replaces an attempt that is still timing out.
    handshakes_pending_per_address_max: int = 4
    # StreamReader buffer; larger than asyncio's 64 KiB default so big frames need fewer reads.
    read_buffer_bytes: int = 256 * 1024
    # Frames of these types are shed before any other when a peer's queue is full.
    heartbeat_frame_types: frozenset[int] = frozenset({FrameType.HEARTBEATS})

    def __post_init__(self) -> None:
        positive = (
            "send_queue_frames_max",
            "send_queue_bytes_max",
            "handshake_timeout_s",
            "connect_timeout_s",
            "reconnect_backoff_initial_s",
            "write_stall_timeout_s",
            "write_batch_frames_max",
            "write_batch_bytes_max",
            "inbound_connections_max",
            "handshakes_pending_max",
            "handshakes_pending_per_address_max",
            "read_buffer_bytes",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.frame_bytes_max <= FRAME_HEADER_BYTES:
            raise ValueError(f"frame_bytes_max must exceed the {FRAME_HEADER_BYTES}-byte header")
        if self.frame_bytes_max > 2**32:
            raise ValueError("frame_bytes_max must fit the u32 length field")
        if self.send_queue_bytes_max < self.frame_bytes_max:
            raise ValueError("send_queue_bytes_max must hold at least one maximal frame")
        if self.reconnect_backoff_max_s < self.reconnect_backoff_initial_s:
            raise ValueError("reconnect_backoff_max_s must be >= reconnect_backoff_initial_s")
        if self.inbound_connections_max <= self.handshakes_pending_max:
            raise ValueError(
                "inbound_connections_max must exceed handshakes_pending_max (room for peers)"
            )
        if self.handshakes_pending_per_address_max > self.handshakes_pending_max:
            raise ValueError("handshakes_pending_per_address_max must be <= handshakes_pending_max")


@dataclass(slots=True)
class TransportCounters:
    """Mutable totals, shared by the transport and its peer links (one event loop)."""

    frames_in: int = 0
    bytes_in: int = 0
    frames_out: int = 0
    bytes_out: int = 0
    heartbeats_shed: int = 0
    frames_shed: int = 0
    sends_refused: int = 0  # unknown peer, or transport not running
    connects: int = 0
    connect_failures: int = 0
    handshakes_refused: int = 0  # inbound handshakes that failed (timeouts included)
    handshake_timeouts: int = 0  # of which: not finished within handshake_timeout_s
    tls_handshakes_refused: int = 0  # of which: TLS failed (not TLS, no or an untrusted certificate)
    inbound_refused: int = 0  # closed at once, for any reason in inbound_refused_by_reason
    inbound_refused_by_reason: dict[str, int] = field(default_factory=dict)  # Refusal values
    protocol_errors: int = 0  # inbound connections dropped for bad frames
    on_frame_errors: int = 0  # the callback raised


@dataclass(frozen=True, slots=True)
class PeerStats:
    peer_id: int
    address: tuple[str, int]
    connected: bool
    queued_frames: int
    queued_bytes: int
    frames_out: int
    bytes_out: int
    heartbeats_shed: int
    frames_shed: int
    connects: int
    connect_failures: int


@dataclass(frozen=True, slots=True)
class TransportStats:
    """A snapshot for metrics: node totals plus one entry per current peer."""

    frames_in: int
    bytes_in: int
    frames_out: int
    bytes_out: int
    heartbeats_shed: int
    frames_shed: int
    sends_refused: int
    connects: int
    connect_failures: int
    handshakes_refused: int
    handshake_timeouts: int
    inbound_refused: int
    protocol_errors: int
    on_frame_errors: int
    connections_inbound: int
    connections_outbound: int
    tls_handshakes_refused: int = 0  # inbound TLS handshakes that failed (not timeouts)
    handshakes_pending: int = 0  # inbound connections admitted and not yet authenticated
    inbound_refused_by_reason: dict[str, int] = field(default_factory=dict)
    peers: dict[int, PeerStats] = field(default_factory=dict)
