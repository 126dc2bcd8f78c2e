"""Goal: the bookkeeping of pending inbound connections (multiraft/transport/inbound_admission.py)
keeps strangers within their pool and per-address share, keeps known peers' addresses
out of the strangers' pool, and gives every slot back exactly once."""

from __future__ import annotations

import pytest

from multiraft.transport.inbound_admission import (
    InboundAdmission,
    PendingSlot,
    Refusal,
    normal_address,
)


def _admission() -> InboundAdmission:
    admission = InboundAdmission(pending_max=3, pending_per_address_max=2)
    admission.set_peers({2: "10.0.0.2", 3: "node3.example"})
    return admission


def _slot(admitted: PendingSlot | Refusal) -> PendingSlot:
    assert isinstance(admitted, PendingSlot), admitted
    return admitted


# Goal: strangers share one pool; one address gets at most its share of it.
def test_strangers_pool_and_per_address_share() -> None:
    admission = _admission()
    _slot(admission.admit("10.9.0.1"))
    _slot(admission.admit("10.9.0.1"))
    assert admission.admit("10.9.0.1") is Refusal.ADDRESS_PENDING_FULL
    _slot(admission.admit("10.9.0.2"))
    assert admission.admit("10.9.0.3") is Refusal.PENDING_FULL
    assert admission.pending == 3


# Goal: a known peer's address is admitted with the strangers' pool full, within its
# own per-address share, and its slots do not free strangers' places.
def test_known_peer_address_is_outside_the_pool() -> None:
    admission = _admission()
    strangers = [_slot(admission.admit(f"10.9.0.{i}")) for i in range(3)]
    peer = _slot(admission.admit("10.0.0.2"))
    assert peer.reserved
    _slot(admission.admit("10.0.0.2"))
    assert admission.admit("10.0.0.2") is Refusal.ADDRESS_PENDING_FULL
    admission.release(peer)
    assert admission.admit("10.9.0.9") is Refusal.PENDING_FULL
    admission.release(strangers[0])
    _slot(admission.admit("10.9.0.9"))


# Goal: a peer named by a host name becomes known at the address it authenticated
# from, and stops being known when it leaves the peer map.
def test_learned_address_follows_the_peer_map() -> None:
    admission = _admission()
    assert not admission.is_known("10.0.0.3")
    admission.learn(3, "10.0.0.3")
    assert admission.is_known("10.0.0.3")
    admission.set_peers({2: "10.0.0.2"})
    assert not admission.is_known("10.0.0.3")
    assert admission.is_known("10.0.0.2")


# Goal: releasing twice gives the slot back once (the transport releases on
# authentication and again when the connection ends).
def test_release_is_idempotent() -> None:
    admission = _admission()
    slot = _slot(admission.admit("10.9.0.1"))
    other = _slot(admission.admit("10.9.0.1"))
    admission.release(slot)
    admission.release(slot)
    assert admission.pending == 1
    admission.release(other)
    assert admission.pending == 0


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:127.0.0.2", "127.0.0.2"),
        ("::1", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("node1.example", None),
        (None, None),
    ],
)
def test_normal_address(host: object, expected: str | None) -> None:
    assert normal_address(host) == expected
