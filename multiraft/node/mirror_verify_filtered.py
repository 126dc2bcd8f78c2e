"""A filtered mirror's full sync (docs/mirror.md "Record filters"): the tree it should have,
computed by the sink from the source's log.

The source's trees hash its own batches, unfiltered, so a filtered mirror cannot compare
roots with the source. Instead the sink leader reads the source's log over the span
through `/log` (the pull's read: the skipped batches included and named), passes it through
the link's filter exactly as the pull did (mirror_filter.py, deterministic), and hashes the
result as its own trees hash stored batches (`element_hash(base, bytes)`, by base offset,
into a `LeafAccumulator`). The comparison with its own tree is then local
(`run_descent`). This costs a read of the span from the source, not one root: bounded by
`READ_BYTES_MAX` source bytes a verify of a partition, after which it says how far it got.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node.mirror_filter import filter_chunk
from multiraft.node.mirror_pull import MirrorPulls
from multiraft.node.mirror_source import SourceClient, SourceError
from storage.batch import read_header
from storage.errors import InvalidBatchError
from storage.tictac import LeafAccumulator, TicTacTree, element_hash

READ_BYTES_MAX = 64 * 1024 * 1024  # source bytes one verify of a filtered mirror partition reads
READ_CHUNK_BYTES = 1024 * 1024  # one read of the source's log


@dataclass(frozen=True, slots=True)
class SourceSpan:
    """The tree a filtered mirror should have over [tree.lo, tree.hi), and the source's positions."""

    tree: TicTacTree
    source_high_watermark: int
    source_log_start: int
    bytes_read: int


async def filtered_source_tree(client: SourceClient, topic: str, partition: int, lo: int, hi: int,
                               matcher: RecordMatcher, bytes_max: int) -> SourceSpan:
    """The filtered source's tree from `lo` (or the source's log start, if later) up to `hi`, cut
    to the source's high watermark and to where `bytes_max` source bytes were read (a source
    batch's end: a batch boundary of the mirror too)."""
    assert 0 <= lo <= hi and bytes_max > 0
    start = position = lo
    elements: list[tuple[int, bytes]] = []
    read = source_hw = source_start = 0
    first = True
    while position < hi and read < bytes_max:
        chunk = await client.read_log(topic, partition, position, READ_CHUNK_BYTES, 0)
        source_hw, source_start = chunk.high_watermark, chunk.log_start_offset
        if first and source_start > position:  # the source's retention went past the mirror's start
            start = position = min(source_start, hi)
            first = False
            continue
        first = False
        hi = min(hi, max(position, source_hw))
        payloads, end = MirrorPulls._contiguous(chunk.batches, position)
        if not payloads or position >= hi:
            break
        try:
            filtered = await asyncio.to_thread(filter_chunk, matcher, payloads, position, chunk.skipped)
        except InvalidBatchError as error:
            raise SourceError(f"the source sent a batch the filter cannot read: {error}") from None
        base = position
        for data in filtered:
            elements.append((base, element_hash(base, data)))
            base += read_header(data).record_count
        assert base == end, "a filtered chunk covers the source's offsets exactly"
        read += sum(len(p) for p in payloads)
        position = end
    hi = max(start, min(hi, position))
    leaves = LeafAccumulator(start, hi)
    for base, digest in elements:
        if start <= base < hi:
            leaves.add(base, digest)
    return SourceSpan(leaves.tree(), source_hw, source_start, read)
