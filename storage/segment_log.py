"""The read side of a group's segment log: entries by Raft index, positions, offsets.

`SegmentLog` implements `raftlog.storage.LogStorage` over the segment files the
way `storage/segments.py`'s `SegmentStore` (its subclass, which adds every write:
appends, syncs, truncation, compaction) keeps them: the open segment's tables in
memory, closed segments' index keys in the database, the newest entries in memory
until the replicas no longer need them (`storage/entry_cache.py`). Every frame read
is checked by CRC (by the store's frame check, `storage.frames.crc_matches` unless
its opener injected another).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator

from raftlog.messages import ENTRY_OVERHEAD_BYTES, Entry, Snapshot
from raftlog.storage import CompactedError, UnavailableError
from raftlog.types import GroupId, Index, Offset, Term
from storage import catalog
from storage.config import StoreConfig
from storage.entry_cache import EntryCache, EntryCacheBudget
from storage.errors import CorruptionError
from storage.files import Files
from storage.frames import FRAME_HEADER_BYTES, FrameCheck, FrameInfo
from storage.node_state import StartPoint
from storage.recovery import Recovered
from storage.segment import Segment, read_frames
from storage.state_db import INDEX, StateDatabase, int_key


class SegmentLog:
    """The reads of one group's log. Not thread-safe: the node's event loop owns it."""

    def __init__(
        self, group: GroupId, directory: str, db: StateDatabase, files: Files,
        config: StoreConfig, recovered: Recovered, frame_check: FrameCheck, cache_budget: EntryCacheBudget,
    ) -> None:
        self.group, self.directory, self._db, self._files = group, directory, db, files
        self.config = config
        self.frame_check = frame_check  # judges every frame read (the one recovery used)
        self._start: StartPoint = recovered.start
        self._segments: list[Segment] = recovered.segments
        # Term runs: entries from _term_starts[i] on have term _terms[i].
        self._term_starts, self._terms = recovered.term_starts, recovered.terms
        self._cache = EntryCache(cache_budget)  # the newest entries, as appended

    def first_index(self) -> Index:
        return Index(self._start.snapshot.meta.index + 1)

    def last_index(self) -> Index:
        if self._segments and self._segments[-1].last_index > self._start.snapshot.meta.index:
            return self._segments[-1].last_index
        return self._start.snapshot.meta.index

    def term(self, index: Index) -> Term:
        start = self._start.snapshot.meta
        if index == start.index:
            return start.term
        if index < start.index:
            raise CompactedError(f"index {index} is below the first index {start.index + 1}")
        if index > self.last_index():
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        run = bisect_right(self._term_starts, index) - 1
        assert run >= 0, "every retained entry lies in a term run"
        return Term(self._terms[run])

    def entries(self, lo: Index, hi: Index, max_bytes: int) -> list[Entry]:
        """From the cache where it holds them (the newest entries), else from the files;
        a range across both reads the files up to the cache's first entry."""
        self._check_range(lo, hi)
        if lo == hi:
            return []
        cache = self._cache
        cached_from = cache.first_index()
        if cached_from is not None and lo >= cached_from:
            return cache.read(lo, hi, max_bytes, 0, self.last_index())
        files_hi = hi if cached_from is None or cached_from >= hi else cached_from
        selected: list[Entry] = []
        total = 0
        for info, payload in self._frames(lo, files_hi):
            total += len(payload) + ENTRY_OVERHEAD_BYTES
            if total > max_bytes and selected:
                return selected
            selected.append(Entry(info.index, info.term, info.kind, payload.tobytes()))
        if files_hi < hi:
            selected += cache.read(files_hi, hi, max_bytes, total, self.last_index())
        return selected

    def release_cached(self, index: Index) -> None:
        """Entries through `index` are applied and held by every follower this log
        replicates to (the runtime's word): the cache lets them go."""
        self._cache.release(index)

    @property
    def cached_bytes(self) -> int:
        return self._cache.bytes

    def snapshot(self) -> Snapshot:
        return self._start.snapshot

    def _check_range(self, lo: Index, hi: Index) -> None:
        if lo <= self._start.snapshot.meta.index:
            raise CompactedError(f"index {lo} is below the first index {self.first_index()}")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} is beyond the last index {self.last_index()}")
        assert lo <= hi, "ranges are half-open [lo, hi)"

    # -- positions -------------------------------------------------------------

    def _segment_of(self, index: Index) -> Segment:
        # Keyed, not a list of first indexes per call: a tree build asks once per segment it
        # takes from a sidecar, and a long partition has thousands of segments.
        slot = bisect_right(self._segments, index, key=lambda s: s.first_index) - 1
        assert slot >= 0, f"index {index} precedes every segment"
        return self._segments[slot]

    def _position(self, segment: Segment, index: Index) -> int:
        if index == segment.last_index + 1:
            return segment.size
        if not segment.closed:
            return segment.open_position(index)
        value = self._db.get(int_key(INDEX, self.group, index))
        if value is None:
            raise CorruptionError(f"index key of entry {index} is missing")
        first, position = catalog.INDEX_VALUE.unpack(value)
        assert first == segment.first_index
        return position

    def _frames(self, lo: Index, hi: Index) -> Iterator[tuple[FrameInfo, memoryview]]:
        """Frames of [lo, hi) in order, each checked by CRC (never served corrupt)."""
        index = lo
        while index < hi:
            segment = self._segment_of(index)
            segment_hi = min(hi, Index(segment.last_index + 1))
            position = self._position(segment, index)
            end = self._position(segment, segment_hi)
            yield from read_frames(self._files, segment, index, position, end,
                                   self.frame_check, self.config.read_chunk_bytes)
            index = segment_hi

    def _offset_at(self, segment: Segment, index: Index) -> Offset:
        """The base offset stored in entry `index`'s frame header."""
        if index == segment.last_index + 1:
            return segment.next_offset
        position = self._position(segment, index)
        header = memoryview(self._files.read(segment.handle, position, FRAME_HEADER_BYTES))
        return Offset(int.from_bytes(header[26:34], "big"))


    # -- offsets ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> Offset:
        return self._start.next_offset

    @property
    def log_end_offset(self) -> Offset:
        if self._segments:
            return self._segments[-1].next_offset
        return self._start.next_offset

    def offset_after(self, index: Index) -> Offset:
        """The offset of the first record after entry `index` (the high watermark
        when `index` is the commit index). One function converts Index to Offset."""
        if index == self._start.snapshot.meta.index:
            return self._start.next_offset
        self._check_range(index, Index(index + 1))
        segment = self._segment_of(index)
        return (
            self._offset_at(segment, Index(index + 1))
            if index < segment.last_index
            else (segment.next_offset)
        )

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def db(self) -> StateDatabase:
        return self._db

    @property
    def files(self) -> Files:
        return self._files

    def frames(self, lo: Index, hi: Index) -> Iterator[tuple[FrameInfo, memoryview]]:
        self._check_range(lo, hi)
        return self._frames(lo, hi)

    def segment_of(self, index: Index) -> Segment:
        return self._segment_of(index)

    def frame_header(self, index: Index) -> tuple[int, int, int]:
        """(index, term, stored CRC) from the header of entry `index`'s frame as the file
        holds it now, unchecked: what a tree sidecar's stamp compares (storage/tree_sidecar.py)."""
        self._check_range(index, Index(index + 1))
        segment = self._segment_of(index)
        position = self._position(segment, index)
        header = self._files.read(segment.handle, position, FRAME_HEADER_BYTES)
        if len(header) < FRAME_HEADER_BYTES:
            raise CorruptionError(f"the frame of entry {index} ends inside its header")
        _length, crc, stored_index, term = struct.unpack_from(">IIQQ", header)
        return stored_index, term, crc

    def frame_end(self, index: Index) -> tuple[Segment, int]:
        """The segment holding entry `index` and where its frame ends in that file."""
        self._check_range(index, Index(index + 1))
        segment = self._segment_of(index)
        return segment, self._position(segment, Index(index + 1))

