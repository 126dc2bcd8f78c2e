"""Tictac Merkle trees over fixed offset ranges of a partition's log (pure).

Why this shape (issue 24; docs/mirror.md has the whole story):

- **Leaves are fixed offset ranges**, leaf `i` covering offsets `[i * LEAF_OFFSETS,
  (i + 1) * LEAF_OFFSETS)`, clipped to the span a tree covers. Offsets are what two
  copies of a partition share whatever their Raft indexes, segment sizes or batch
  boundaries: the replicas of one cluster, and later a mirror and its source, which
  keep the same offsets and batch bytes but not the same Raft log.
- **Tictac, not a plain Merkle hash** (Riak's kv_index_tictactree, docs/TICTAC.md): a
  leaf is the XOR of its elements' hashes, and a branch the XOR of its children, so a
  tree can later be kept incrementally as batches are appended (XOR one element's
  hash into its leaf and the leaf's ancestors) with no re-read of the range. Each
  element's hash covers its base offset, so order still counts (a batch moved to
  another offset changes both leaves); no two elements of a log share a base offset,
  so none cancels another. Cryptographic strength is not the point: the copies are
  ours, and the tree only finds where they differ.
- **Width and fan-out**: `LEAF_OFFSETS` = 4096 offsets and `FANOUT` = 16. A 1 GiB
  partition of 100-byte records holds about 10.7 M offsets: 2,622 leaves, 4 levels
  (2,622 -> 164 -> 11 -> 1), 42 KiB of 16-byte digests. Larger records mean fewer
  leaves (1 KiB records: 256). A differing batch costs one root plus 16 digests per
  level below it to find: about 50 digests, and at most one leaf's worth of batches
  (4,096 records) to re-fetch.

A comparison (`Descent`) goes root first and asks for the children only of nodes
that differ, level by level, so identical trees cost one comparison of roots. It is
a sans-I/O step machine: the caller fetches the other side's digests (from a tree in
hand, or over RPC from a peer) and feeds them back, and counts what crossed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

LEAF_OFFSETS = 4096
FANOUT = 16
DIGEST_BYTES = 16
ZERO = bytes(DIGEST_BYTES)
DIFFERING_LEAVES_MAX = 64  # a comparison stops after this many differing leaves (and says so)


def element_hash(base_offset: int, batch: bytes | memoryview) -> bytes:
    """One stored batch's contribution to its leaf: its base offset and its bytes as stored."""
    hashed = hashlib.blake2b(base_offset.to_bytes(8, "big"), digest_size=DIGEST_BYTES)
    hashed.update(batch)
    return hashed.digest()


def damaged_hash(index: int) -> bytes:
    """What an entry that could not be read (its frame fails its check) adds to its leaf: a
    value no readable copy produces, so the leaf differs from every sound replica's."""
    return hashlib.blake2b(b"unreadable entry %d" % index, digest_size=DIGEST_BYTES).digest()


def xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(DIGEST_BYTES, "big")


def leaf_of(offset: int) -> int:
    return offset // LEAF_OFFSETS


def leaf_range(leaf: int, lo: int, hi: int) -> tuple[int, int]:
    """The offsets `[start, end)` leaf `leaf` covers in a tree over `[lo, hi)`."""
    return max(lo, leaf * LEAF_OFFSETS), min(hi, (leaf + 1) * LEAF_OFFSETS)


class LeafAccumulator:
    """Leaf digests of a span `[lo, hi)`, fed one stored batch at a time, in any order."""

    def __init__(self, lo: int, hi: int) -> None:
        assert 0 <= lo <= hi
        self.lo, self.hi = lo, hi
        self.first_leaf = leaf_of(lo)
        count = 0 if hi == lo else leaf_of(hi - 1) - self.first_leaf + 1
        self.leaves = [ZERO] * count

    def add(self, base_offset: int, digest: bytes) -> None:
        assert self.lo <= base_offset < self.hi, "only batches whose base offset lies in the span"
        slot = leaf_of(base_offset) - self.first_leaf
        self.leaves[slot] = xor(self.leaves[slot], digest)

    def tree(self) -> TicTacTree:
        return TicTacTree.from_leaves(self.lo, self.hi, self.leaves)


