"""Store configuration: every limit named, validated, with units last."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FlushMode(enum.Enum):
    FSYNC = "fsync"  # group commit: one fsync per touched file per sync() call
    INTERVAL = "interval"  # fsync when `interval_ms` passed since the last one
    NONE = "none"  # never fsync log entries (the OS decides); hard state still is


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    mode: FlushMode = FlushMode.FSYNC
    interval_ms: int = 0

    def __post_init__(self) -> None:
        if self.mode is FlushMode.INTERVAL:
            assert self.interval_ms > 0, "interval flushing needs a positive interval"
        else:
            assert self.interval_ms == 0

    @classmethod
    def parse(cls, text: str) -> FlushPolicy:
        """`fsync`, `none` or `interval_ms=N` (the config file and CLI spelling)."""
        if text.startswith("interval_ms="):
            return cls(FlushMode.INTERVAL, int(text.removeprefix("interval_ms=")))
        return cls(FlushMode(text))


@dataclass(frozen=True, slots=True)
class StoreConfig:
    # Kafka's default segment is 1 GiB; 64 MiB keeps the reopen scan of the open
    # segment well under a second and segment transfer rounds short.
    segment_bytes_max: int = 64 * 1024 * 1024
    segment_ms_max: int = 7 * 24 * 3600 * 1000  # Kafka's log.roll.ms default
    flush: FlushPolicy = FlushPolicy()
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None
    read_chunk_bytes: int = 1024 * 1024  # one pread for sequential reads

    def __post_init__(self) -> None:
        assert self.segment_bytes_max >= 4096
        assert self.segment_ms_max > 0
        assert self.retention_ms is None or self.retention_ms > 0
        assert self.retention_bytes is None or self.retention_bytes > 0
        assert self.read_chunk_bytes >= 4096
