"""Goal: the HTTP connection bookkeeping (multiraft/http/connections.py) admits within
both bounds, counts each refusal by reason, gives slots back, and inconsistent
limits are refused when built."""

from __future__ import annotations

import pytest

from multiraft.http.connections import ConnectionGate, Refusal
from multiraft.http.limits import ConnectionLimits


# Goal: one address gets its share; all addresses together get the total; a closed
# connection's slot is free again.
def test_gate_admits_within_both_bounds_and_releases() -> None:
    gate = ConnectionGate(ConnectionLimits(connections_max=3, connections_per_address_max=2))
    assert gate.admit("10.0.0.1") is None
    assert gate.admit("10.0.0.1") is None
    assert gate.admit("10.0.0.1") is Refusal.ADDRESS_FULL
    assert gate.admit("10.0.0.2") is None
    assert gate.admit("10.0.0.3") is Refusal.CONNECTIONS_FULL
    gate.release("10.0.0.1")
    assert gate.admit("10.0.0.3") is None
    stats = gate.stats()
    assert stats.open == 3
    assert stats.refused_by_reason == {"address_full": 1, "connections_full": 1}


@pytest.mark.parametrize(
    "fields",
    [
        {"connections_max": 0},
        {"connections_max": 2, "connections_per_address_max": 3},
        {"header_read_timeout_s": 0},
        {"write_stall_timeout_s": -1},
        {"keepalive_timeout_s": 0},
    ],
)
def test_limits_validation(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConnectionLimits(**fields)  # type: ignore[arg-type]
