"""Retention and segment transfer: whole closed segments leave or arrive.

Retention deletes closed segments below the applied index by age
(`retention_ms`, judged by when the next segment was created, i.e. when this
one stopped receiving writes) and by total size (`retention_bytes`), through
`SegmentStore.compact`, so the log start offset advances with it.

Segment transfer (far-horizon catch-up): the leader lists its closed segments
with size and CRC, the follower fetches the ones it lacks in chunks, and
installs each atomically: written to `<name>.part`, fsynced, checked against
the announced size and CRC, renamed, directory fsynced.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

from raftlog.types import Index, Offset
from storage.errors import CorruptionError
from storage.files import Files
from storage.segment import PARTIAL_SUFFIX, segment_name
from storage.segments import SegmentStore

TRANSFER_CHUNK_BYTES_MAX = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentDescriptor:
    first_index: Index
    last_index: Index
    size_bytes: int
    crc: int
    first_offset: Offset
    next_offset: Offset


def retention_index(store: SegmentStore, now_ms: int, applied: Index) -> Index:
    """The highest index retention may compact to (0 when nothing is due)."""
    config, segments = store.config, store.segments
    closed = [s for s in segments if s.closed and s.last_index <= applied]
    total_bytes = sum(s.size for s in segments)
    target = Index(0)
    for position, segment in enumerate(closed):
        closed_ms = segments[position + 1].created_ms
        too_old = config.retention_ms is not None and now_ms - closed_ms >= config.retention_ms
        too_big = config.retention_bytes is not None and total_bytes > config.retention_bytes
        if not (too_old or too_big):
            break
        target = segment.last_index
        total_bytes -= segment.size
    return target


def enforce_retention(store: SegmentStore, now_ms: int, applied: Index) -> Index:
    """Delete what retention allows; returns the new first index."""
    target = retention_index(store, now_ms, applied)
    if target >= store.first_index():
        store.compact(target)
    return store.first_index()


def list_closed_segments(store: SegmentStore) -> list[SegmentDescriptor]:
    descriptors = []
    for segment in store.segments:
        if not segment.closed or segment.first_index < store.first_index():
            continue
        if segment.crc is None:  # computed on first request, kept in memory
            segment.crc = _file_crc(store.files, segment.handle)
        descriptors.append(
            SegmentDescriptor(
                segment.first_index,
                segment.last_index,
                segment.size,
                segment.crc,
                segment.first_offset,
                segment.next_offset,
            )
        )
    return descriptors


def file_crc(path: str) -> int:
    """The CRC of a closed segment's file, read by its path (any thread: no store state)."""
    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(TRANSFER_CHUNK_BYTES_MAX):
            crc = zlib.crc32(chunk, crc)
    return crc


def descriptor_crc(fd: int, size: int) -> int:
    """The CRC of the first `size` bytes of an open file (any thread: positioned reads)."""
    crc, position = 0, 0
    while position < size:
        chunk = os.pread(fd, min(TRANSFER_CHUNK_BYTES_MAX, size - position), position)
        if not chunk:
            raise CorruptionError(f"the file ends at {position} of {size} bytes")
        crc = zlib.crc32(chunk, crc)
        position += len(chunk)
    return crc


def _file_crc(files: Files, handle) -> int:
    crc, position = 0, 0
    while position < handle.size:
        chunk = files.read(handle, position, TRANSFER_CHUNK_BYTES_MAX)
        crc = zlib.crc32(chunk, crc)
        position += len(chunk)
    return crc


def read_segment_chunk(store: SegmentStore, first_index: Index, position: int, size: int) -> bytes:
    """A chunk of a closed segment (closed segments are immutable, so any order works)."""
    assert 0 < size <= TRANSFER_CHUNK_BYTES_MAX
    for segment in store.segments:
        if segment.first_index == first_index and segment.closed:
            return store.files.read(segment.handle, position, size)
    raise KeyError(f"no closed segment starts at {first_index}")


def install_segment(
    files: Files, directory: str, descriptor: SegmentDescriptor, chunks: list[bytes]
) -> str:
    """Write a received segment next to the log, atomically; returns its path.

    The caller installs segments below the follower's log and then reopens the
    store (recovery catalogs them) together with the partition state snapshot.
    """
    final = os.path.join(directory, segment_name(descriptor.first_index))
    partial = final + PARTIAL_SUFFIX
    handle = files.create(partial)
    try:
        files.append(handle, chunks)
        data_crc = zlib.crc32(files.read(handle, 0, handle.size))
        if handle.size != descriptor.size_bytes or data_crc != descriptor.crc:
            raise CorruptionError(f"segment {descriptor.first_index} arrived damaged")
        files.fsync(handle)
    except BaseException:
        files.close(handle)
        files.unlink(partial)
        raise
    files.close(handle)
    files.rename(partial, final)
    files.sync_dir(directory)
    return final
