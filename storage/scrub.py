"""A replica's tictac tree (storage/tictac.py), built from its stored batches in slices.

The tree covers the DATA entries whose base offset lies in `[lo, hi)`, hashing each
batch as stored (the frame's payload, read from the closed and open segments), so
two replicas compare byte for byte. NOOP, CONFIG and META entries are not batches
and are left out: a mirror (a later phase) holds the same batches at the same
offsets, not the same Raft entries, and the trees must compare there too.

Reads go through the store and its frame check. A frame that fails it (bit rot in a
closed segment, trusted at open) is not served: its entry adds `damaged_hash` to the
leaf its offsets fall in, the build carries on after it, and `damaged` names it, so
the caller can both report the range and start the repair a damaged read starts.

`step` does a bounded slice of the work: the store belongs to the node's event loop
(not thread-safe), so the node runs slices on the loop and yields between them,
as the chaos digest does (multiraft/node/debug_views.py).
"""

from __future__ import annotations

from raftlog.messages import EntryKind
from raftlog.types import Index, Offset
from storage.errors import CorruptionError
from storage.offsets import lookup
from storage.segments import SegmentStore
from storage.tictac import LeafAccumulator, TicTacTree, damaged_hash, element_hash, leaf_of

SLICE_ENTRIES = 256  # entries read per step: up to ~256 x 1 MiB batches, usually far less
SLICE_BYTES = 8 << 20  # and a step stops after this many bytes hashed


class ReplicaTreeBuilder:
    """The tree of `store`'s batches with base offsets in `[lo, hi)`; `hi` must not pass the
    replica's committed end (the caller's to check: only committed entries are compared)."""

    def __init__(self, store: SegmentStore, lo: int, hi: int) -> None:
        assert store.log_start_offset <= lo <= hi <= store.log_end_offset
        self.store = store
        self.lo, self.hi = lo, hi
        self._leaves = LeafAccumulator(lo, hi)
        self._next: Index | None = lookup(store, Offset(lo))[0] if lo < hi else None
        self._expected = lo  # the base offset the next entry should have
        self.damaged: list[int] = []  # indexes of entries whose frames failed their check
        self.bytes_hashed = 0

    @property
    def done(self) -> bool:
        return self._next is None

    def step(self, entries_max: int = SLICE_ENTRIES, bytes_max: int = SLICE_BYTES) -> bool:
        """Hash up to `entries_max` entries (or `bytes_max` bytes); True when the tree is whole."""
        if self._next is None:
            return True
        start, last = self._next, self.store.last_index()
        stop = Index(min(last + 1, start + entries_max))
        index, hashed = start, 0
        try:
            for info, payload in self.store.frames(start, stop):
                index = Index(info.index + 1)
                if info.base_offset >= self.hi:
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
        self._next = index if index <= last and self._expected < self.hi else None
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


def build_tree(store: SegmentStore, lo: int, hi: int) -> ReplicaTreeBuilder:
    """The whole build in one go (tests, tools): the node runs `step` with yields instead."""
    builder = ReplicaTreeBuilder(store, lo, hi)
    while not builder.step():
        pass
    return builder
