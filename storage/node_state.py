"""Encodings of the per-group node state kept in the state database."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

from raftlog.messages import HardState, Membership, Snapshot, SnapshotMeta
from raftlog.types import Index, NodeId, Offset, Term

_HARD_STATE = struct.Struct(">QQQ")


def encode_hard_state(hard_state: HardState) -> bytes:
    return _HARD_STATE.pack(hard_state.term, hard_state.vote, hard_state.commit)


def decode_hard_state(value: bytes) -> HardState:
    term, vote, commit = _HARD_STATE.unpack(value)
    return HardState(term=Term(term), vote=NodeId(vote), commit=Index(commit))


def _membership_fields(membership: Membership) -> list[list[int]]:
    return [sorted(membership.voters), sorted(membership.learners)]


def _membership(voters: list[int], learners: list[int]) -> Membership:
    return Membership(
        voters=frozenset(NodeId(v) for v in voters), learners=frozenset(NodeId(n) for n in learners)
    )


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where the retained log begins: the snapshot point and the log start offset.

    `next_offset` is the offset of the first record after `snapshot.meta.index`.
    """

    snapshot: Snapshot
    next_offset: Offset


def encode_start(start: StartPoint) -> bytes:
    meta = start.snapshot.meta
    # Only bytes are persisted; other data (the simulator's objects) lives in memory only.
    data = start.snapshot.data if isinstance(start.snapshot.data, bytes) else None
    fields = [meta.index, meta.term, start.next_offset, *_membership_fields(meta.membership), data]
    return msgpack.packb(fields, use_bin_type=True)


def decode_start(value: bytes) -> StartPoint:
    index, term, next_offset, voters, learners, data = msgpack.unpackb(value)
    meta = SnapshotMeta(
        index=Index(index), term=Term(term), membership=_membership(voters, learners)
    )
    return StartPoint(snapshot=Snapshot(meta=meta, data=data), next_offset=Offset(next_offset))


def encode_applied(applied: Index, membership: Membership) -> bytes:
    return msgpack.packb([applied, *_membership_fields(membership)])


def decode_applied(value: bytes) -> tuple[Index, Membership]:
    applied, voters, learners = msgpack.unpackb(value)
    return Index(applied), _membership(voters, learners)
