"""Transport frames: the unit a node sends to a peer over its one TCP connection.

    frame := length u32 | crc32 u32 | frame_type u8 | group_id u64 | body
    length counts everything after itself (13 + len(body)); the CRC (zlib CRC-32)
    covers frame_type, group_id and body.

Why a length first: the reader learns the size before it reads anything else, so
a declared size above `frame_bytes_max` is refused without reading (or buffering)
a byte of the body. Why a CRC although TCP has checksums: TCP's 16-bit sum lets
real corruption through now and then, and a bug on either side that misframes
the stream is caught at the first frame rather than deep inside a decoder.

The transport treats `frame_type` and `body` as opaque; the runtime gives them
meaning (`FrameType` lists the ones it uses so far) and decodes bodies with
`raftlog.wire`.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "FRAME_HEADER_BYTES",
    "FrameError",
    "FrameHeader",
    "FrameTooLarge",
    "FrameType",
    "TransportError",
    "check_frame_crc",
    "encode_frame",
    "encode_frame_header",
    "frame_bytes",
    "parse_frame_header",
]

_HEADER = struct.Struct(">IIBQ")
_TYPE_GROUP = struct.Struct(">BQ")
FRAME_HEADER_BYTES = _HEADER.size  # 17
_LENGTH_BYTES = 4
_COUNTED_HEADER_BYTES = FRAME_HEADER_BYTES - _LENGTH_BYTES  # crc, type, group: 13
GROUP_ID_MAX = 2**64 - 1


class FrameType(enum.IntEnum):
    """Every frame type id, in one place. 0 is never valid (a zeroed stream is an error);
    values not listed here are passed through for the runtime to judge (and dropped)."""

    RAFT_MESSAGE = 1  # body: raftlog.wire.encode_message; group_id: the message's group
    HEARTBEATS = 2  # body: raftlog.wire.encode_heartbeats; group_id 0 (groups are inside)
    RPC_REQUEST = 3  # body: multiraft.transport.rpc request (request id, method, payload)
    RPC_RESPONSE = 4  # body: multiraft.transport.rpc response (request id, status, payload)
    PING = 5  # body: node-level liveness (multiraft/runtime/liveness.py); group_id 0
    QUIESCE = 6  # body: group id, term, log end index (a leader asks a member to go quiet)


class TransportError(Exception):
    """An operating condition of the transport (bad peer input, refused handshake)."""


class FrameError(TransportError):
    """A frame that breaks the format: the connection it came on is dropped."""


class FrameTooLarge(TransportError):
    """A frame larger than `frame_bytes_max`; the sender must split its payload."""

    def __init__(self, frame_bytes: int, frame_bytes_max: int) -> None:
        super().__init__(f"frame of {frame_bytes} bytes exceeds frame_bytes_max={frame_bytes_max}")
        self.frame_bytes = frame_bytes
        self.frame_bytes_max = frame_bytes_max


@dataclass(frozen=True, slots=True)
class FrameHeader:
    body_bytes: int
    crc: int
    frame_type: int
    group_id: int


def frame_bytes(body_bytes: int) -> int:
    """The size of a whole frame (length field included) for a body of `body_bytes`."""
    return FRAME_HEADER_BYTES + body_bytes


def encode_frame_header(frame_type: int, group_id: int, body: bytes) -> bytes:
    """The 17 header bytes that precede `body` (kept apart so a writer joins once)."""
    assert 1 <= frame_type <= 255, frame_type
    assert 0 <= group_id <= GROUP_ID_MAX, group_id
    type_group = _TYPE_GROUP.pack(frame_type, group_id)
    crc = zlib.crc32(body, zlib.crc32(type_group))
    return _HEADER.pack(_COUNTED_HEADER_BYTES + len(body), crc, frame_type, group_id)


def encode_frame(frame_type: int, group_id: int, body: bytes) -> bytes:
    return encode_frame_header(frame_type, group_id, body) + body


def parse_frame_header(header: bytes | memoryview, frame_bytes_max: int) -> FrameHeader:
    """Validate a frame header read off the wire, before its body is read."""
    assert len(header) == FRAME_HEADER_BYTES
    length, crc, frame_type, group_id = _HEADER.unpack(header)
    if length < _COUNTED_HEADER_BYTES:
        raise FrameError(f"declared frame length {length} is below the header size")
    if length + _LENGTH_BYTES > frame_bytes_max:
        raise FrameTooLarge(length + _LENGTH_BYTES, frame_bytes_max)
    if frame_type == 0:
        raise FrameError("frame type 0")
    return FrameHeader(
        body_bytes=length - _COUNTED_HEADER_BYTES,
        crc=crc,
        frame_type=frame_type,
        group_id=group_id,
    )


def check_frame_crc(header: FrameHeader, body: bytes) -> None:
    type_group = _TYPE_GROUP.pack(header.frame_type, header.group_id)
    if zlib.crc32(body, zlib.crc32(type_group)) != header.crc:
        raise FrameError("frame CRC mismatch")
