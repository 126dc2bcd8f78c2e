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
from multiraft.node.mirror_runs import contiguous, filter_from
from multiraft.node.mirror_source import SourceClient
from storage.tictac import LeafAccumulator, TicTacTree, element_hash

# Source bytes one verify of a filtered mirror partition reads. Filtering and hashing the worst
# case, small records alternating matching and not (every record its own output), costs
# about 0.23 s of CPU per MiB (measured on the build host): 8 MiB is under 2 s a partition,
# and a verify call of 16 partitions stays well within its 150 s (VERIFY_TIMEOUT_S).
READ_BYTES_MAX = 8 * 1024 * 1024
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
    batch's end: a batch boundary of the mirror too). `lo` may lie inside a source batch (the
    sink's log start after its retention, a span's leaf-aligned start): that batch is
    filtered whole and its outputs based below `lo` left out, as the sink's tree leaves out
    its batches based below its span (mirror_runs.py). Each output's digest goes straight
    into the leaves: nothing is kept per batch (64 MiB of small records is millions)."""
    assert 0 <= lo <= hi and bytes_max > 0
    start = position = lo
    leaves: LeafAccumulator | None = None
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
        payloads, base, end = contiguous(chunk.batches, position, inside=True)
        if not payloads or position >= hi:
            break
        outputs = await asyncio.to_thread(filter_from, matcher, payloads, base, position, chunk.skipped)
        # Every base fed is below this `hi` and this chunk's end, so below the final cut too.
        leaves = leaves or LeafAccumulator(start, hi)
        for at, data in outputs:
            if at >= hi:
                break
            leaves.add(at, element_hash(at, data))
        read += sum(len(p) for p in payloads)
        position = end
    hi = max(start, min(hi, position))
    cut = LeafAccumulator(start, hi)
    if leaves is not None:
        cut.leaves = leaves.leaves[:len(cut.leaves)]
    return SourceSpan(cut.tree(), source_hw, source_start, read)
