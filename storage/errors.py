"""Typed operating conditions of the storage layer.

Invariant violations are assertions, never these. Each exception here is a
condition a caller handles: reject a produce request, answer a fetch with the
log start, or mark a replica as needing repair. The HTTP layer maps them to
`raftlog.errors` codes at its boundary (storage does not depend on the API).
"""

from __future__ import annotations

from raftlog.storage import StorageError
from raftlog.types import Offset


class InvalidBatchError(StorageError):
    """A record batch or entry frame failed validation: rejected before it is stored."""


class CorruptionError(StorageError):
    """Bytes that were durable do not match their checksum: never served.

    The replica must stop serving this group and repair from the leader.
    """


class DiskFullError(StorageError):
    """A write failed with ENOSPC. Nothing of the failed append is acknowledged;
    appends work again once space returns."""


class SyncFailedError(StorageError):
    """An earlier fsync of this log failed. What it covered may not be durable, and a
    later fsync cannot be trusted to say so (Linux may drop the pages it failed to
    write), so the log syncs no more: the node reopens the group from disk."""


class OffsetOutOfRangeError(StorageError):
    """A read by logical offset outside `[log_start_offset, log_end_offset]`."""

    code = "OFFSET_OUT_OF_RANGE"

    def __init__(self, offset: Offset, log_start_offset: Offset, log_end_offset: Offset) -> None:
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
