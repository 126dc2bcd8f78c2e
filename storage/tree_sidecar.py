"""A closed segment's partial tictac leaves, kept in a small file beside it (issue 24).

A leaf of a tictac tree (storage/tictac.py) is the XOR of its elements' hashes, and XOR
composes: the leaves of a span are the XOR, leaf by leaf, of what each segment holding
part of it contributes. A closed segment never changes, so what it contributes can be
computed once and kept: the map {leaf index: XOR of the element hashes of its DATA
batches whose base offsets fall in that leaf}, exactly the elements a tree build hashes
(`element_hash` of each DATA frame's base offset and payload as stored). A tree over a
span is then the sidecars of the closed segments wholly inside it, XORed together, plus
a direct hash of the edges (the open segment, and any segment an end of the span cuts
through): a verify of identical copies reads the open segment and the sidecars, not the
log (storage/scrub.py builds it that way).

**Never trusted, always checked.** A sidecar names what it describes (its stamp: the
segment's first and last index, its size in bytes, its first and next offset, and the
term and stored CRC of its last frame) and ends with a CRC of itself. It is used only
when its own CRC holds and its stamp is the segment's as the store holds it now, the
last frame's term and CRC read from the file. So a segment truncated by recovery or a
Raft conflict (its size or last index moves), cut by a mirror repair (another group's
directory, another file), replaced by a far catch-up install, or deleted by retention
(no segment of that name left) is never described by an old sidecar; the store also
unlinks a segment's sidecar when it drops or reopens the segment, and an install
removes them with the files it replaces. Why the last frame's term and CRC are enough
for a file of the same name, size and range: Raft's log matching says two entries of
one group at the same index and term are preceded by the same entries; the CRC covers
that last entry's bytes. What a stamp cannot see is a byte changed in place by the disk
(rot) or by a bug: a sidecar computed before it still matches. Finding rot is a deep
verify's work, which reads every closed segment again (docs/mirror.md, "Incremental
trees").

**Format** (big-endian): magic `RLTL`, version u8, `LEAF_OFFSETS` u32; the stamp (first
index, last index, size, first offset, next offset, last term: u64 each; last frame
CRC: u32); leaf count u32; per leaf (ascending) its index u64 and 16-byte digest; CRC32
of everything before it. A 64 MiB segment of 100-byte records holds about 150 leaves:
a sidecar of about 4 KiB.

**Written without an fsync**: a temporary file (`<segment>.leaves.tmp`) renamed over the
name, neither the file nor the directory fsynced. A sidecar is a cache: a crash may leave
no sidecar, the old one, a torn or empty one under the name, or a temporary file
(recovery removes those); a torn one fails its CRC, so every one is checked before use
and the worst case is a segment read again. Two fsyncs per sidecar would put a disk
flush on a verify's path for nothing the checks do not already give.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from storage.files import Files
from storage.tictac import DIGEST_BYTES, LEAF_OFFSETS, xor

SUFFIX = ".leaves"
TEMPORARY_SUFFIX = ".leaves.tmp"
MAGIC = b"RLTL"
VERSION = 1
_HEAD = struct.Struct(">4sBI")
_STAMP = struct.Struct(">QQQQQQI")
_COUNT = struct.Struct(">I")
_LEAF = struct.Struct(">Q")
_CRC = struct.Struct(">I")
# A sidecar is read whole; it holds at most one leaf per LEAF_OFFSETS offsets of its
# segment, so a 64 MiB segment of 1-byte records (about 2 M records, 520 leaves) stays
# far below this. A file claiming more is not a sidecar of ours.
SIDECAR_BYTES_MAX = 4 << 20

_logger = structlog.get_logger("raftlog.storage")


@dataclass(frozen=True, slots=True)
class SegmentStamp:
    """What a sidecar describes: one closed segment, as the store holds it."""

    first_index: int
    last_index: int
    size: int
    first_offset: int
    next_offset: int
    last_term: int
    last_crc: int  # the stored CRC field of the last frame's header

    def __post_init__(self) -> None:
        assert 1 <= self.first_index <= self.last_index, "a closed segment holds an entry"
        assert 0 <= self.first_offset <= self.next_offset
        assert self.size > 0


@dataclass(frozen=True, slots=True)
class SegmentLeaves:
    """A closed segment's partial leaves: (leaf index, XOR of its elements there), ascending."""

    stamp: SegmentStamp
    leaves: tuple[tuple[int, bytes], ...]

    def __post_init__(self) -> None:
        for (leaf, digest), later in zip(self.leaves, self.leaves[1:], strict=False):
            assert leaf < later[0], "leaves ascend, each once"
            assert len(digest) == DIGEST_BYTES
        if self.leaves:
            assert len(self.leaves[-1][1]) == DIGEST_BYTES


class LeavesAccumulator:
    """A segment's partial leaves, fed one element at a time (pure)."""

    def __init__(self) -> None:
        self._leaves: dict[int, bytes] = {}

    def add(self, base_offset: int, digest: bytes) -> None:
        leaf = base_offset // LEAF_OFFSETS
        found = self._leaves.get(leaf)
        self._leaves[leaf] = digest if found is None else xor(found, digest)

    def finish(self, stamp: SegmentStamp) -> SegmentLeaves:
        return SegmentLeaves(stamp, tuple(sorted(self._leaves.items())))


