"""Goal (issue 21): whatever bytes reach a node's raft port, its decoders either decode
them or raise their typed error, and what they accept is bounded by the bytes that
came in: a frame header never admits a body above frame_bytes_max, a Raft message
never holds more payload than it was sent, coalesced heartbeats never more groups
than their bytes can describe. Decoding costs memory and CPU within a bound per
input byte, whatever the bytes declare (`tests.fuzzing.cost`)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from multiraft.transport.frames import (
    FRAME_HEADER_BYTES,
    FrameError,
    FrameTooLarge,
    encode_frame,
    parse_frame_header,
)
from raftlog.messages import Entry, EntryKind, Message, MessageType
from raftlog.types import Index, NodeId, Term
from raftlog.wire import WireError, decode_heartbeats, decode_message, encode_message
from tests.fuzzing import cost, fuzz_examples

FRAME_MAX = 1 << 20
# Memory a decode may allocate per input byte, and in all: payloads are copied once, an
# entry or a heartbeat is a few small objects for the bytes that describe it.
BYTES_PER_INPUT_BYTE = 16
BYTES_FIXED = 64 * 1024
_seed = encode_message(Message(type=MessageType.APPEND, source=NodeId(1), target=NodeId(2), term=Term(3),
                               log_term=Term(2), index=Index(9),
                               entries=(Entry(Index(10), Term(3), EntryKind.DATA, b"payload"),), commit=Index(8)))


def _mutate(data: bytes, at: int, value: int, cut: int) -> bytes:
    at %= len(data)
    changed = data[:at] + bytes([value]) + data[at + 1:]
    return changed[: cut % (len(changed) + 1)]


_message_bytes = st.binary(max_size=512) | st.builds(_mutate, st.just(_seed), st.integers(0, 4096),
                                                       st.integers(0, 255), st.integers(0, 4096))


@settings(max_examples=fuzz_examples(400), deadline=None)
@given(header=st.binary(min_size=FRAME_HEADER_BYTES, max_size=FRAME_HEADER_BYTES))
def test_any_frame_header_parses_within_the_frame_bound_or_raises(header: bytes) -> None:
    spent = cost(lambda: parse_frame_header(header, FRAME_MAX))
    spent.assert_within(input_bytes=len(header), bytes_per_byte=BYTES_PER_INPUT_BYTE, bytes_fixed=BYTES_FIXED)
    if isinstance(spent.outcome, FrameError | FrameTooLarge):
        return
    assert not isinstance(spent.outcome, Exception), repr(spent.outcome)
    parsed = spent.outcome
    assert parsed.body_bytes + FRAME_HEADER_BYTES <= FRAME_MAX


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(frame_type=st.integers(1, 255), group=st.integers(0, 2**64 - 1), body=st.binary(max_size=64))
def test_an_encoded_frame_header_parses_back(frame_type: int, group: int, body: bytes) -> None:
    parsed = parse_frame_header(encode_frame(frame_type, group, body)[:FRAME_HEADER_BYTES], FRAME_MAX)
    assert (parsed.frame_type, parsed.group_id, parsed.body_bytes) == (frame_type, group, len(body))


@settings(max_examples=fuzz_examples(600), deadline=None)
@given(data=_message_bytes)
def test_any_bytes_decode_as_a_message_or_raise_wire_error(data: bytes) -> None:
    spent = cost(lambda: decode_message(data))
    spent.assert_within(input_bytes=len(data), bytes_per_byte=BYTES_PER_INPUT_BYTE, bytes_fixed=BYTES_FIXED)
    if isinstance(spent.outcome, WireError):
        return
    assert not isinstance(spent.outcome, Exception), repr(spent.outcome)
    message = spent.outcome
    assert sum(len(e.payload) for e in message.entries) <= len(data)
    assert len(message.entries) <= len(data)


@settings(max_examples=fuzz_examples(400), deadline=None)
@given(data=st.binary(max_size=512) | st.builds(lambda count, rest: struct.pack(">BQQI", 1, 1, 2, count) + rest,
                                                  st.integers(0, 2**32 - 1), st.binary(max_size=256)))
def test_any_bytes_decode_as_heartbeats_or_raise_wire_error(data: bytes) -> None:
    spent = cost(lambda: decode_heartbeats(data))
    spent.assert_within(input_bytes=len(data), bytes_per_byte=BYTES_PER_INPUT_BYTE, bytes_fixed=BYTES_FIXED)
    if isinstance(spent.outcome, WireError):
        return
    assert not isinstance(spent.outcome, Exception), repr(spent.outcome)
    beats = spent.outcome
    assert len(beats) <= len(data)
