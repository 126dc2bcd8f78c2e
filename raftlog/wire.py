"""Binary codec for Raft messages: what travels between nodes inside transport frames.

Why a hand-written `struct` codec: a peer's bytes must never be able to run code
(no pickle, eval or marshal), every length must be checked before it is trusted,
and the hot path (APPEND with many entries) should stay in C loops where it can.
The transport frame around these bytes carries the group id and a CRC; this
module only knows messages. Layout (big-endian; docs/transport.md has the tables):

    message := header context entry_table payloads [snapshot]
    header (67 bytes): version u8, type u8, flags u8, source u64, target u64,
        term u64, log_term u64, index u64, commit u64, reject_hint u64,
        context_bytes u32, entry_count u32
    entry_table: entry_count x (index u64, term u64, kind u8, payload_bytes u32)
    payloads: the entry payloads, concatenated in table order
    snapshot (when flags has FLAG_SNAPSHOT): index u64, term u64,
        voter_count u32, learner_count u32, has_data u8, data_bytes u32,
        voter ids u64 x voter_count, learner ids u64 x learner_count, data

Entry headers sit in one contiguous table (as the record batch keeps its lengths
in columns) so decoding them is one `iter_unpack`, and the sum of the declared
payload lengths is checked against what is left before any payload is sliced.

Decoding validates structure only (version, enum values, lengths, ids, trailing
bytes) and raises `WireError`; it does not check Raft semantics such as entry
index contiguity, which is the receiver's business.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from raftlog.messages import (
    Entry,
    EntryKind,
    Membership,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import NO_NODE, GroupId, Index, NodeId, Term

__all__ = [
    "HEARTBEAT_CONTEXT_BYTES_MAX",
    "PROTOCOL_VERSION",
    "WireError",
    "decode_heartbeats",
    "decode_message",
    "encode_heartbeats",
    "encode_message",
    "heartbeat_is_compactable",
]

# Bumped on any incompatible change; a peer speaking another version is refused
# frame by frame (compare hashicorp/raft's checkRPCHeader).
PROTOCOL_VERSION = 1

FLAG_REJECT = 0x01
FLAG_TRANSFER = 0x02
FLAG_SNAPSHOT = 0x04
_FLAGS_KNOWN = FLAG_REJECT | FLAG_TRANSFER | FLAG_SNAPSHOT

_HEADER = struct.Struct(">BBBQQQQQQQII")
_ENTRY = struct.Struct(">QQBI")
_SNAPSHOT = struct.Struct(">QQIIBI")
_U64 = 2**64

# Coalesced heartbeats: one frame per peer per tick listing every group's beat.
_HEARTBEATS_HEADER = struct.Struct(">BQQI")  # version, source, target, count
_HEARTBEAT = struct.Struct(">QBBQQH")  # group_id, type, flags, term, commit, context_bytes
# ReadIndex contexts are short opaque ids; a longer one goes in a full message frame.
HEARTBEAT_CONTEXT_BYTES_MAX = 2**16 - 1
_HEARTBEAT_TYPES = (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESPONSE)

_MESSAGE_TYPES = {member.value: member for member in MessageType}
_ENTRY_KINDS = {member.value: member for member in EntryKind}


class WireError(ValueError):
    """Bytes that are not a valid message (decode), or a message that cannot be
    encoded (a field of the wrong type or out of range). An operating condition:
    the transport drops the frame or connection, it never crashes the node."""


# ---------------------------------------------------------------------------- encode


def encode_message(message: Message) -> bytes:
    """The wire bytes of `message`; raises WireError if a field cannot be encoded."""
    context = _require_bytes(message.context, "context")
    flags = _flags(message)
    entries = message.entries
    parts: list[bytes] = [b"", context]
    try:
        parts[0] = _HEADER.pack(
            PROTOCOL_VERSION,
            message.type,
            flags,
            message.source,
            message.target,
            message.term,
            message.log_term,
            message.index,
            message.commit,
            message.reject_hint,
            len(context),
            len(entries),
        )
        pack_entry = _ENTRY.pack
        parts.extend(
            pack_entry(e.index, e.term, e.kind, len(_require_bytes(e.payload, "entry payload")))
            for e in entries
        )
    except struct.error as error:
        raise WireError(f"cannot encode {message.type!r}: {error}") from error
    parts.extend(e.payload for e in entries)
    if message.snapshot is not None:
        parts.extend(_encode_snapshot(message.snapshot))
    return b"".join(parts)


def _flags(message: Message) -> int:
    flags = 0
    if message.reject:
        flags |= FLAG_REJECT
    if message.transfer:
        flags |= FLAG_TRANSFER
    if message.snapshot is not None:
        flags |= FLAG_SNAPSHOT
    return flags


def _encode_snapshot(snapshot: Snapshot) -> list[bytes]:
    if not isinstance(snapshot, Snapshot):
        raise WireError(f"snapshot must be a Snapshot, got {type(snapshot).__name__}")
    data = snapshot.data
    if data is not None and not isinstance(data, bytes):
        raise WireError(
            f"snapshot data must be bytes or None to cross the wire, got {type(data).__name__}"
        )
    meta = snapshot.meta
    voters = sorted(meta.membership.voters)
    learners = sorted(meta.membership.learners)
    try:
        head = _SNAPSHOT.pack(
            meta.index,
            meta.term,
            len(voters),
            len(learners),
            0 if data is None else 1,
            0 if data is None else len(data),
        )
        ids = struct.pack(f">{len(voters) + len(learners)}Q", *voters, *learners)
    except struct.error as error:
        raise WireError(f"cannot encode snapshot: {error}") from error
    return [head, ids, data or b""]


def _require_bytes(value: object, field: str) -> bytes:
    if not isinstance(value, bytes):
        raise WireError(f"{field} must be bytes, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------- decode


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """The message in `data`, which must hold exactly one; raises WireError otherwise."""
    view = _byte_view(data)
    if len(view) < _HEADER.size:
        raise WireError(f"message truncated: {len(view)} bytes, header needs {_HEADER.size}")
    (
        version,
        type_value,
        flags,
        source,
        target,
        term,
        log_term,
        index,
        commit,
        reject_hint,
        context_bytes,
        entry_count,
    ) = _HEADER.unpack_from(view)
    _check_version(version)
    message_type = _MESSAGE_TYPES.get(type_value)
    if message_type is None:
        raise WireError(f"unknown message type {type_value}")
    if flags & ~_FLAGS_KNOWN:
        raise WireError(f"unknown flag bits {flags:#04x}")
    _check_node(source, "source")
    _check_node(target, "target")
    position = _HEADER.size
    context = _take(view, position, context_bytes, "context")
    position += context_bytes
    entries, position = _decode_entries(view, position, entry_count)
    snapshot = None
    if flags & FLAG_SNAPSHOT:
        snapshot, position = _decode_snapshot(view, position)
    if position != len(view):
        raise WireError(f"{len(view) - position} trailing bytes after the message")
    return Message(
        type=message_type,
        source=NodeId(source),
        target=NodeId(target),
        term=Term(term),
        log_term=Term(log_term),
        index=Index(index),
        entries=entries,
        commit=Index(commit),
        reject=bool(flags & FLAG_REJECT),
        reject_hint=Index(reject_hint),
        context=context,
        snapshot=snapshot,
        transfer=bool(flags & FLAG_TRANSFER),
    )


def _decode_entries(
    view: memoryview, position: int, entry_count: int
) -> tuple[tuple[Entry, ...], int]:
    if entry_count == 0:
        return (), position
    table_bytes = entry_count * _ENTRY.size
    if len(view) - position < table_bytes:
        raise WireError(f"entry table truncated: {entry_count} entries declared")
    table = list(_ENTRY.iter_unpack(view[position : position + table_bytes]))
    position += table_bytes
    payloads_bytes = sum(row[3] for row in table)
    if len(view) - position < payloads_bytes:
        raise WireError(f"entry payloads truncated: {payloads_bytes} bytes declared")
    entries = []
    kinds = _ENTRY_KINDS
    for entry_index, entry_term, kind_value, payload_bytes in table:
        kind = kinds.get(kind_value)
        if kind is None:
            raise WireError(f"unknown entry kind {kind_value}")
        end = position + payload_bytes
        entries.append(Entry(entry_index, entry_term, kind, bytes(view[position:end])))
        position = end
    return tuple(entries), position


def _decode_snapshot(view: memoryview, position: int) -> tuple[Snapshot, int]:
    if len(view) - position < _SNAPSHOT.size:
        raise WireError("snapshot header truncated")
    index, term, voter_count, learner_count, has_data, data_bytes = _SNAPSHOT.unpack_from(
        view, position
    )
    position += _SNAPSHOT.size
    if has_data not in (0, 1):
        raise WireError(f"snapshot has_data must be 0 or 1, got {has_data}")
    if not has_data and data_bytes:
        raise WireError("snapshot without data declares data bytes")
    id_count = voter_count + learner_count
    if len(view) - position < id_count * 8 + data_bytes:
        raise WireError("snapshot membership or data truncated")
    ids = struct.unpack_from(f">{id_count}Q", view, position)
    position += id_count * 8
    membership = _membership(ids[:voter_count], ids[voter_count:])
    data = bytes(view[position : position + data_bytes]) if has_data else None
    position += data_bytes
    meta = SnapshotMeta(index=Index(index), term=Term(term), membership=membership)
    return Snapshot(meta=meta, data=data), position


def _membership(voter_ids: Sequence[int], learner_ids: Sequence[int]) -> Membership:
    voters = frozenset(voter_ids)
    learners = frozenset(learner_ids)
    if len(voters) != len(voter_ids) or len(learners) != len(learner_ids):
        raise WireError("duplicate node id in snapshot membership")
    if voters & learners:
        raise WireError("a node is both voter and learner in snapshot membership")
    if NO_NODE in voters or NO_NODE in learners:
        raise WireError("node id 0 in snapshot membership")
    return Membership(voters=voters, learners=learners)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- heartbeats


def heartbeat_is_compactable(message: Message) -> bool:
    """True when `message` fits a coalesced heartbeat frame: a HEARTBEAT or
    HEARTBEAT_RESPONSE using only term, commit, reject and a short context.
    Anything else must travel as a full message (the runtime routes it so)."""
    return (
        message.type in _HEARTBEAT_TYPES
        and not message.entries
        and message.snapshot is None
        and message.log_term == 0
        and message.index == 0
        and message.reject_hint == 0
        and not message.transfer
        and isinstance(message.context, bytes)
        and len(message.context) <= HEARTBEAT_CONTEXT_BYTES_MAX
    )


def encode_heartbeats(beats: Sequence[tuple[GroupId, Message]]) -> bytes:
    """One frame body for every heartbeat (or response) from one node to one peer.

    All messages must share source and target and pass `heartbeat_is_compactable`;
    per group the body costs 28 bytes plus the context, instead of a full message.
    """
    if not beats:
        raise WireError("no heartbeats to encode")
    source, target = beats[0][1].source, beats[0][1].target
    rows: list[bytes] = []
    contexts: list[bytes] = []
    try:
        header = _HEARTBEATS_HEADER.pack(PROTOCOL_VERSION, source, target, len(beats))
        for group_id, message in beats:
            if message.source != source or message.target != target:
                raise WireError("coalesced heartbeats must share one source and one target")
            if not heartbeat_is_compactable(message):
                raise WireError(f"{message.type!r} does not fit a coalesced heartbeat frame")
            flags = FLAG_REJECT if message.reject else 0
            rows.append(
                _HEARTBEAT.pack(
                    group_id,
                    message.type,
                    flags,
                    message.term,
                    message.commit,
                    len(message.context),
                )
            )
            contexts.append(message.context)
    except struct.error as error:
        raise WireError(f"cannot encode heartbeats: {error}") from error
    return b"".join([header, *rows, *contexts])


def decode_heartbeats(data: bytes | bytearray | memoryview) -> list[tuple[GroupId, Message]]:
    """The (group id, message) pairs of a coalesced heartbeat body; WireError if malformed."""
    view = _byte_view(data)
    if len(view) < _HEARTBEATS_HEADER.size:
        raise WireError("heartbeats header truncated")
    version, source, target, count = _HEARTBEATS_HEADER.unpack_from(view)
    _check_version(version)
    _check_node(source, "source")
    _check_node(target, "target")
    if count == 0:
        raise WireError("empty heartbeats frame")
    position = _HEARTBEATS_HEADER.size
    table_bytes = count * _HEARTBEAT.size
    if len(view) - position < table_bytes:
        raise WireError(f"heartbeat table truncated: {count} beats declared")
    table = list(_HEARTBEAT.iter_unpack(view[position : position + table_bytes]))
    position += table_bytes
    if len(view) - position != sum(row[5] for row in table):
        raise WireError("heartbeat contexts do not match the declared lengths")
    return list(_heartbeat_messages(view, position, table, source, target))


def _heartbeat_messages(
    view: memoryview, position: int, table: list[tuple[int, ...]], source: int, target: int
) -> Iterable[tuple[GroupId, Message]]:
    for group_id, type_value, flags, term, commit, context_bytes in table:
        message_type = _MESSAGE_TYPES.get(type_value)
        if message_type not in _HEARTBEAT_TYPES:
            raise WireError(f"message type {type_value} in a heartbeats frame")
        if flags & ~FLAG_REJECT:
            raise WireError(f"unknown heartbeat flag bits {flags:#04x}")
        end = position + context_bytes
        message = Message(
            type=message_type,
            source=NodeId(source),
            target=NodeId(target),
            term=Term(term),
            commit=Index(commit),
            reject=bool(flags & FLAG_REJECT),
            context=bytes(view[position:end]),
        )
        position = end
        yield GroupId(group_id), message


# ---------------------------------------------------------------------------- helpers


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        try:
            view = view.cast("B")
        except TypeError as error:
            raise WireError(f"expected contiguous bytes: {error}") from error
    return view


def _check_version(version: int) -> None:
    if version != PROTOCOL_VERSION:
        raise WireError(
            f"unsupported protocol version {version} (this node speaks {PROTOCOL_VERSION})"
        )


def _check_node(node_id: int, field: str) -> None:
    if node_id == NO_NODE:
        raise WireError(f"{field} node id is 0 (nobody)")


def _take(view: memoryview, position: int, length: int, field: str) -> bytes:
    if len(view) - position < length:
        raise WireError(f"{field} truncated: {length} bytes declared")
    return bytes(view[position : position + length])
