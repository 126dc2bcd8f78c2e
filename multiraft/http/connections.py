"""Which HTTP connections a server keeps, and what it dropped: pure bookkeeping.

`ConnectionGate` admits a new connection while the server holds fewer than
`connections_max` and its client address fewer than
`connections_per_address_max` (multiraft/http/limits.py), and counts every
connection it refused or the server dropped on a deadline, for /metrics. The
socket work (closing, timers) is multiraft/http/server.py's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from multiraft.http.limits import ConnectionLimits

__all__ = ["ConnectionGate", "ConnectionStats", "Refusal"]


class Refusal(enum.StrEnum):
    """Why a new connection was closed at once (the label of its counter)."""

    CONNECTIONS_FULL = "connections_full"  # connections_max
    ADDRESS_FULL = "address_full"  # connections_per_address_max


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    open: int
    refused_by_reason: dict[str, int] = field(default_factory=dict)
    header_timeouts: int = 0
    write_timeouts: int = 0
    tls_handshakes_failed: int = 0
    tls_handshake_timeouts: int = 0


class ConnectionGate:
    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._open_by_address: dict[str, int] = {}
        self._open = 0  # invariant: == sum(_open_by_address.values()) <= connections_max
        self.refused_by_reason: dict[str, int] = {}
        self.header_timeouts = 0  # dropped: headers not in within header_read_timeout_s
        self.write_timeouts = 0  # dropped: the answer stalled for write_stall_timeout_s
        self.tls_handshakes_failed = 0  # with TLS on: the handshake failed (timeouts included)
        self.tls_handshake_timeouts = 0  # of which: not done within header_read_timeout_s

    def admit(self, address: str) -> Refusal | None:
        """Count a new connection from `address` in, or say why it may not stay."""
        if self._open >= self.limits.connections_max:
            return self._refused(Refusal.CONNECTIONS_FULL)
        if self._open_by_address.get(address, 0) >= self.limits.connections_per_address_max:
            return self._refused(Refusal.ADDRESS_FULL)
        self._open += 1
        self._open_by_address[address] = self._open_by_address.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from `address` closed (called once per admit)."""
        count = self._open_by_address[address]
        assert count > 0 and self._open > 0
        if count == 1:
            del self._open_by_address[address]
        else:
            self._open_by_address[address] = count - 1
        self._open -= 1

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            open=self._open,
            refused_by_reason=dict(self.refused_by_reason),
            header_timeouts=self.header_timeouts,
            write_timeouts=self.write_timeouts,
            tls_handshakes_failed=self.tls_handshakes_failed,
            tls_handshake_timeouts=self.tls_handshake_timeouts,
        )

    def _refused(self, reason: Refusal) -> Refusal:
        self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1
        return reason
