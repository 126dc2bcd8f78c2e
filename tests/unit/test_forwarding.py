"""Produce forwarded per leader node (multiraft/node/forwarding.py): the pure parts.

Goal: the batches bound for one node are cut into calls that keep every bound (items
per call, bytes per call; a batch too large to share goes alone) without reordering
or losing any; the request and answer codecs round-trip; a malformed request is
refused as INVALID_REQUEST; a malformed answer is OUTCOME_UNKNOWN for every batch it
should have answered (never a wrong offset); per-batch errors come back typed, with
the one error shape (a NOT_LEADER keeps its hint).
"""

from __future__ import annotations

import json

import pytest

from multiraft.errors import InvalidRequest
from multiraft.node import forwarding
from multiraft.node.acks import Acks
from multiraft.node.forwarding import ForwardItem, PartitionBatch, chunks
from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from raftlog.errors import LeaderNotAvailable, NotLeader, OutcomeUnknown, ProposalDropped
from raftlog.types import GroupId, NodeId


def item(group: int, size: int) -> ForwardItem:
    return ForwardItem(group_id=GroupId(group), batch=bytes([group % 256]) * size)


def wire(items: list[ForwardItem]) -> int:
    return len(forwarding.encode_request(Acks.QUORUM, items))


@pytest.mark.parametrize(
    ("sizes", "body_bytes_max", "items_max", "expected"),
    [
        ([10, 10, 10], 1000, 8, [[0, 1, 2]]),  # all fit: one call
        ([10, 10, 10], 1000, 2, [[0, 1], [2]]),  # the item bound cuts
        ([100, 100, 100], 5 + 2 * 112, 8, [[0, 1], [2]]),  # the byte bound cuts exactly at the limit
        ([100, 100, 100], 5 + 2 * 112 - 1, 8, [[0], [1], [2]]),  # one byte less: one per call
        ([10, 5000, 10], 1000, 8, [[0], [1], [2]]),  # too large to share: alone, neighbours kept in order
        ([5000], 1000, 8, [[0]]),  # a single batch always goes
        ([], 1000, 8, []),
    ],
)
def test_chunks_keep_the_bounds_and_the_order(sizes: list[int], body_bytes_max: int, items_max: int,
                                               expected: list[list[int]]) -> None:
    items = [item(i, size) for i, size in enumerate(sizes)]
    cut = chunks(items, body_bytes_max, items_max)
    assert [[int(i.group_id) for i in chunk] for chunk in cut] == expected
    assert [i for chunk in cut for i in chunk] == items  # nothing lost, nothing reordered
    for chunk in cut:
        assert len(chunk) <= items_max
        if len(chunk) > 1:
            assert wire(chunk) <= body_bytes_max  # what crosses the wire is what was budgeted


def test_the_default_bounds_split_a_request_larger_than_one_frame() -> None:
    # Goal: 3 batches of 7 MiB (21 MiB, more than a frame) become two calls, each within
    # the body bound a single forwarded batch had.
    big = [item(i, 7 * 1024 * 1024) for i in range(3)]
    cut = chunks(big)
    assert [len(chunk) for chunk in cut] == [2, 1]
    assert all(wire(chunk) <= forwarding.FORWARD_BODY_BYTES_MAX for chunk in cut)
    many = [item(i, 1) for i in range(forwarding.FORWARD_ITEMS_MAX + 1)]
    assert [len(chunk) for chunk in chunks(many)] == [forwarding.FORWARD_ITEMS_MAX, 1]


def test_request_round_trips() -> None:
    items = [item(7, 3), item(2**64 - 1, 1), item(0, 100)]
    acks, decoded = forwarding.decode_request(forwarding.encode_request(Acks.ALL, items))
    assert acks is Acks.ALL
    assert decoded == items


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x01",  # shorter than the header
        bytes([9]) + (1).to_bytes(4, "big"),  # unknown acks code
        bytes([1]) + (0).to_bytes(4, "big"),  # no batch
        bytes([1]) + (forwarding.FORWARD_ITEMS_MAX + 1).to_bytes(4, "big"),  # too many
        bytes([1]) + (2).to_bytes(4, "big") + (5).to_bytes(8, "big") + (1).to_bytes(4, "big") + b"x",  # cut short
        bytes([1]) + (1).to_bytes(4, "big") + (5).to_bytes(8, "big") + (9).to_bytes(4, "big") + b"x",  # length past end
        bytes([1]) + (1).to_bytes(4, "big") + (5).to_bytes(8, "big") + (0).to_bytes(4, "big"),  # empty batch
        bytes([1]) + (1).to_bytes(4, "big") + (5).to_bytes(8, "big") + (1).to_bytes(4, "big") + b"xy",  # trailing
    ],
)
def test_a_malformed_request_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        forwarding.decode_request(body)


def test_answer_round_trips_results_and_typed_errors() -> None:
    outcomes = [
        ProduceResult(base_offset=10, count=3, duplicate=False),
        NotLeader(NodeId(2), "moved"),
        ProduceResult(base_offset=NO_OFFSET, count=1, duplicate=False),
        NotLeader(message="nobody"),  # no hint: answered as LEADER_NOT_AVAILABLE, the one shape
        ProposalDropped("inbox full"),
        ProduceResult(base_offset=4, count=2, duplicate=True),
    ]
    decoded = forwarding.decode_answer(forwarding.encode_answer(outcomes), len(outcomes))
    assert decoded[0] == outcomes[0] and decoded[2] == outcomes[2] and decoded[5] == outcomes[5]
    assert isinstance(decoded[1], NotLeader) and decoded[1].leader_hint == 2 and decoded[1].message == "moved"
    assert isinstance(decoded[3], LeaderNotAvailable) and decoded[3].retriable
    assert decoded[4].code == "PROPOSAL_DROPPED" and decoded[4].retriable and decoded[4].http_status == 503


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        json.dumps([{"base_offset": 1, "count": 1, "duplicate": False}]).encode(),  # one outcome for two batches
        json.dumps([{"base_offset": 1, "count": 1, "duplicate": False}, 5]).encode(),
        json.dumps([{"base_offset": 1, "count": 1, "duplicate": False}, {"count": 1}]).encode(),
        json.dumps([{"base_offset": "1", "count": 1, "duplicate": False}] * 2).encode(),
    ],
)
def test_a_malformed_answer_is_outcome_unknown_for_every_batch(body: bytes) -> None:
    decoded = forwarding.decode_answer(body, 2)
    assert len(decoded) == 2
    assert all(isinstance(outcome, OutcomeUnknown) for outcome in decoded)


@pytest.mark.parametrize(("partition", "batch"), [(-1, b"x"), (True, b"x"), (0, b"")])
def test_partition_batch_is_checked_at_the_edge(partition: int, batch: bytes) -> None:
    with pytest.raises(ValueError):
        PartitionBatch(partition=partition, batch=batch)


def test_forward_item_is_checked() -> None:
    with pytest.raises(ValueError):
        ForwardItem(group_id=GroupId(2**64), batch=b"x")
    with pytest.raises(ValueError):
        ForwardItem(group_id=GroupId(1), batch=b"")
