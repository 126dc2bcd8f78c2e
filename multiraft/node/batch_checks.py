"""Checking a produced batch without holding the event loop.

`validate_batch` is C loops for a plain batch of a few hundred KiB (tens of
microseconds), but a large batch costs a CRC over up to 16 MiB, a compressed one
an inflate, and one with headers a msgpack decode per record: milliseconds to tens
of milliseconds during which no heartbeat of any group is sent. Those go to a
worker thread (zlib releases the GIL; the rest yields it every switch interval),
so one request holds the loop for a few milliseconds at most, whatever it declares.
"""

from __future__ import annotations

import asyncio

from storage.batch import (
    FLAG_COMPRESSION_MASK,
    FLAG_HEADERS,
    HEADER_BYTES,
    BatchHeader,
    validate_batch,
)

# Below this a plain batch is checked inline: a thread hand-off costs more than the check.
INLINE_BYTES_MAX = 256 * 1024
_FLAGS_OFFSET = 5


def _costly(batch: bytes) -> bool:
    if len(batch) > INLINE_BYTES_MAX:
        return True
    return len(batch) >= HEADER_BYTES and bool(batch[_FLAGS_OFFSET] & (FLAG_COMPRESSION_MASK | FLAG_HEADERS))


async def validate_off_loop(batch: bytes) -> BatchHeader:
    """`validate_batch(batch)`, in a worker thread when it could hold the loop for long."""
    if not _costly(batch):
        return validate_batch(batch)
    return await asyncio.to_thread(validate_batch, batch)
