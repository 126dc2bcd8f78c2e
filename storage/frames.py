"""Entry frames: how one Raft entry sits in a segment file and on the wire.

    length u32   bytes after this field (crc + body)
    crc32  u32   over the body (everything after the crc)
    index  u64, term u64, kind u8, reserved u8 (0),
    base_offset u64, record_count u32, payload

`base_offset` is the logical offset of the entry's first record (for entries
that are not DATA: the next offset, with `record_count` 0). A follower stores
the frames it receives byte for byte, after `validate_frames` checked them.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset, Term
from storage.batch import BATCH_BYTES_MAX, check_stored_batch, read_header
from storage.errors import CorruptionError, InvalidBatchError

FRAME_HEADER = struct.Struct(">IIQQBBQI")
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 38
_LENGTH_BYTES = 4
_BODY_START = 8  # after length and crc
_BODY_HEADER = struct.Struct(">QQBBQI")
FRAME_BYTES_MAX = BATCH_BYTES_MAX + FRAME_HEADER_BYTES
# Indexed by the kind byte: cheaper than calling the enum per frame on the read path.
_KINDS = tuple(EntryKind(value) for value in range(len(EntryKind)))


# Whether a whole frame's body (everything after its CRC field) matches the CRC its
# header stores: `check(body, stored_crc)`. Chosen once, by whoever opens the store,
# and passed down to every parse; `crc_matches` unless a caller injects another.
FrameCheck = Callable[[memoryview, int], bool]


def crc_matches(body: memoryview, crc: int) -> bool:
    """The frame check: the body's crc32 is the stored one."""
    return zlib.crc32(body) == crc


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Where one frame sits and what it holds, without its payload."""

    index: Index
    term: Term
    kind: EntryKind
    base_offset: Offset
    record_count: int
    position: int  # of the frame's first byte in its segment (or buffer)
    size_bytes: int  # whole frame, header included

    @property
    def end(self) -> int:
        return self.position + self.size_bytes

    @property
    def next_offset(self) -> Offset:
        return Offset(self.base_offset + self.record_count)


def record_count_of(entry: Entry) -> int:
    """Records an entry adds to the logical log: the batch's count for DATA, else 0."""
    if entry.kind is not EntryKind.DATA:
        return 0
    return read_header(entry.payload).record_count


def encode_frame(entry: Entry, base_offset: Offset, record_count: int) -> tuple[bytes, bytes]:
    """Header and payload as two buffers, so `writev` stores the payload without a copy."""
    body = _BODY_HEADER.pack(entry.index, entry.term, entry.kind, 0, base_offset, record_count)
    crc = zlib.crc32(entry.payload, zlib.crc32(body))
    length = FRAME_HEADER_BYTES - _LENGTH_BYTES + len(entry.payload)
    return struct.pack(">II", length, crc) + body, entry.payload


def parse_frame(
    buffer: memoryview, position: int, frame_check: FrameCheck = crc_matches
) -> tuple[FrameInfo, memoryview] | None:
    """The frame at `position`, or None if the buffer ends inside it.

    Raises `CorruptionError` when the frame is whole but wrong: bad CRC, lying
    length, unknown kind (`frame_check` judges the CRC). Both checks are C-speed
    (struct, zlib.crc32).
    """
    if position + FRAME_HEADER_BYTES > len(buffer):
        return None
    length, crc, index, term, kind, reserved, base_offset, count = FRAME_HEADER.unpack_from(
        buffer, position
    )
    size = length + _LENGTH_BYTES
    if size < FRAME_HEADER_BYTES or size > FRAME_BYTES_MAX:
        raise CorruptionError(f"frame at {position} declares an impossible length {length}")
    if position + size > len(buffer):
        return None
    body = buffer[position + _BODY_START : position + size]
    if not frame_check(body, crc):
        raise CorruptionError(f"frame at {position} fails its CRC")
    if kind >= len(_KINDS) or reserved != 0:
        raise CorruptionError(f"frame at {position} has unknown kind {kind}")
    info = FrameInfo(index, term, _KINDS[kind], base_offset, count, position, size)
    return info, buffer[position + FRAME_HEADER_BYTES : position + size]


def frame_to_entry(info: FrameInfo, payload: memoryview) -> Entry:
    return Entry(index=info.index, term=info.term, kind=info.kind, payload=payload.tobytes())


def validate_frames(data: bytes, first_index: Index, next_offset: Offset) -> list[FrameInfo]:
    """Check frames received from a leader before they are stored as they are.

    Rejects (InvalidBatchError) a bad CRC, a lying length, a truncated frame, a
    gap in indexes or offsets, and a DATA payload that is not a valid batch of
    the declared record count.
    """
    buffer = memoryview(data)
    frames: list[FrameInfo] = []
    position = 0
    expected_index, expected_offset = first_index, next_offset
    while position < len(buffer):
        try:
            parsed = parse_frame(buffer, position)
        except CorruptionError as error:
            raise InvalidBatchError(str(error)) from None
        if parsed is None:
            raise InvalidBatchError(f"frame at {position} is truncated")
        info, payload = parsed
        if info.index != expected_index or info.base_offset != expected_offset:
            raise InvalidBatchError(f"frame at {position} is not contiguous with the log")
        if info.kind is EntryKind.DATA:
            if check_stored_batch(payload).record_count != info.record_count:
                raise InvalidBatchError(f"frame at {position} miscounts its records")
        elif info.record_count != 0:
            raise InvalidBatchError(f"frame at {position} counts records outside DATA")
        frames.append(info)
        expected_index, expected_offset = Index(info.index + 1), info.next_offset
        position = info.end
    return frames
