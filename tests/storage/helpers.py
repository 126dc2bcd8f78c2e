"""Builders shared by the storage tests."""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

from raftlog.messages import Entry, EntryKind
from raftlog.types import GroupId, Index, Term
from storage.batch import HEADER_BYTES, Compression, Record, encode_batch
from storage.config import StoreConfig
from storage.files import Files, OsFiles
from storage.frames import FrameCheck, crc_matches
from storage.segments import SegmentStore
from storage.state_db import StateDatabase
from storage.write_behind import WriteBehindFiles

GROUP = GroupId(7)


def max_compressed(records: list[Record]) -> bytes:
    """`records` as one batch compressed at zlib level 9, as a hostile client would
    (encode_batch uses level 1, which never reaches the inflation ratio)."""
    plain = encode_batch(records, first_timestamp_ms=1)
    section = zlib.compress(plain[HEADER_BYTES:], 9)
    head = bytearray(plain[:HEADER_BYTES])
    head[5] |= int(Compression.ZLIB)
    struct.pack_into(">I", head, 10, len(section))
    body = bytes(head[5:]) + section
    return plain[:1] + struct.pack(">I", zlib.crc32(body)) + body


def batch(count: int = 2, value_bytes: int = 10, seed: int = 0) -> bytes:
    records = [
        Record(key=f"k{seed}-{i}".encode(), value=bytes([seed % 256]) * value_bytes)
        for i in range(count)
    ]
    return encode_batch(records, first_timestamp_ms=1_700_000_000_000 + seed)


def data_entry(index: int, term: int, count: int = 2, value_bytes: int = 10) -> Entry:
    return Entry(Index(index), Term(term), EntryKind.DATA, batch(count, value_bytes, seed=index))


def entries(lo: int, hi: int, term: int = 1, count: int = 2) -> list[Entry]:
    """DATA entries [lo, hi); every third one a META entry, to mix kinds."""
    made = []
    for index in range(lo, hi):
        if index % 3 == 0:
            made.append(Entry(Index(index), Term(term), EntryKind.META, b"meta-%d" % index))
        else:
            made.append(data_entry(index, term, count))
    return made


@dataclass
class SegmentHarness:
    """A segment store over the write-behind double, with a power-failure `crash`."""

    root: str
    config: StoreConfig = field(default_factory=StoreConfig)
    durable_files: bool = True  # WriteBehindFiles (True) or OsFiles
    now_ms: list[int] = field(default_factory=lambda: [1_000_000])
    frame_check: FrameCheck = crc_matches
    store_class: type[SegmentStore] = SegmentStore

    def __post_init__(self) -> None:
        self.db = StateDatabase(os.path.join(self.root, "state"))
        self.store = self._open()

    def _files(self) -> Files:
        return WriteBehindFiles(self.root) if self.durable_files else OsFiles()

    def _open(self) -> SegmentStore:
        self.files = self._files()
        directory = os.path.join(self.root, "groups", str(GROUP))
        return self.store_class(GROUP, directory, self.db, self.files, self.config,
                                clock_ms=lambda: self.now_ms[0], frame_check=self.frame_check)  # fmt: skip

    def crash(self) -> SegmentStore:
        """Lose everything not synced, as a power failure would, and reopen."""
        self.store.close()
        self.db.close()
        self.db = StateDatabase(os.path.join(self.root, "state"))
        self.store = self._open()
        return self.store

    def close(self) -> None:
        self.store.close()
        self.db.close()
