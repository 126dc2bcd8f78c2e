"""ProduceResult: the one answer of `Node.produce`, and its JSON between nodes.

Goal: what a leader sends a forwarding follower comes back equal, and an answer a
peer garbled is refused as OUTCOME_UNKNOWN (the leader accepted the produce, so the
records may be stored), never as a KeyError or a made-up offset.
"""

from __future__ import annotations

import json

import pytest

from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from raftlog.errors import OutcomeUnknown


@pytest.mark.parametrize("result", [
    ProduceResult(base_offset=0, count=1, duplicate=False),
    ProduceResult(base_offset=2**63 - 1, count=500, duplicate=True),
    ProduceResult(base_offset=NO_OFFSET, count=3, duplicate=False),  # acks=none
])
def test_json_round_trip(result: ProduceResult) -> None:
    # Goal: every result the leader can give crosses to the follower unchanged.
    assert ProduceResult.from_json(result.to_json()) == result


def test_fields_a_newer_peer_adds_are_ignored() -> None:
    # Goal: a rolling upgrade may add fields to the answer; the three we read still count.
    body = json.dumps({"base_offset": 7, "count": 2, "duplicate": False, "epoch": 3}).encode()
    assert ProduceResult.from_json(body) == ProduceResult(base_offset=7, count=2, duplicate=False)


@pytest.mark.parametrize("body", [
    b"",
    b"not json",
    b"\xff\xfe",
    b"[0, 1, false]",
    b"null",
    b'{"count": 1, "duplicate": false}',  # a missing field
    b'{"base_offset": 0, "duplicate": false}',
    b'{"base_offset": 0, "count": 1}',
    b'{"base_offset": "0", "count": 1, "duplicate": false}',  # ill-typed
    b'{"base_offset": 0.5, "count": 1, "duplicate": false}',
    b'{"base_offset": true, "count": 1, "duplicate": false}',
    b'{"base_offset": 0, "count": null, "duplicate": false}',
    b'{"base_offset": 0, "count": 1, "duplicate": 1}',
    b'{"base_offset": -2, "count": 1, "duplicate": false}',  # out of range
    b'{"base_offset": 0, "count": 0, "duplicate": false}',
    b'{"base_offset": -1, "count": 1, "duplicate": true}',  # a duplicate has its original offset
    b"[" * 100_000,  # nesting deeper than the parser's recursion limit
])
def test_a_malformed_peer_answer_is_outcome_unknown(body: bytes) -> None:
    # Goal: not JSON, not an object, a field missing, ill-typed or out of range: refused, typed.
    with pytest.raises(OutcomeUnknown) as raised:
        ProduceResult.from_json(body)
    assert raised.value.code == "OUTCOME_UNKNOWN"


def test_construction_checks_its_fields() -> None:
    # Goal: our own code cannot build a result a peer's would be refused for.
    with pytest.raises(TypeError):
        ProduceResult(base_offset=0, count=1, duplicate=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ProduceResult(base_offset=0, count=0, duplicate=False)
    with pytest.raises(ValueError):
        ProduceResult(base_offset=NO_OFFSET, count=1, duplicate=True)


@pytest.mark.asyncio
async def test_a_batch_refused_at_apply_is_an_error_answer_between_nodes() -> None:
    # Goal: a batch the state machine refuses only at apply raises its typed error inside
    # the produce, so the leader answers a forwarding follower with that error; it used to
    # be raised while encoding the answer, outside `answer`, and became INTERNAL.
    from multiraft.errors import OutOfOrderSequence
    from multiraft.node.produce import applied as _applied
    from multiraft.state.partition import ApplyResult
    from multiraft.transport.remote_errors import error_from_body
    from multiraft.transport.rpc import STATUS_OK, answer
    from raftlog.messages import EntryKind
    from raftlog.types import Index, Offset

    refused = ApplyResult(index=Index(5), kind=EntryKind.DATA, count=1, stored_base_offset=Offset(3),
                          error=OutOfOrderSequence(7, 4, 2))

    async def produce_local() -> ProduceResult:
        return _applied(refused)

    status, body = await answer(produce_local(), ProduceResult.to_json)
    assert status != STATUS_OK and error_from_body(body).code == "OUT_OF_ORDER_SEQUENCE"
    stored = ApplyResult(index=Index(6), kind=EntryKind.DATA, count=2, stored_base_offset=Offset(4),
                         base_offset=Offset(4))
    assert _applied(stored) == ProduceResult(base_offset=4, count=2, duplicate=False)
