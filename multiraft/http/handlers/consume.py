"""Consume: GET records of one partition from any replica, JSON or binary.

JSON answers decode the stored batches (the one place records are decoded per
record); binary answers (`Accept: application/vnd.raftlog.batch`) send the
stored batch bytes unchanged, each framed by its base offset and length:

    repeated: base_offset i64, batch_bytes u32, batch (bytes as stored)

with the read's positions in headers (`Raftlog-Next-Offset`,
`Raftlog-High-Watermark`, `Raftlog-Log-Start-Offset`). Batches are whole: the
first one may start before the requested offset, and a client skips those
records (their offsets are `base_offset + i`). JSON answers start exactly at the
requested offset and hold at most `max_records`.

`wait_ms` long-polls at the high watermark; the wait is bounded by
`WAIT_MS_MAX` (multiraft/node/partition_ops.py) and the request by that plus the request timeout.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson
from aiohttp import web

from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.limits import (
    BATCH_CONTENT_TYPE,
    CONSUME_MAX_BYTES_DEFAULT,
    CONSUME_MAX_RECORDS_DEFAULT,
    REQUEST_TIMEOUT_S,
)
from multiraft.http.params import path_partition, query_int, query_str
from multiraft.http.records import FORMATS, render_batch
from multiraft.node.api import MAX_BYTES_MAX, MAX_RECORDS_MAX, WAIT_MS_MAX, ConsumeResult
from storage.batch import FLAG_COMPRESSION_MASK

BATCH_FRAME = struct.Struct(">qI")
# Stored bytes a JSON answer renders on the event loop; beyond, or for a compressed
# batch, it renders in a worker thread (the loop keeps turning every switch interval).
RENDER_INLINE_BYTES_MAX = 1024 * 1024


async def consume(request: web.Request) -> web.StreamResponse:
    node = node_of(request)
    topic = request.match_info["topic"]
    partition = path_partition(request)
    offset = query_int(request, "offset", low=0, high=2**63 - 1)
    max_records = query_int(request, "max_records", CONSUME_MAX_RECORDS_DEFAULT, low=1,
                            high=MAX_RECORDS_MAX)
    max_bytes = query_int(request, "max_bytes", CONSUME_MAX_BYTES_DEFAULT, low=1, high=MAX_BYTES_MAX)
    wait_ms = query_int(request, "wait_ms", 0, low=0, high=WAIT_MS_MAX)
    isolation = query_str(request, "isolation", "committed", ("committed", "uncommitted"))
    fmt = query_str(request, "format", "json", FORMATS)
    binary = BATCH_CONTENT_TYPE in request.headers.get("Accept", "")
    node.partition_group(topic, partition)  # 404 for an unknown topic or partition
    result = await bounded(
        node.consume(topic, partition, offset, max_records=max_records, max_bytes=max_bytes,
                              wait_ms=wait_ms, isolation=isolation),
        "consume", REQUEST_TIMEOUT_S + wait_ms / 1000,
    )
    if binary:
        return await _binary(request, result)
    if _costly(result.batches):
        body = await asyncio.to_thread(_json_answer, result, fmt, offset, max_records)
    else:
        body = _json_answer(result, fmt, offset, max_records)
    return web.Response(body=body, content_type="application/json")


def _costly(batches: list[tuple[int, int, bytes]]) -> bool:
    """Whether rendering could hold the event loop for more than a few ms: a compressed
    batch inflates (up to 16 MiB) before its records can be sliced out."""
    return sum(len(b) for _, _, b in batches) > RENDER_INLINE_BYTES_MAX or any(
        len(b) > 5 and b[5] & FLAG_COMPRESSION_MASK for _, _, b in batches)


def _json_answer(result: ConsumeResult, fmt: str, offset: int, max_records: int) -> bytes:
    records: list[dict[str, Any]] = []
    next_offset = result.next_offset
    for base, _count, batch in result.batches:
        render_batch(base, batch, fmt, records, max_records, skip_below=offset)
        if len(records) >= max_records:
            next_offset = records[-1]["offset"] + 1
            break
    # orjson: the JSON answer is the consume hot path, and stdlib json doubled its cost.
    return orjson.dumps({
        "records": records, "next_offset": next_offset, "high_watermark": result.high_watermark,
        "log_start_offset": result.log_start_offset,
    })


async def _binary(request: web.Request, result: ConsumeResult) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": BATCH_CONTENT_TYPE,
        "Raftlog-Next-Offset": str(result.next_offset),
        "Raftlog-High-Watermark": str(result.high_watermark),
        "Raftlog-Log-Start-Offset": str(result.log_start_offset),
    })
    response.content_length = sum(BATCH_FRAME.size + len(b) for _, _, b in result.batches)
    await response.prepare(request)
    for base, _count, batch in result.batches:
        await response.write(BATCH_FRAME.pack(base, len(batch)))
        await response.write(batch)
    await response.write_eof()
    return response
