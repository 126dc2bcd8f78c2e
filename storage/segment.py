"""One segment file: frames of consecutive Raft entries, named by the first index.

A segment is open (the last one, appended to) or closed (immutable, fsynced,
catalogued in the database with its size and CRC). The open segment keeps its
raft index -> position table and its offset table in memory: it is rebuilt by
the CRC scan every reopen performs anyway. Closed segments are looked up
through the database.
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from raftlog.messages import EntryKind
from raftlog.types import Index, Offset
from storage.errors import CorruptionError
from storage.files import FileHandle, Files
from storage.frames import FRAME_HEADER_BYTES, FrameCheck, FrameInfo, crc_matches, parse_frame

SUFFIX = ".seg"
PARTIAL_SUFFIX = ".part"
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
CATALOG = struct.Struct(">QQIQQQ")  # last_index, size, crc, first_offset, next_offset, created_ms


_generations = itertools.count(1)


def next_generation() -> int:
    return next(_generations)


def segment_name(first_index: Index) -> str:
    return f"{first_index:020d}{SUFFIX}"


def parse_segment_name(name: str) -> Index | None:
    stem, suffix = os.path.splitext(name)
    if suffix != SUFFIX or len(stem) != 20 or not stem.isdigit():
        return None
    return Index(int(stem))


@dataclass(slots=True)
class Segment:
    first_index: Index
    path: str
    handle: FileHandle
    first_offset: Offset  # offset of the first record stored here (or the next one)
    created_ms: int
    closed: bool = False
    last_index: Index = Index(0)  # first_index - 1 while empty
    next_offset: Offset = Offset(0)
    crc: int | None = None  # crc32 of the whole file once known (None: not computed yet)
    # Unique in the process, and replaced when the store reopens or drops the segment: a
    # read spanning several turns of the loop (a tree sidecar's build, storage/scrub.py)
    # tells the entries it started on from others this object, or this name, holds since.
    generation: int = field(default_factory=lambda: next_generation())
    # Open segment only: positions[i] is where entry first_index + i starts.
    positions: array = field(default_factory=lambda: array("Q"))
    # Open segment only: base offsets of DATA entries, and their raft indexes.
    data_offsets: array = field(default_factory=lambda: array("Q"))
    data_indexes: array = field(default_factory=lambda: array("Q"))

    @property
    def size(self) -> int:
        return self.handle.size

    @property
    def entry_count(self) -> int:
        return self.last_index - self.first_index + 1

    def add_frame(self, info: FrameInfo) -> None:
        """Record a frame just written (or scanned) at the end of the open segment."""
        assert not self.closed, "closed segments are immutable"
        assert info.index == self.last_index + 1, "frames are contiguous"
        assert info.base_offset == self.next_offset, "offsets are contiguous"
        self.positions.append(info.position)
        if info.kind is EntryKind.DATA:
            self.data_offsets.append(info.base_offset)
            self.data_indexes.append(info.index)
        self.last_index = info.index
        self.next_offset = info.next_offset

    def open_position(self, index: Index) -> int:
        assert not self.closed
        assert self.first_index <= index <= self.last_index + 1
        if index == self.last_index + 1:
            return self.size
        return self.positions[index - self.first_index]

    def open_lookup(self, offset: Offset) -> tuple[Index, int] | None:
        """(raft index, position) of the DATA entry holding `offset`, if here."""
        slot = bisect_right(self.data_offsets, offset) - 1
        if slot < 0:
            return None
        index = Index(self.data_indexes[slot])
        return index, self.positions[index - self.first_index]

    def cut(self, files: Files, index: Index, next_offset: Offset) -> None:
        """Drop entries from `index` on (open segment only); the file shrinks."""
        assert not self.closed and self.first_index <= index <= self.last_index + 1
        position = self.open_position(index)
        files.truncate(self.handle, position)
        del self.positions[index - self.first_index :]
        keep = bisect_right(self.data_indexes, index - 1)
        del self.data_indexes[keep:]
        del self.data_offsets[keep:]
        self.last_index = Index(index - 1)
        self.next_offset = next_offset
        self.crc = None

    def catalog_value(self) -> bytes:
        """The catalog record; CRC 0 stands for "not computed yet"."""
        return CATALOG.pack(
            self.last_index, self.size, self.crc or 0, self.first_offset, self.next_offset,
            self.created_ms,
        )  # fmt: skip


def read_frames(
    files: Files, segment: Segment, index: Index, position: int, end: int,
    frame_check: FrameCheck, chunk_bytes: int,
) -> Iterator[tuple[FrameInfo, memoryview]]:
    """Frames of `segment` from entry `index` at `position` up to `end`, in order, read
    `chunk_bytes` at a time, each judged by `frame_check`."""
    while position < end:
        chunk = files.read(segment.handle, position, min(end - position, chunk_bytes))
        buffer, offset = memoryview(chunk), 0
        while True:
            parsed = parse_frame(buffer, offset, frame_check)
            if parsed is None:
                break
            info, payload = parsed
            if info.index != index:
                raise CorruptionError(f"entry {index} is stored as {info.index}")
            yield info, payload
            index, offset = Index(index + 1), info.end
        if offset == 0:  # one frame larger than the chunk
            declared = int.from_bytes(buffer[:4], "big") + 4
            if position + declared > end:
                raise CorruptionError(f"frame of entry {index} runs past its segment")
            buffer = memoryview(files.read(segment.handle, position, declared))
            parsed = parse_frame(buffer, 0, frame_check)
            assert parsed is not None
            yield parsed
            index, offset = Index(index + 1), declared
        position += offset


@dataclass(frozen=True, slots=True)
class ScanResult:
    frames: list[FrameInfo]
    valid_bytes: int  # the prefix that holds whole, valid frames
    crc: int  # crc32 of that prefix
    error: str | None  # why the scan stopped early (None: clean end)
    frame_after_error: bool  # a valid frame follows the bad one: corruption, not a torn tail


def scan_segment(
    files: Files, handle: FileHandle, first_index: Index, frame_check: FrameCheck = crc_matches
) -> ScanResult:
    """Validate every frame (its CRC by `frame_check`), in chunks, and say where the
    valid prefix ends."""
    frames: list[FrameInfo] = []
    position, crc, expected, read_bytes = 0, 0, first_index, SCAN_CHUNK_BYTES
    while position < handle.size:
        chunk = memoryview(files.read(handle, position, read_bytes))
        consumed, error = _scan_chunk(chunk, position, expected, frames, frame_check)
        if consumed:
            crc = zlib.crc32(chunk[:consumed], crc)
            position += consumed
            expected = Index(frames[-1].index + 1)
            read_bytes = SCAN_CHUNK_BYTES
        if error is not None:
            after = _valid_frame_after(files, handle, position, frame_check)
            return ScanResult(frames, position, crc, error, after)
        if consumed == 0:
            whole = _declared_size(chunk)
            if whole <= len(chunk) or position + whole > handle.size:
                return ScanResult(frames, position, crc, "torn frame at the end", False)
            read_bytes = whole  # one frame larger than a chunk
    return ScanResult(frames, position, crc, None, False)


def _scan_chunk(
    chunk: memoryview, base: int, expected: Index, frames: list[FrameInfo], frame_check: FrameCheck
) -> tuple[int, str | None]:
    offset = 0
    while offset < len(chunk):
        try:
            parsed = parse_frame(chunk, offset, frame_check)
        except CorruptionError as error:
            return offset, str(error)
        if parsed is None:
            return offset, None
        info = parsed[0]
        if info.index != expected:
            return offset, f"frame at {base + offset} holds index {info.index}, expected {expected}"
        frames.append(_shift(info, base))
        expected = Index(expected + 1)
        offset = info.end
    return offset, None


def _shift(info: FrameInfo, base: int) -> FrameInfo:
    if base == 0:
        return info
    return FrameInfo(
        info.index, info.term, info.kind, info.base_offset, info.record_count,
        info.position + base, info.size_bytes,
    )  # fmt: skip


def _declared_size(chunk: memoryview) -> int:
    if len(chunk) < 4:
        return 0
    (length,) = struct.unpack_from(">I", chunk)
    return length + 4


def _valid_frame_after(files: Files, handle: FileHandle, position: int, frame_check: FrameCheck) -> bool:
    """Whether a valid frame sits at the bad spot (out of order) or right after the
    bad frame's declared length: then the damage is inside the log (a bit flip),
    not a torn end, and truncating would drop durable entries."""
    declared = _declared_size(memoryview(files.read(handle, position, 4)))
    for candidate in (position, position + declared):
        if candidate + FRAME_HEADER_BYTES > handle.size:
            continue
        try:
            window = memoryview(files.read(handle, candidate, SCAN_CHUNK_BYTES))
            if parse_frame(window, 0, frame_check) is not None:
                return True
        except CorruptionError:
            continue
    return False
