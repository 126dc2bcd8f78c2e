"""Database records of closed segments: the catalog entry and their index keys.

Closing a segment moves its in-memory tables into the database: raft index ->
(segment, position) for every entry, base offset -> (index, segment, position,
record count) for every DATA entry, and the term runs that start inside it.
All of it is derived from the segment file, so it is written without sync: a
lost write only means the segment is scanned again on reopen.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

from rocksdict import WriteBatch

from raftlog.types import GroupId, Index, Offset
from storage.segment import CATALOG, Segment
from storage.state_db import (
    CLOSED_SEGMENT,
    INDEX,
    OFFSET,
    TERM_RUN,
    StateDatabase,
    int_key,
    int_range,
    key_int,
)

INDEX_VALUE = struct.Struct(">QQ")  # segment first index, position
OFFSET_VALUE = struct.Struct(">QQQ")  # raft index, segment first index, position
TERM_VALUE = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    first_index: Index
    last_index: Index
    size: int
    crc: int
    first_offset: Offset
    next_offset: Offset
    created_ms: int


def load_catalog(db: StateDatabase, group: GroupId) -> dict[Index, CatalogEntry]:
    entries = {}
    for key, value in db.scan(*int_range(CLOSED_SEGMENT, group)):
        first = Index(key_int(key))
        last, size, crc, first_offset, next_offset, created_ms = CATALOG.unpack(value)
        entries[first] = CatalogEntry(
            first, Index(last), size, crc, Offset(first_offset), Offset(next_offset), created_ms
        )
    return entries


def load_term_runs(db: StateDatabase, group: GroupId, below: Index) -> tuple[list[int], list[int]]:
    """Term runs persisted for closed segments, those starting before `below`."""
    starts: list[int] = []
    terms: list[int] = []
    for key, value in db.scan(*int_range(TERM_RUN, group)):
        start = key_int(key)
        if start < below:
            starts.append(start)
            terms.append(TERM_VALUE.unpack(value)[0])
    return starts, terms


def stage_close(
    batch: WriteBatch, group: GroupId, segment: Segment, term_starts: list[int], terms: list[int]
) -> None:
    """Write a segment's catalog entry and index keys, then drop its memory tables."""
    assert not segment.closed
    first = segment.first_index
    for i, position in enumerate(segment.positions):
        batch.put(int_key(INDEX, group, first + i), INDEX_VALUE.pack(first, position))
    for offset, index in zip(segment.data_offsets, segment.data_indexes, strict=True):
        position = segment.positions[index - first]
        batch.put(int_key(OFFSET, group, offset), OFFSET_VALUE.pack(index, first, position))
    for start, term in zip(term_starts, terms, strict=True):
        if first <= start <= segment.last_index:
            batch.put(int_key(TERM_RUN, group, start), TERM_VALUE.pack(term))
    batch.put(int_key(CLOSED_SEGMENT, group, first), segment.catalog_value())
    segment.closed = True
    segment.positions = array("Q")
    segment.data_offsets = array("Q")
    segment.data_indexes = array("Q")
