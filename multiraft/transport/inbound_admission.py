"""Which inbound raft connections may wait for their handshake: pure bookkeeping.

Before its handshake a connection has proven nothing, yet it holds a socket, a
task and a small buffer until it finishes or `handshake_timeout_s` ends it. So
connections that have not authenticated yet ("pending") have bounds of their
own, apart from authenticated peer links, which never count against them:

- `handshakes_pending_max`: pending connections from addresses that are not
  known peers ("strangers"), all together;
- `handshakes_pending_per_address_max`: pending connections from one source
  address, known peers included, so one host cannot take the whole pool;
- known peers' addresses have slots of their own: a pending connection from one
  is not counted in (nor refused by) the strangers' pool, so strangers that fill
  it never keep a peer out. A known address is an IP literal of the peer map or
  the address a peer of the map last authenticated from (which covers peers
  named by a host name, once they have connected).

The same split exists in go-ethereum's p2p server: `MaxPendingPeers` bounds the
handshake phase, inbound attempts are throttled per source IP, and trusted
peers may connect above `MaxPeers`. The bound is applied before the handshake,
so a known peer is recognised by its address only: a stranger on a peer's own
host shares that host's per-address slots (a local attacker is out of scope).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["InboundAdmission", "PendingSlot", "Refusal", "normal_address"]


class Refusal(enum.StrEnum):
    """Why an inbound connection was closed at once (the label of its counter)."""

    NOT_RUNNING = "not_running"  # the transport is stopping
    CONNECTIONS_FULL = "connections_full"  # inbound_connections_max
    PENDING_FULL = "pending_full"  # handshakes_pending_max (strangers)
    ADDRESS_PENDING_FULL = "address_pending_full"  # handshakes_pending_per_address_max


@dataclass(slots=True)
class PendingSlot:
    """One admitted connection's place until it authenticates or closes."""

    address: str
    reserved: bool  # admitted from a known peer's address: outside the strangers' pool
    released: bool = False


def normal_address(host: object) -> str | None:
    """The canonical text of an IP address (IPv4-mapped IPv6 as IPv4); None if `host`
    is not an IP literal (a host name, or no address at all)."""
    if not isinstance(host, str):
        return None
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


class InboundAdmission:
    def __init__(self, *, pending_max: int, pending_per_address_max: int) -> None:
        assert pending_max > 0 and pending_per_address_max > 0
        self._pending_max = pending_max
        self._pending_per_address_max = pending_per_address_max
        self._pending_by_address: dict[str, int] = {}
        self._strangers_pending = 0  # invariant: <= pending_max
        self._peer_addresses: dict[int, str] = {}  # from the peer map (IP literals only)
        self._learned_addresses: dict[int, str] = {}  # where a peer last authenticated from
        self._known: frozenset[str] = frozenset()

    @property
    def pending(self) -> int:
        """Connections admitted and not yet authenticated or closed."""
        return sum(self._pending_by_address.values())

    def set_peers(self, hosts: Mapping[int, str]) -> None:
        """The peer map changed: its IP literals are known; peers no longer in it are not."""
        self._peer_addresses = {
            peer_id: address
            for peer_id, host in hosts.items()
            if (address := normal_address(host)) is not None
        }
        self._learned_addresses = {
            peer_id: address
            for peer_id, address in self._learned_addresses.items()
            if peer_id in hosts
        }
        self._refresh_known()

    def learn(self, peer_id: int, address: str) -> None:
        """Peer `peer_id` (one of the peer map) authenticated from `address`."""
        if self._learned_addresses.get(peer_id) != address:
            self._learned_addresses[peer_id] = address
            self._refresh_known()

    def is_known(self, address: str) -> bool:
        return address in self._known

    def admit(self, address: str) -> PendingSlot | Refusal:
        """A slot for a new connection from `address`, or why there is none."""
        if self._pending_by_address.get(address, 0) >= self._pending_per_address_max:
            return Refusal.ADDRESS_PENDING_FULL
        reserved = address in self._known
        if not reserved:
            if self._strangers_pending >= self._pending_max:
                return Refusal.PENDING_FULL
            self._strangers_pending += 1
        self._pending_by_address[address] = self._pending_by_address.get(address, 0) + 1
        return PendingSlot(address=address, reserved=reserved)

    def release(self, slot: PendingSlot) -> None:
        """The connection authenticated or closed; releasing twice is a no-op."""
        if slot.released:
            return
        slot.released = True
        count = self._pending_by_address[slot.address]
        assert count > 0
        if count == 1:
            del self._pending_by_address[slot.address]
        else:
            self._pending_by_address[slot.address] = count - 1
        if not slot.reserved:
            assert self._strangers_pending > 0
            self._strangers_pending -= 1

    def _refresh_known(self) -> None:
        self._known = frozenset(self._peer_addresses.values()) | frozenset(
            self._learned_addresses.values()
        )
