"""Wire codec: every message round trips; malformed bytes raise WireError, never crash."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.messages import (
    Entry,
    EntryKind,
    Membership,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import GroupId, Index, NodeId, Term
from raftlog.wire import (
    PROTOCOL_VERSION,
    WireError,
    decode_heartbeats,
    decode_message,
    encode_heartbeats,
    encode_message,
    heartbeat_is_compactable,
)

_U64 = st.integers(0, 2**64 - 1)
_NODE = st.integers(1, 2**64 - 1)

_entries = st.lists(
    st.builds(
        Entry,
        index=_U64,
        term=_U64,
        kind=st.sampled_from(list(EntryKind)),
        payload=st.binary(max_size=64),
    ),
    max_size=8,
).map(tuple)


@st.composite
def _memberships(draw: st.DrawFn) -> Membership:
    ids = draw(st.lists(_NODE, unique=True, max_size=7))
    split = draw(st.integers(0, len(ids)))
    return Membership(voters=frozenset(ids[:split]), learners=frozenset(ids[split:]))


_snapshots = st.builds(
    Snapshot,
    meta=st.builds(SnapshotMeta, index=_U64, term=_U64, membership=_memberships()),
    data=st.none() | st.binary(max_size=128),
)

_messages = st.builds(
    Message,
    type=st.sampled_from(list(MessageType)),
    source=_NODE,
    target=_NODE,
    term=_U64,
    log_term=_U64,
    index=_U64,
    entries=_entries,
    commit=_U64,
    reject=st.booleans(),
    reject_hint=_U64,
    context=st.binary(max_size=32),
    snapshot=st.none() | _snapshots,
    transfer=st.booleans(),
)


def _append(entry_count: int = 3) -> Message:
    entries = tuple(
        Entry(Index(10 + i), Term(2), EntryKind.DATA, bytes([i]) * (i + 1))
        for i in range(entry_count)
    )
    return Message(
        type=MessageType.APPEND,
        source=NodeId(1),
        target=NodeId(2),
        term=Term(2),
        log_term=Term(2),
        index=Index(9),
        entries=entries,
        commit=Index(8),
    )


def _snapshot_message(data: object = b"state") -> Message:
    meta = SnapshotMeta(
        index=Index(50),
        term=Term(3),
        membership=Membership(voters=frozenset({NodeId(1), NodeId(2)}), learners=frozenset()),
    )
    return Message(
        type=MessageType.SNAPSHOT,
        source=NodeId(1),
        target=NodeId(3),
        term=Term(3),
        snapshot=Snapshot(meta=meta, data=data),
    )


# Goal: any message, of every type and with every field set, decodes to itself.
@settings(max_examples=400, deadline=None)
@given(message=_messages)
def test_round_trip_any_message(message: Message) -> None:
    encoded = encode_message(message)
    assert encoded[0] == PROTOCOL_VERSION
    assert decode_message(encoded) == message
    assert decode_message(memoryview(encoded)) == message
    assert decode_message(bytearray(encoded)) == message


# Goal: each MessageType is covered explicitly, not only by chance in the property test.
@pytest.mark.parametrize("message_type", list(MessageType))
def test_round_trip_each_type(message_type: MessageType) -> None:
    message = Message(type=message_type, source=NodeId(4), target=NodeId(5), term=Term(7))
    assert decode_message(encode_message(message)) == message


# Goal: a memoryview slice into a larger buffer (what the transport hands over) decodes.
def test_decode_from_a_slice_of_a_larger_buffer() -> None:
    encoded = encode_message(_append())
    buffer = b"\xff" * 5 + encoded + b"\xee" * 3
    assert decode_message(memoryview(buffer)[5 : 5 + len(encoded)]) == _append()


# Goal: snapshot data that is not bytes is refused with an error naming the type.
@pytest.mark.parametrize("data", [{"state": 1}, "text", 42, bytearray(b"x")])
def test_snapshot_data_must_be_bytes_or_none(data: object) -> None:
    with pytest.raises(WireError, match="snapshot data must be bytes or None"):
        encode_message(_snapshot_message(data))


# Goal: fields that do not fit the format are refused on encode, not silently mangled.
def test_encode_rejects_out_of_range_and_wrong_types() -> None:
    with pytest.raises(WireError):
        encode_message(
            Message(type=MessageType.VOTE, source=NodeId(1), target=NodeId(2), term=Term(2**64))
        )
    bad_payload = Entry(Index(1), Term(1), EntryKind.DATA, "text")  # type: ignore[arg-type]
    with pytest.raises(WireError, match="entry payload must be bytes"):
        encode_message(
            Message(
                type=MessageType.APPEND,
                source=NodeId(1),
                target=NodeId(2),
                term=Term(1),
                entries=(bad_payload,),
            )
        )


# Goal: every strict prefix of a valid encoding is rejected (truncation is always caught).
@pytest.mark.parametrize("message", [_append(), _snapshot_message(), _snapshot_message(None)])
def test_every_truncation_raises(message: Message) -> None:
    encoded = encode_message(message)
    for cut in range(len(encoded)):
        with pytest.raises(WireError):
            decode_message(encoded[:cut])


# Goal: trailing bytes after a complete message are an error, not ignored.
def test_trailing_bytes_raise() -> None:
    with pytest.raises(WireError, match="trailing"):
        decode_message(encode_message(_append()) + b"\x00")


def _patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    buffer = bytearray(data)
    struct.pack_into(fmt, buffer, offset, value)
    return bytes(buffer)


# Header offsets: version 0, type 1, flags 2, source 3, target 11, ..., context_bytes 59,
# entry_count 63; the entry table starts at 67 (+ context) with kind at +16.
@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (0, ">B", 2, "protocol version"),
        (1, ">B", 0, "unknown message type"),
        (1, ">B", 200, "unknown message type"),
        (2, ">B", 0x80, "flag bits"),
        (3, ">Q", 0, "source node id is 0"),
        (11, ">Q", 0, "target node id is 0"),
        (59, ">I", 2**32 - 1, "context truncated"),
        (63, ">I", 2**32 - 1, "entry table truncated"),
        (67 + 16, ">B", 9, "unknown entry kind"),
        (67 + 17, ">I", 2**31, "payloads truncated"),
    ],
)
def test_corrupted_fields_raise(offset: int, fmt: str, value: int, match: str) -> None:
    encoded = encode_message(_append())
    with pytest.raises(WireError, match=match):
        decode_message(_patched(encoded, offset, fmt, value))


# Goal: a snapshot whose membership is inconsistent is rejected before Membership asserts.
def test_corrupted_snapshot_membership_raises() -> None:
    encoded = encode_message(_snapshot_message())
    snapshot_at = 67  # no context, no entries
    ids_at = snapshot_at + 8 + 8 + 4 + 4 + 1 + 4
    with pytest.raises(WireError, match="duplicate"):
        decode_message(_patched(encoded, ids_at + 8, ">Q", 1))
    with pytest.raises(WireError, match="node id 0"):
        decode_message(_patched(encoded, ids_at, ">Q", 0))
    with pytest.raises(WireError, match="has_data"):
        decode_message(_patched(encoded, snapshot_at + 24, ">B", 7))


# Goal: arbitrary bytes never raise anything but WireError (no AssertionError, no struct.error).
@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=200))
def test_garbage_raises_only_wire_error(garbage: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_message(garbage)
    with contextlib.suppress(WireError):
        decode_heartbeats(garbage)


# Goal: single-byte flips of a valid encoding either decode to a message or raise WireError.
def test_bit_flips_raise_only_wire_error() -> None:
    encoded = encode_message(_snapshot_message())
    for position in range(len(encoded)):
        flipped = bytearray(encoded)
        flipped[position] ^= 0xFF
        with contextlib.suppress(WireError):
            decode_message(bytes(flipped))


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(WireError):
        decode_message("text")  # type: ignore[arg-type]


# -------------------------------------------------------------------- coalesced heartbeats

_beats = st.lists(
    st.tuples(
        _U64,
        st.builds(
            Message,
            type=st.sampled_from([MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESPONSE]),
            source=st.just(NodeId(3)),
            target=st.just(NodeId(8)),
            term=_U64,
            commit=_U64,
            reject=st.booleans(),
            context=st.binary(max_size=16),
        ),
    ),
    min_size=1,
    max_size=50,
)


# Goal: coalesced heartbeats for many groups round trip, group ids and order kept.
@settings(max_examples=200, deadline=None)
@given(beats=_beats)
def test_heartbeats_round_trip(beats: list[tuple[GroupId, Message]]) -> None:
    assert decode_heartbeats(encode_heartbeats(beats)) == beats


# Goal: the compact form is much smaller than one full message per group.
def test_heartbeats_are_compact() -> None:
    beats = [
        (
            GroupId(g),
            Message(
                type=MessageType.HEARTBEAT,
                source=NodeId(1),
                target=NodeId(2),
                term=Term(5),
                commit=Index(g),
            ),
        )
        for g in range(1000)
    ]
    compact = len(encode_heartbeats(beats))
    full = sum(len(encode_message(m)) + 8 for _, m in beats)
    assert compact == 21 + 28 * 1000
    assert compact * 2 < full


# Goal: what the compact form cannot carry is refused, and the predicate says so up front.
def test_heartbeats_refuse_what_they_cannot_carry() -> None:
    vote = Message(type=MessageType.VOTE, source=NodeId(1), target=NodeId(2), term=Term(1))
    assert not heartbeat_is_compactable(vote)
    with pytest.raises(WireError, match="does not fit"):
        encode_heartbeats([(GroupId(1), vote)])
    beat = Message(type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(2), term=Term(1))
    other = Message(type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(3), term=Term(1))
    with pytest.raises(WireError, match="share one source"):
        encode_heartbeats([(GroupId(1), beat), (GroupId(2), other)])
    with pytest.raises(WireError, match="no heartbeats"):
        encode_heartbeats([])
    long_context = Message(
        type=MessageType.HEARTBEAT,
        source=NodeId(1),
        target=NodeId(2),
        term=Term(1),
        context=b"x" * 70_000,
    )
    assert not heartbeat_is_compactable(long_context)


# Goal: heartbeat frames are validated as strictly as messages.
def test_heartbeats_corruption_raises() -> None:
    beat = Message(
        type=MessageType.HEARTBEAT, source=NodeId(1), target=NodeId(2), term=Term(1), context=b"c"
    )
    encoded = encode_heartbeats([(GroupId(7), beat), (GroupId(9), beat)])
    for cut in range(len(encoded)):
        with pytest.raises(WireError):
            decode_heartbeats(encoded[:cut])
    with pytest.raises(WireError):
        decode_heartbeats(encoded + b"x")
    header = 21
    with pytest.raises(WireError, match="message type"):
        decode_heartbeats(_patched(encoded, header + 8, ">B", int(MessageType.APPEND)))
    with pytest.raises(WireError, match="flag bits"):
        decode_heartbeats(_patched(encoded, header + 9, ">B", 0x02))
    with pytest.raises(WireError, match="empty"):
        decode_heartbeats(_patched(encoded[:header], 17, ">I", 0))
    with pytest.raises(WireError, match="protocol version"):
        decode_heartbeats(_patched(encoded, 0, ">B", 9))


# Goal: a sanity run of a large APPEND (1,000 entries of 1 KiB) round trips; no timing asserted.
def test_large_append_round_trips() -> None:
    entries = tuple(Entry(Index(i + 1), Term(1), EntryKind.DATA, b"r" * 1024) for i in range(1000))
    message = Message(
        type=MessageType.APPEND,
        source=NodeId(1),
        target=NodeId(2),
        term=Term(1),
        entries=entries,
    )
    assert decode_message(encode_message(message)) == message
