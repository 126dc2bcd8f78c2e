"""Reading one partition's whole log through the `/log` route (stored batches, the
skipped ones named), as the mirror checks compare them: chaos/mirror.py for the
workload's topics, chaos/mirror_follow.py for the topics a run grows and truncates."""

from __future__ import annotations

import asyncio
import contextlib
import time

from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy
from multiraft.client import BATCH_CONTENT_TYPE, AsyncClient, RaftlogError, parse_frames

READ_BYTES = 1 << 20


async def read_until(client: AsyncClient, servers: list[str], key: PartitionKey, end: int,
                      deadline: float) -> LogCopy | None:
    """The whole log of one partition through `/log`, from a server whose answer reaches
    `end` (asked again, rotating servers, until then or `deadline`); the last read that
    got through when none did (None: nothing got through)."""
    best: LogCopy | None = None
    turn = 0
    while True:
        server = servers[turn % len(servers)]
        turn += 1
        with contextlib.suppress(RaftlogError, OSError, ValueError, KeyError):
            copy = await read_log(client, server, key)
            if best is None or copy.high_watermark > best.high_watermark:
                best = copy
            if copy.high_watermark >= end:
                return copy
        if time.monotonic() > deadline:
            return best
        await asyncio.sleep(0.2 if turn % len(servers) == 0 else 0.0)


async def read_log(client: AsyncClient, server: str, key: PartitionKey) -> LogCopy:
    path = f"/v1/topics/{key.topic}/partitions/{key.partition}/log"
    offset, batches, end, start = 0, [], None, None
    skipped: set[tuple[int, int]] = set()
    while True:
        _, body, headers = await client.request("GET", path, params={"offset": offset, "max_bytes": READ_BYTES},
                                                headers={"Accept": BATCH_CONTENT_TYPE}, server=server)
        high, next_offset = int(headers["Raftlog-High-Watermark"]), int(headers["Raftlog-Next-Offset"])
        start = int(headers["Raftlog-Log-Start-Offset"]) if start is None else start
        end = high if end is None else end
        batches += [(base, data) for base, data in parse_frames(body) if base >= offset]
        skipped |= {r for r in parse_skipped(headers.get("Raftlog-Skipped", "")) if r[0] >= offset}
        if next_offset >= end or (next_offset <= offset and offset >= start):  # done, or no progress
            last = min(end, next_offset)
            return LogCopy(start, last, tuple(batches), tuple(sorted(r for r in skipped if r[0] < last)))
        offset = max(next_offset, start)


def parse_skipped(header: str) -> list[tuple[int, int]]:
    """`Raftlog-Skipped: base:count,...` (docs/mirror.md) as (base, count) pairs."""
    pairs = []
    for item in filter(None, header.split(",")):
        base, _, count = item.partition(":")
        pairs.append((int(base), int(count)))
    return pairs


async def read_pair(source_client: AsyncClient, sources: list[str], sink_client: AsyncClient, sinks: list[str],
                    key: PartitionKey, source_end: int, deadline: float) -> tuple[LogCopy | None, LogCopy | None]:
    """Both sides' logs of `key`: the source's until it reaches `source_end`, then the
    sink's until it reaches the source's. A write in flight at the heal can commit on the
    source after its read: where the sink holds more, the source is read again (its end
    only grows)."""
    ours = await read_until(source_client, sources, key, source_end, deadline)
    theirs = await read_until(sink_client, sinks, key, ours.high_watermark if ours is not None else 0, deadline)
    if theirs is not None and ours is not None and theirs.high_watermark > ours.high_watermark:
        again = await read_until(source_client, sources, key, theirs.high_watermark, deadline)
        ours = again if again is not None else ours
    return ours, theirs
