"""storage/far_receive.py: a segment checked while it arrives, in pieces of any size.

Goal: `ArrivingSegment` finds what `check_staged` finds by reading a staged file back
(the same frames, positions and CRC), whatever the pieces' sizes, and refuses the same
damage: a flipped byte (a frame's CRC), a lying length (before buffering it), a gap in
indexes or offsets, a short or long file, another CRC than the leader's or the offer's.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest

from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset, Term
from storage.errors import CorruptionError
from storage.far_install import check_staged
from storage.far_receive import CRC_UNKNOWN, ArrivingSegment
from storage.frames import encode_frame
from storage.transfer import SegmentDescriptor


def _segment(first: int = 5, count: int = 40, first_offset: int = 100, seed: int = 1) -> tuple[bytes, SegmentDescriptor]:
    """A segment's bytes: DATA frames of varied sizes (one larger than most pieces), and a
    non-DATA frame (no records) in the middle."""
    rng = random.Random(seed)
    parts, offset = [], first_offset
    for index in range(first, first + count):
        kind = EntryKind.DATA if index != first + count // 2 else EntryKind.NOOP
        payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 7, 300, 5000, 70_000)))) \
            if kind is EntryKind.DATA else b""
        records = 0 if kind is not EntryKind.DATA else 1 + index % 3
        header, body = encode_frame(Entry(index=Index(index), term=Term(2), kind=kind, payload=payload),
                                    Offset(offset), records)
        parts += (header, body)
        offset += records
    data = b"".join(parts)
    return data, SegmentDescriptor(Index(first), Index(first + count - 1), len(data), zlib.crc32(data),
                                   Offset(first_offset), Offset(offset))


def _feed(descriptor: SegmentDescriptor, data: bytes, sizes: list[int]) -> ArrivingSegment:
    arriving = ArrivingSegment(descriptor)
    position = 0
    for size in sizes:
        arriving.feed(data[position:position + size])
        position += size
    arriving.feed(data[position:])
    return arriving


@pytest.mark.parametrize("piece", [1, 3, 4, 37, 38, 39, 1000, 65_536, 1 << 20])
def test_any_pieces_give_the_frames_and_crc_a_read_back_finds(tmp_path: Path, piece: int) -> None:
    data, descriptor = _segment()
    path = tmp_path / "segment"
    path.write_bytes(data)
    expected = check_staged(str(path), descriptor)
    sizes = [piece] * (len(data) // piece)
    arriving = _feed(descriptor, data, sizes)
    assert arriving.finish(descriptor.crc) == expected.frames
    assert arriving.crc == expected.crc == descriptor.crc


def test_random_pieces() -> None:
    data, descriptor = _segment(seed=7)
    rng = random.Random(3)
    for _ in range(20):
        sizes, total = [], 0
        while total < len(data):
            sizes.append(rng.choice((1, 2, 5, 40, 999, 70_000)))
            total += sizes[-1]
        arriving = ArrivingSegment(descriptor)
        position = 0
        for size in sizes:
            arriving.feed(data[position:position + size])
            position += size
        assert len(arriving.finish(descriptor.crc)) == 40


def test_an_unknown_crc_in_the_offer_is_the_leaders_sent_after() -> None:
    data, descriptor = _segment()
    unknown = SegmentDescriptor(descriptor.first_index, descriptor.last_index, descriptor.size_bytes, CRC_UNKNOWN,
                                descriptor.first_offset, descriptor.next_offset)
    assert len(_feed(unknown, data, [4096] * 10).finish(descriptor.crc)) == 40
    with pytest.raises(CorruptionError, match="CRC"):
        _feed(unknown, data, []).finish(descriptor.crc ^ 1)


def test_a_flipped_byte_fails_at_its_frame() -> None:
    data, descriptor = _segment()
    for position in (10, 60, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[position] ^= 0x40
        with pytest.raises(CorruptionError):
            _feed(descriptor, bytes(damaged), [4096] * (len(data) // 4096)).finish(descriptor.crc)


def test_a_lying_length_is_refused_before_it_is_buffered() -> None:
    data, descriptor = _segment()
    damaged = bytearray(data)
    struct.pack_into(">I", damaged, 0, 0xFFFF_FFF0)
    arriving = ArrivingSegment(descriptor)
    with pytest.raises(CorruptionError, match="declares"):
        for position in range(0, 64, 2):  # a frame header in small pieces: the length is judged first
            arriving.feed(bytes(damaged[position:position + 2]))


def test_a_gap_in_indexes_or_offsets_is_refused() -> None:
    data, descriptor = _segment(first=5)
    shifted = SegmentDescriptor(Index(6), Index(45), descriptor.size_bytes, descriptor.crc,
                                descriptor.first_offset, descriptor.next_offset)
    with pytest.raises(CorruptionError, match="expected entry 6"):
        _feed(shifted, data, [])
    moved = SegmentDescriptor(descriptor.first_index, descriptor.last_index, descriptor.size_bytes, descriptor.crc,
                              Offset(99), descriptor.next_offset)
    with pytest.raises(CorruptionError, match="offset"):
        _feed(moved, data, [])


def test_short_long_and_wrong_ends_are_refused() -> None:
    data, descriptor = _segment()
    short = ArrivingSegment(descriptor)
    short.feed(data[:-10])
    with pytest.raises(CorruptionError, match="partial frame"):
        short.finish(descriptor.crc)
    with pytest.raises(CorruptionError, match="past its announced size"):
        ArrivingSegment(descriptor).feed(data + b"x")
    longer = SegmentDescriptor(descriptor.first_index, Index(descriptor.last_index + 1), descriptor.size_bytes,
                               descriptor.crc, descriptor.first_offset, descriptor.next_offset)
    with pytest.raises(CorruptionError, match="does not end at entry"):
        _feed(longer, data, []).finish(descriptor.crc)
    with pytest.raises(CorruptionError, match="CRC"):
        _feed(descriptor, data, []).finish(descriptor.crc ^ 1)
