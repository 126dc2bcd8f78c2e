"""A replica's tictac tree (storage/tictac.py), built from its stored batches in slices.

The tree covers the DATA entries whose base offset lies in `[lo, hi)`, hashing each
batch as stored (the frame's payload, read from the closed and open segments), so
two replicas compare byte for byte. NOOP, CONFIG and META entries are not batches
and are left out: a mirror (a later phase) holds the same batches at the same
offsets, not the same Raft entries, and the trees must compare there too.

**Closed segments from their sidecars.** A closed segment wholly inside the span
(its offsets within `[lo, hi)`) contributes its partial leaves, kept beside it
(storage/tree_sidecar.py), when a sidecar matching it is there: no read of its
batches. One without a matching sidecar is read whole (every frame checked), its
partial leaves computed on the way, and the new sidecar is handed to the caller
to write (`made`). The edges (the open segment, and a segment an end of the span cuts
through) are always read and hashed. Leaves are XORs, so the tree is the same bit for
bit either way. A **deep** build uses no sidecar: it reads every segment of the span
(which is what finds rot: a sidecar computed before a byte rotted still matches its
segment's stamp), and hands back a sidecar wherever the one on disk was missing or
did not match what it read (`mismatched` names the segments whose stamped sidecar
disagreed with their bytes).

Reads go through the store and its frame check. A frame that fails it (bit rot in a
closed segment, trusted at open) is not served: its entry adds `damaged_hash` to the
leaf its offsets fall in, the build carries on after it, and `damaged` names it, so
the caller can both report the range and start the repair a damaged read starts. A
whole segment whose read fails its check gets no sidecar: it is read again directly,
as an edge is, so the damage is marked exactly where a build without sidecars marks it.

`step` does a bounded slice of the work: the store belongs to the node's event loop
(not thread-safe), so the node runs slices on the loop and yields between them,
as the chaos digest does (multiraft/node/debug_views.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.messages import EntryKind
from raftlog.types import Index, Offset
from storage.errors import CorruptionError
from storage.offsets import lookup
from storage.segment import Segment
from storage.segments import SegmentStore
from storage.tictac import LeafAccumulator, TicTacTree, damaged_hash, element_hash, leaf_of
from storage.tree_sidecar import (
    LeavesAccumulator,
    SegmentLeaves,
    SegmentStamp,
    read_sidecar,
    sidecar_path,
    write_sidecar,
    xor_into,
)

SLICE_ENTRIES = 256  # entries read per step: up to ~256 x 1 MiB batches, usually far less
SLICE_BYTES = 8 << 20  # and a step stops after this many bytes hashed


def stamp_of(store: SegmentStore, segment: Segment) -> SegmentStamp | None:
    """What a sidecar of closed `segment` must say it describes (None: its last frame's
    header cannot be read as that entry's)."""
    assert segment.closed
    try:
        index, term, crc = store.frame_header(segment.last_index)
    except CorruptionError:
        return None
    if index != segment.last_index:
        return None
    return SegmentStamp(int(segment.first_index), int(segment.last_index), segment.size, int(segment.first_offset),
                        int(segment.next_offset), term, crc)


def valid_sidecar(store: SegmentStore, segment: Segment) -> SegmentLeaves | None:
    """The sidecar beside closed `segment` if it decodes and describes the segment as it is now."""
    sidecar = read_sidecar(store.files, segment.path)
    if sidecar is None:
        return None
    return sidecar if sidecar.stamp == stamp_of(store, segment) else None


@dataclass(frozen=True, slots=True, eq=False)
class ComputedSidecar:
    """A sidecar a build computed, with the segment object it read and that segment's
    generation then: written only while the store still holds exactly that (`still_described`)."""

    segment: Segment
    generation: int
    sidecar: SegmentLeaves

    @property
    def stamp(self) -> SegmentStamp:
        return self.sidecar.stamp


def holds(store: SegmentStore, segment: Segment, generation: int) -> bool:
    """Does `store` still hold closed `segment`, the same object, unchanged since `generation`?
    A name, a range and a size are not enough: a Raft truncation into an earlier segment and a
    refill of the same shape make a new segment of the same name (or reopen and close this one)."""
    if store.closed or segment.generation != generation or not segment.closed:
        return False
    if not store.segments or segment.first_index < store.segments[0].first_index:
        return False
    return store.segment_of(segment.first_index) is segment and store.first_index() <= segment.first_index


def still_described(store: SegmentStore, computed: ComputedSidecar) -> Segment | None:
    """The store's closed segment `computed` was read from, if it still holds it unchanged
    (a sidecar is written only then: retention, a reopen or a truncation may have come between)."""
    segment = computed.segment
    if not holds(store, segment, computed.generation):
        return None
    return segment if stamp_of(store, segment) == computed.sidecar.stamp else None


class SegmentLeavesBuilder:
    """A closed segment's partial leaves, read from its frames a slice at a time, each
    frame checked. `result` when done: the sidecar, or None (`failed` says why).

    The stamp is taken first, and every slice and the finish check that the store still
    holds this very segment object at this generation (`holds`): frames are read through
    the store by index, so a segment replaced between two slices would otherwise hand the
    later slices another segment's frames, and a stamp taken at the end would describe a
    mix of the two."""

    def __init__(self, store: SegmentStore, segment: Segment) -> None:
        assert segment.closed
        self.store, self.segment = store, segment
        self.generation = segment.generation
        self._stamp = stamp_of(store, segment)
        self._next: Index | None = segment.first_index
        self._leaves = LeavesAccumulator()
        self.bytes_hashed = 0
        self.result: SegmentLeaves | None = None
        self.failed = ""
        if self._stamp is None:
            self._fail("its last frame's header does not name its last entry")

    @property
    def done(self) -> bool:
        return self._next is None

    @property
    def computed(self) -> ComputedSidecar | None:
        return None if self.result is None else ComputedSidecar(self.segment, self.generation, self.result)

    def step(self, entries_max: int = SLICE_ENTRIES, bytes_max: int = SLICE_BYTES) -> bool:
        if self._next is None:
            return True
        segment, store = self.segment, self.store
        if not holds(store, segment, self.generation):
            return self._fail("the segment was dropped, reopened or replaced while it was read")
        start = self._next
        stop = Index(min(segment.last_index + 1, start + entries_max))
        index, hashed = start, 0
        try:
            for info, payload in self.store.frames(start, stop):
                index = Index(info.index + 1)
                if info.kind is not EntryKind.DATA:
                    continue
                if info.record_count < 1:  # base offset == next offset: a span's end might exclude it
                    return self._fail(f"entry {info.index} is a DATA frame of no records")
                self._leaves.add(info.base_offset, element_hash(info.base_offset, payload))
                hashed += len(payload)
                if hashed >= bytes_max:
                    break
        except CorruptionError as error:
            self.bytes_hashed += hashed
            return self._fail(str(error))
        self.bytes_hashed += hashed
        if index <= segment.last_index:
            self._next = index
            return False
        self._next = None
        if stamp_of(self.store, segment) != self._stamp:  # (`holds` was checked before this last slice)
            return self._fail("its last frame changed while it was read")
        assert self._stamp is not None
        self.result = self._leaves.finish(self._stamp)
        return True

    def _fail(self, why: str) -> bool:
        self._next, self.failed = None, why
        return True


class ReplicaTreeBuilder:
    """The tree of `store`'s batches with base offsets in `[lo, hi)`; `hi` must not pass the
    replica's committed end (the caller's to check: only committed entries are compared).
    `deep`: read every segment, sidecars or not."""

    def __init__(self, store: SegmentStore, lo: int, hi: int, *, deep: bool = False) -> None:
        assert store.log_start_offset <= lo <= hi <= store.log_end_offset
        self.store = store
        self.lo, self.hi = lo, hi
        self.deep = deep
        self._leaves = LeafAccumulator(lo, hi)
        self._next: Index | None = self._first(lo) if lo < hi else None
        self._expected = lo  # the base offset the next entry should have
        self._segment_build: SegmentLeavesBuilder | None = None
        self._direct_below = Index(0)  # entries below this are read directly (a whole read failed)
        self.damaged: list[int] = []  # indexes of entries whose frames failed their check
        self.bytes_hashed = 0
        self.made: list[ComputedSidecar] = []  # sidecars computed here, for the caller to write
        self.from_sidecars = 0  # closed segments taken from their sidecars
        self.ignored = 0  # closed segments whose sidecar was there but did not match (read instead)
        self.mismatched: list[int] = []  # deep: segments whose matching sidecar disagreed with their bytes

    def _first(self, lo: int) -> Index:
        """The entry the build starts at: the DATA entry holding `lo`, or the first entry of its
        segment when that segment starts at `lo` or later (the entries between are not DATA, and
        a build starting there may take the segment whole)."""
        index = lookup(self.store, Offset(lo))[0]
        segment = self.store.segment_of(index)
        if segment.first_offset < lo:
            return index
        # The log may start inside this segment (compacted into it): no entry below its start is read.
        return Index(max(segment.first_index, self.store.first_index()))

    @property
    def done(self) -> bool:
        return self._next is None

    @property
    def next_index(self) -> Index | None:
        """The entry the next slice reads first (None: done). Retention moving the log's first
        index past it leaves the build nothing to read: the caller checks between slices."""
        return self._next

    def step(self, entries_max: int = SLICE_ENTRIES, bytes_max: int = SLICE_BYTES) -> bool:
        """Hash up to `entries_max` entries (or `bytes_max` bytes); True when the tree is whole."""
        if self._next is None:
            return True
        segment = self.store.segment_of(self._next)
        if self._whole(segment):
            return self._step_whole(segment, entries_max, bytes_max)
        return self._step_direct(segment, entries_max, bytes_max)

    def _whole(self, segment: Segment) -> bool:
        """May `segment` be taken whole (from its sidecar, or read whole for one)?"""
        return segment.closed and self._next == segment.first_index and segment.first_index >= self._direct_below \
            and self.lo <= segment.first_offset and segment.next_offset <= self.hi

    def _step_whole(self, segment: Segment, entries_max: int, bytes_max: int) -> bool:
        build = self._segment_build
        if build is None:
            if not self.deep:
                sidecar = valid_sidecar(self.store, segment)
                if sidecar is not None:
                    self.from_sidecars += 1
                    return self._take(segment, sidecar)
                self.ignored += self.store.files.exists(sidecar_path(segment.path))
            build = self._segment_build = SegmentLeavesBuilder(self.store, segment)
        before = build.bytes_hashed
        finished = build.step(entries_max, bytes_max)
        self.bytes_hashed += build.bytes_hashed - before
        if not finished:
            return False
        self._segment_build = None
        if build.result is None:  # read it again as an edge is: damage marked where it lies
            self._direct_below = Index(segment.last_index + 1)
            return False
        existing = valid_sidecar(self.store, segment) if self.deep else None
        if existing is not None and existing != build.result:
            self.mismatched.append(int(segment.first_index))
        if existing != build.result:
            self.made.append(ComputedSidecar(segment, build.generation, build.result))
        return self._take(segment, build.result)

    def _take(self, segment: Segment, sidecar: SegmentLeaves) -> bool:
        xor_into(self._leaves.leaves, self._leaves.first_leaf, sidecar)
        self._expected = int(segment.next_offset)
        index = Index(segment.last_index + 1)
        self._next = index if index <= self.store.last_index() and self._expected < self.hi else None
        return self._next is None

    def _step_direct(self, segment: Segment, entries_max: int, bytes_max: int) -> bool:
        start = self._next
        assert start is not None
        stop = Index(min(segment.last_index + 1, start + entries_max))
        index, hashed = start, 0
        try:
            for info, payload in self.store.frames(start, stop):
                index = Index(info.index + 1)
                if info.base_offset >= self.hi:
                    self.bytes_hashed += hashed
                    self._next = None
                    return True
                self._expected = info.next_offset
                if info.kind is EntryKind.DATA and info.base_offset >= self.lo:
                    self._leaves.add(info.base_offset, element_hash(info.base_offset, payload))
                    hashed += len(payload)
                    if hashed >= bytes_max:
                        break
        except CorruptionError:
            self._damaged(index)
            index = Index(index + 1)
        self.bytes_hashed += hashed
        self._next = index if index <= self.store.last_index() and self._expected < self.hi else None
        return self._next is None

    def _damaged(self, index: Index) -> None:
        """Entry `index` could not be read: its leaf (where its batch would start) differs."""
        self.damaged.append(int(index))
        offset = min(max(self._expected, self.lo), self.hi - 1)
        if self.lo <= offset < self.hi and leaf_of(offset) >= self._leaves.first_leaf:
            self._leaves.add(offset, damaged_hash(index))

    def tree(self) -> TicTacTree:
        assert self.done, "the build is finished"
        return self._leaves.tree()


def build_tree(store: SegmentStore, lo: int, hi: int, *, deep: bool = False) -> ReplicaTreeBuilder:
    """The whole build in one go (tests, tools): the node runs `step` with yields instead."""
    builder = ReplicaTreeBuilder(store, lo, hi, deep=deep)
    while not builder.step():
        pass
    return builder


def write_made(store: SegmentStore, builder: ReplicaTreeBuilder | SegmentLeavesBuilder) -> int:
    """Write the sidecars a build computed that still describe their segments (tests, tools;
    the node writes them in the background: multiraft/node/tree_sidecars.py). How many."""
    if isinstance(builder, ReplicaTreeBuilder):
        made = builder.made
    else:
        made = [builder.computed] if builder.computed is not None else []
    written = 0
    for computed in made:
        segment = still_described(store, computed)
        if segment is not None:
            write_sidecar(store.files, segment.path, computed.sidecar)
            written += 1
    return written
