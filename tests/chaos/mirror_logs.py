"""Source and sink logs for the mirror checkers' tests (chaos/mirror_checks.py and the
follow checks): batches of numbered values, laid end to end as storage gives them offsets."""

from __future__ import annotations

from chaos.mirror_checks import LogCopy
from storage.batch import Record, decode_columns, encode_batch


def batch_of(*values: int, stamp: int = 1) -> bytes:
    return encode_batch([Record(None, str(v).encode()) for v in values], first_timestamp_ms=stamp)


def log_of(*batches: bytes, start: int = 0) -> LogCopy:
    """Batches laid end to end from `start`, as storage gives them offsets."""
    placed, offset = [], start
    for data in batches:
        placed.append((offset, data))
        offset += len(decode_columns(data).values)
    return LogCopy(start, offset, tuple(placed))