def encode(sidecar: SegmentLeaves) -> bytes:
    stamp = sidecar.stamp
    parts = [_HEAD.pack(MAGIC, VERSION, LEAF_OFFSETS),
             _STAMP.pack(stamp.first_index, stamp.last_index, stamp.size, stamp.first_offset, stamp.next_offset,
                         stamp.last_term, stamp.last_crc),
             _COUNT.pack(len(sidecar.leaves))]
    for leaf, digest in sidecar.leaves:
        parts += (_LEAF.pack(leaf), digest)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> SegmentLeaves | None:
    """The sidecar in `data`, or None when it is not one of this version whose CRC holds."""
    fixed = _HEAD.size + _STAMP.size + _COUNT.size
    if len(data) < fixed + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(memoryview(data)[:len(data) - _CRC.size]) != crc:
        return None
    magic, version, leaf_offsets = _HEAD.unpack_from(data, 0)
    if (magic, version, leaf_offsets) != (MAGIC, VERSION, LEAF_OFFSETS):
        return None
    values = _STAMP.unpack_from(data, _HEAD.size)
    (count,) = _COUNT.unpack_from(data, _HEAD.size + _STAMP.size)
    if len(data) != fixed + count * (_LEAF.size + DIGEST_BYTES) + _CRC.size:
        return None
    first, last, size, first_offset, next_offset = values[:5]
    if not (1 <= first <= last and first_offset <= next_offset and size > 0):
        return None
    leaves, position = [], fixed
    for _ in range(count):
        (leaf,) = _LEAF.unpack_from(data, position)
        leaves.append((leaf, bytes(data[position + _LEAF.size:position + _LEAF.size + DIGEST_BYTES])))
        position += _LEAF.size + DIGEST_BYTES
    if any(a[0] >= b[0] for a, b in itertools.pairwise(leaves)):
        return None
    return SegmentLeaves(SegmentStamp(*values), tuple(leaves))


def sidecar_path(segment_path: str) -> str:
    return segment_path + SUFFIX


def is_sidecar(name: str) -> bool:
    """A sidecar's name, or its temporary file's."""
    return name.endswith(SUFFIX) or name.endswith(TEMPORARY_SUFFIX)


def segment_of_sidecar(name: str) -> str | None:
    """The segment file name a sidecar (not a temporary one) describes."""
    return name.removesuffix(SUFFIX) if name.endswith(SUFFIX) else None


def read_sidecar(files: Files, segment_path: str) -> SegmentLeaves | None:
    """The sidecar beside `segment_path` if there is one that decodes (its stamp unchecked)."""
    path = sidecar_path(segment_path)
    if not files.exists(path):
        return None
    handle = files.open(path)
    try:
        if handle.size > SIDECAR_BYTES_MAX:
            return None
        return decode(files.read(handle, 0, handle.size))
    finally:
        files.close(handle)


def forget_sidecar(files: Files, segment_path: str) -> None:
    """Unlink the sidecar of a segment dropped or reopened (durable at the caller's `sync_dir`).
    Never raises: a sidecar is a cache checked by its stamp, and this runs in the middle of a
    truncation, a retention drop or recovery, which must not stop halfway for it. One left
    behind describes a segment no longer there (its stamp says so); recovery removes it."""
    for path in (sidecar_path(segment_path), segment_path + TEMPORARY_SUFFIX):
        discard(files, path)


def discard(files: Files, path: str) -> bool:
    """Unlink `path` if it is there; an OSError is logged, not raised. True: it is gone."""
    try:
        if files.exists(path):
            files.unlink(path)
        return True
    except FileNotFoundError:  # removed meanwhile (recovery, an install, a drop): what was wanted
        return True
    except OSError as error:
        _logger.warning("tree_sidecar_not_removed", path=path, error=str(error))
        return False


def write_sidecar(files: Files, segment_path: str, sidecar: SegmentLeaves) -> None:
    """Write `sidecar` beside its segment: a temporary file renamed over the name, no fsync
    (module docstring: a cache checked by its CRC and stamp; a torn one is rebuilt). On this
    thread and in one go, so nothing of the store's changes between the caller's check and the
    rename. Raises OSError (a full disk); the temporary file is then removed if it can be."""
    temporary = segment_path + TEMPORARY_SUFFIX
    discard(files, temporary)  # a write a failure interrupted
    try:
        handle = files.create(temporary)
        try:
            files.append(handle, [encode(sidecar)])
            files.to_os(handle)  # the write-behind double holds appends until an fsync otherwise
        finally:
            files.close(handle)
        files.rename(temporary, sidecar_path(segment_path))
    except OSError:
        discard(files, temporary)
        raise


def xor_into(leaves: list[bytes], first_leaf: int, sidecar: SegmentLeaves) -> None:
    """XOR a segment's partial leaves into a span's leaves (`leaves[i]` is leaf `first_leaf + i`)."""
    for leaf, digest in sidecar.leaves:
        slot = leaf - first_leaf
        assert 0 <= slot < len(leaves), "a segment wholly inside a span has its leaves there"
        leaves[slot] = xor(leaves[slot], digest)


def leaves_of(sidecars: Iterable[SegmentLeaves]) -> dict[int, bytes]:
    """Several segments' partial leaves XORed together (tests, tools)."""
    merged: dict[int, bytes] = {}
    for sidecar in sidecars:
        for leaf, digest in sidecar.leaves:
            merged[leaf] = xor(merged[leaf], digest) if leaf in merged else digest
    return merged
