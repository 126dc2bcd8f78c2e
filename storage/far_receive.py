"""Far-horizon catch-up by stream: check a segment file while it arrives.

The stream path (multiraft/node/catchup_stream.py) receives a leader's closed segment
as raw bytes, in pieces of whatever size the socket gives. `ArrivingSegment` is fed
those pieces in order and checks each frame as soon as it is whole: its CRC, its index
and offset following the one before (parse_frame, the same test every read makes). At
the end (`finish`) the file must have exactly the announced size, no partial frame left,
end at the announced entry and offset, and its CRC (over every byte, as `check_staged`
computes it) must be the one the leader sent after the file and the one its offer
announced, when that one was known. So nothing is read back from disk: what
`check_staged` finds by reading a staged file again, this finds on the way in.

Pure: no I/O, no clock; any thread (one at a time). A frame split over two pieces is
carried over (at most one frame, bounded by FRAME_BYTES_MAX before it is buffered).
"""

from __future__ import annotations

import struct
import zlib

from raftlog.types import Index, Offset
from storage.errors import CorruptionError
from storage.frames import FRAME_BYTES_MAX, FRAME_HEADER_BYTES, FrameInfo, parse_frame
from storage.transfer import SegmentDescriptor

# An offer's CRC for a file whose CRC the leader has not computed yet: the stream sends
# it after the file (no CRC-32 is this large, and a descriptor's fields are u64).
CRC_UNKNOWN = 1 << 32
_LENGTH = struct.Struct(">I")


class ArrivingSegment:
    def __init__(self, descriptor: SegmentDescriptor) -> None:
        assert descriptor.size_bytes > 0 and descriptor.last_index >= descriptor.first_index
        self.descriptor = descriptor
        self.received = 0  # bytes fed so far
        self.crc = 0  # of those bytes
        self.frames: list[FrameInfo] = []
        self._carry = bytearray()  # the start of a frame not whole yet; invariant: < one frame
        self._index = descriptor.first_index  # the next frame's
        self._offset = descriptor.first_offset

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """The file's next bytes; raises CorruptionError at the first frame that is wrong."""
        view = memoryview(data)
        if self.received + len(view) > self.descriptor.size_bytes:
            raise self._error("it runs past its announced size")
        base = self.received  # the file position of view[0]
        self.received += len(view)
        self.crc = zlib.crc32(view, self.crc)
        position = self._complete_carry(view, base)
        while position < len(view):
            parsed = self._parse(view, position)
            if parsed is None:
                break
            info = parsed
            self._accept(info, base)
            position = info.end
        if position < len(view):
            self._carry += view[position:]
            self._check_carry()

    def finish(self, leader_crc: int) -> tuple[FrameInfo, ...]:
        """Everything came: the checks of the whole file. `leader_crc`: the CRC the leader
        sent after the file."""
        descriptor = self.descriptor
        if self.received != descriptor.size_bytes or self._carry:
            raise self._error(f"it ends after {self.received} bytes of {descriptor.size_bytes}, "
                              f"{len(self._carry)} of them a partial frame")
        if self.crc != leader_crc or descriptor.crc not in (CRC_UNKNOWN, self.crc):
            raise self._error("its CRC differs from the leader's")
        if not self.frames or self.frames[-1].index != descriptor.last_index:
            raise self._error(f"it does not end at entry {descriptor.last_index}")
        if self._offset != descriptor.next_offset:
            raise self._error("its offsets differ from the leader's")
        return tuple(self.frames)

    def _complete_carry(self, view: memoryview, base: int) -> int:
        """Take from `view` what the carried frame lacks; parse it once whole. Returns
        where in `view` the next frame starts (len(view) when all of it was carried)."""
        position = 0
        while self._carry and position < len(view):
            if len(self._carry) < _LENGTH.size:
                wanted = _LENGTH.size - len(self._carry)
            else:
                wanted = self._declared() - len(self._carry)
            taken = view[position:position + wanted]
            self._carry += taken
            position += len(taken)
            self._check_carry()
            if len(self._carry) >= _LENGTH.size and len(self._carry) == self._declared():
                frame_at = base + position - len(self._carry)
                parsed = self._parse(memoryview(self._carry), 0)
                assert parsed is not None, "a whole frame parses or raises"
                self._accept(parsed, frame_at)
                self._carry = bytearray()
        return position

    def _declared(self) -> int:
        (length,) = _LENGTH.unpack_from(self._carry)
        return length + _LENGTH.size

    def _check_carry(self) -> None:
        """A lying length is refused before its frame is buffered."""
        if len(self._carry) >= _LENGTH.size:
            declared = self._declared()
            if not FRAME_HEADER_BYTES <= declared <= FRAME_BYTES_MAX:
                raise self._error(f"a frame at {self.received - len(self._carry)} declares {declared} bytes")

    def _parse(self, view: memoryview, position: int) -> FrameInfo | None:
        try:
            parsed = parse_frame(view, position)
        except CorruptionError as error:
            raise self._error(str(error)) from None
        return None if parsed is None else parsed[0]

    def _accept(self, info: FrameInfo, base: int) -> None:
        if info.index != self._index or info.base_offset != self._offset:
            raise self._error(f"entry {info.index} at offset {info.base_offset} follows entry "
                              f"{self._index - 1}: expected entry {self._index} at offset {self._offset}")
        self.frames.append(FrameInfo(info.index, info.term, info.kind, info.base_offset, info.record_count,
                                     info.position + base, info.size_bytes))
        self._index = Index(info.index + 1)
        self._offset = Offset(info.next_offset)

    def _error(self, problem: str) -> CorruptionError:
        return CorruptionError(f"received segment {self.descriptor.first_index}: {problem}")