@dataclass(frozen=True, slots=True)
class TicTacTree:
    """A tree over offsets `[lo, hi)`: `levels[0]` the leaves, `levels[-1]` the root alone.
    Node `(level, position)` has children `position * FANOUT ...` one level down."""

    lo: int
    hi: int
    levels: tuple[tuple[bytes, ...], ...]

    @classmethod
    def from_leaves(cls, lo: int, hi: int, leaves: Sequence[bytes]) -> TicTacTree:
        level = tuple(leaves) or (ZERO,)
        levels = [level]
        while len(level) > 1:
            parents = []
            for start in range(0, len(level), FANOUT):
                value = 0
                for child in level[start:start + FANOUT]:
                    value ^= int.from_bytes(child, "big")
                parents.append(value.to_bytes(DIGEST_BYTES, "big"))
            level = tuple(parents)
            levels.append(level)
        return cls(lo, hi, tuple(levels))

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def first_leaf(self) -> int:
        return leaf_of(self.lo)

    def nodes(self, level: int, positions: Iterable[int]) -> list[bytes]:
        """Digests at `level` (0: leaves), counted from the leaves; absent positions read as zero."""
        row = self.levels[level]
        return [row[p] if 0 <= p < len(row) else ZERO for p in positions]

    def prefix(self, hi: int) -> TicTacTree:
        """The tree over `[lo, hi)` for a shorter `hi` that ends on a leaf boundary (or at
        this tree's own end): its leaves are this tree's, unchanged."""
        assert self.lo <= hi <= self.hi
        assert hi in (self.lo, self.hi) or hi % LEAF_OFFSETS == 0, "a prefix ends where a leaf does"
        count = 0 if hi == self.lo else leaf_of(hi - 1) - self.first_leaf + 1
        return TicTacTree.from_leaves(self.lo, hi, self.levels[0][:count])


@dataclass(frozen=True, slots=True)
class Comparison:
    """Where two trees over the same span differ."""

    lo: int
    hi: int
    ranges: tuple[tuple[int, int], ...]  # differing leaves' offset ranges, in order
    truncated: bool  # stopped after DIFFERING_LEAVES_MAX (or the caller's bound) differing leaves
    nodes_compared: int  # digests of the other side looked at (what an RPC carries)

    @property
    def identical(self) -> bool:
        return not self.ranges


@dataclass(slots=True)
class Descent:
    """A comparison of `mine` with a tree held elsewhere, root first (sans-I/O).

    Loop: `wanted()` names a level and positions of the other tree; fetch those digests
    and pass them to `receive`; stop when `wanted()` is None and read `result()`."""

    mine: TicTacTree
    leaves_max: int = DIFFERING_LEAVES_MAX
    _level: int = -1
    _positions: list[int] = field(default_factory=lambda: [0])
    _differing: list[int] = field(default_factory=list)
    _truncated: bool = False
    _compared: int = 0

    def __post_init__(self) -> None:
        assert self.leaves_max > 0
        self._level = self.mine.depth - 1

    def wanted(self) -> tuple[int, list[int]] | None:
        if self._level < 0 or not self._positions:
            return None
        return self._level, list(self._positions)

    def receive(self, theirs: Sequence[bytes]) -> None:
        assert self._level >= 0 and len(theirs) == len(self._positions)
        self._compared += len(theirs)
        mine = self.mine.nodes(self._level, self._positions)
        differing = [p for p, a, b in zip(self._positions, mine, theirs, strict=True) if a != b]
        if self._level == 0:
            if len(differing) > self.leaves_max:
                differing, self._truncated = differing[:self.leaves_max], True
            self._differing = differing
            self._positions, self._level = [], -1
            return
        width = len(self.mine.levels[self._level - 1])
        children = [c for p in differing for c in range(p * FANOUT, min((p + 1) * FANOUT, width))]
        # Bounded: one level never asks for more than FANOUT children per allowed leaf.
        limit = self.leaves_max * FANOUT
        if len(children) > limit:
            children, self._truncated = children[:limit], True
        self._positions, self._level = children, self._level - 1

    def result(self) -> Comparison:
        assert self.wanted() is None, "the descent is finished"
        first = self.mine.first_leaf
        ranges = tuple(leaf_range(first + slot, self.mine.lo, self.mine.hi) for slot in self._differing)
        return Comparison(self.mine.lo, self.mine.hi, ranges, self._truncated, self._compared)


def run_descent(descent: Descent, fetch: Callable[[int, list[int]], Sequence[bytes]]) -> Comparison:
    """Drive a descent with a synchronous fetch (the other tree in hand)."""
    while (step := descent.wanted()) is not None:
        descent.receive(fetch(*step))
    return descent.result()


@dataclass(frozen=True, slots=True)
class PrefixComparison:
    """Two trees that may cover different lengths: compared over the common prefix."""

    comparison: Comparison
    length_difference: int  # theirs.hi - mine.hi: > 0 they hold more, < 0 they hold less


def compare_trees(mine: TicTacTree, theirs: TicTacTree, leaves_max: int = DIFFERING_LEAVES_MAX) -> PrefixComparison:
    """Compare two trees over the same start, up to the shorter one's end (cut back to a
    leaf boundary unless both end together: a partial leaf of one is not comparable with
    the whole leaf of the other), and say by how much their lengths differ."""
    assert mine.lo == theirs.lo, "trees compared cover spans that start together"
    hi = min(mine.hi, theirs.hi)
    if mine.hi != theirs.hi and hi % LEAF_OFFSETS:
        hi = max(mine.lo, hi - hi % LEAF_OFFSETS)
    a = mine if mine.hi == hi else mine.prefix(hi)
    b = theirs if theirs.hi == hi else theirs.prefix(hi)
    comparison = run_descent(Descent(a, leaves_max), b.nodes)
    return PrefixComparison(comparison, theirs.hi - mine.hi)
