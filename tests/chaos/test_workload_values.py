"""Goal: a polled record whose value is not UTF-8 (the server sends it as `value_b64`)
becomes a marked value for the checker, not a crash of the poller. Found by the
skip-crc control once bitflips landed in record bytes (seed 42)."""

from __future__ import annotations

from chaos.workload import value_of


def test_a_value_sent_as_base64_is_kept_marked() -> None:
    # The checker takes values as opaque strings: a marked one is a value nobody sent
    # (`unexpected`, tests/chaos/test_checker.py::test_unexpected).
    assert value_of({"offset": 3, "value": "w1-7"}) == "w1-7"
    assert value_of({"offset": 3, "value_b64": "/w=="}) == "b64:/w=="
