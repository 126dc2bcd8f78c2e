"""The node's rocksdict database: offset index, segment catalog and node state.

One database per node, raw mode (DEPS.md 2: the default mode type-tags keys),
keys `kind (1 byte) + group id (u64) + big-endian integers`, so one kind of one
group is a contiguous range and `seek_for_prev` finds the greatest key <= a target.

Kinds (values are big-endian structs, see docs/format.md):
    H hard state   A applied index + membership   S snapshot point
    C closed segment (catalog)   N newest segment   R needs-repair reason
    I raft index -> (segment, position)            closed segments only
    O base offset -> (index, segment, position, count)   closed segments only
    T first index of a term run -> term

The segments are the source of truth; I, O, T and C are derived and rebuilt
from the segments when missing.
"""

from __future__ import annotations

import struct

from rocksdict import Options, Rdict, RdictIter, ReadOptions, WriteBatch, WriteOptions

from raftlog.types import GroupId
from storage.files import make_private_dirs

_GROUP_KEY = struct.Struct(">cQ")
_GROUP_INT_KEY = struct.Struct(">cQQ")
_INT_MAX = 2**64 - 1

HARD_STATE = b"H"
APPLIED = b"A"
SNAPSHOT = b"S"
CLOSED_SEGMENT = b"C"
NEWEST_SEGMENT = b"N"
REPAIR = b"R"
CHECK_ALL = b"V"  # a read met corruption: the next open scans every segment's frames
INDEX = b"I"
OFFSET = b"O"
TERM_RUN = b"T"
CHECKPOINT = b"K"  # a partition's state at a recent segment end (storage/checkpoints.py)


def group_key(kind: bytes, group: GroupId) -> bytes:
    return _GROUP_KEY.pack(kind, group)


def int_key(kind: bytes, group: GroupId, value: int) -> bytes:
    assert 0 <= value <= _INT_MAX
    return _GROUP_INT_KEY.pack(kind, group, value)


def key_int(key: bytes) -> int:
    return _GROUP_INT_KEY.unpack(key)[2]


class StateDatabase:
    """A thin, typed-key wrapper: batches, synced writes, range scans, seeks."""

    def __init__(self, path: str) -> None:
        # RocksDB would make a missing directory with the umask's mode; ours is the
        # owner's alone, so the files it creates inside (0644) are unreachable to others.
        make_private_dirs(path)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(path, options)
        # Tombstones of earlier runs (truncations, compactions, and recoveries before they
        # deleted key by key) slow every unbounded seek that has to step over them, as
        # `seek_for_prev` does; compacting once here, before anything reads, drops them
        # (docs/storage.md, Recovery, has the measurement).
        self._db.compact_range(None, None)
        self._sync = WriteOptions()
        self._sync.sync = True
        self._no_sync = WriteOptions()
        # Iterators read a point-in-time view: the cached one is dropped on every write.
        self._iterator: RdictIter | None = None

    def close(self) -> None:
        self._iterator = None
        self._db.close()

    @staticmethod
    def batch() -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch, *, sync: bool) -> None:
        self._iterator = None
        if batch.len():
            self._db.write(batch, self._sync if sync else self._no_sync)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def _iter(self) -> RdictIter:
        if self._iterator is None:
            self._iterator = self._db.iter()
        return self._iterator

    def seek_for_prev(self, key: bytes, lowest: bytes) -> tuple[bytes, bytes] | None:
        """The greatest (key, value) with `lowest <= key' <= key`, or None."""
        iterator = self._iter()
        iterator.seek_for_prev(key)
        if not iterator.valid():
            return None
        found = iterator.key()
        if found < lowest:
            return None
        return found, iterator.value()

    def scan(self, lowest: bytes, highest: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) with `lowest <= key <= highest`, in key order.

        Bounded above: an unbounded seek steps over every deleted key after `lowest`
        until a live one, wherever it lies."""
        options = ReadOptions()
        options.set_iterate_upper_bound(highest + b"\x00")  # exclusive: `highest` is in
        iterator = self._db.iter(options)
        iterator.seek(lowest)
        found = []
        while iterator.valid():
            key = iterator.key()
            if key > highest:
                break
            found.append((key, iterator.value()))
            iterator.next()
        return found


def delete_int_range(batch: WriteBatch, kind: bytes, group: GroupId, lowest: int) -> None:
    """Delete every key of `kind` for `group` with integer part >= lowest."""
    batch.delete_range(int_key(kind, group, lowest), int_key(kind, group, _INT_MAX))
    batch.delete(int_key(kind, group, _INT_MAX))


def int_range(kind: bytes, group: GroupId) -> tuple[bytes, bytes]:
    return int_key(kind, group, 0), int_key(kind, group, _INT_MAX)
