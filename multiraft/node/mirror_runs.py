"""One source answer as a mirror's entries: what the pull proposes and a filtered verify hashes
(docs/mirror.md "Record filters").

Shared by the pull (mirror_pull.py) and the filtered verify (mirror_verify_filtered.py), so
both read the source's answer by the same rules:

- `contiguous`: the answer's batches from a position on, checked to follow one another.
  An unfiltered mirror holds the source's batches byte for byte, so its position is always
  a source batch's base: a batch across it means another log (`Diverged`). A filtered
  mirror's entries are the runs and gaps of split source batches, so its position (the
  pull's after a kept-prefix resync cut at a run, a verify's start after the sink's
  retention or at a span's leaf-aligned start) may lie inside a source batch: with
  `inside`, the first batch may straddle it.
- `filter_from`: the batches through the link's filter, with their bases, from the
  position on. The straddling batch is filtered whole (a run's bytes depend on the whole
  batch) and the outputs below the position dropped. Any fault the filter meets in the
  source's bytes (a batch that does not check; a value the encoder refuses, as a timestamp
  past i64) is the source's: `SourceError`, so the pull backs off as for any source
  fault instead of its task dying and restarting at once.
- `pieces`: a filtered chunk as several proposals, each at most `ENTRIES_PER_PROPOSAL_MAX`
  entries and a chunk's bytes: a batch of 100,000 alternating records becomes 100,000
  entries (compressed, 44 times its bytes), which one proposal should not carry. Every
  output boundary is a source offset the sink's log ends at once the outputs before it
  are in, so each piece is guarded as a chunk of its own (mirror_append.py).
"""

from __future__ import annotations

import struct

from multiraft.metadata.record_filter import RecordMatcher
from multiraft.node.mirror_filter import filter_chunk
from multiraft.node.mirror_source import Diverged, SourceError
from storage.batch import read_header
from storage.errors import InvalidBatchError

ENTRIES_PER_PROPOSAL_MAX = 1024  # entries (batches) one proposal of a filtered chunk carries at most
# What filtering a source's batch may raise on bytes that passed its check: the source's fault.
FILTER_FAULTS = (InvalidBatchError, struct.error, OverflowError, ValueError)


def contiguous(batches: list[tuple[int, bytes]], position: int, *,
               inside: bool = False) -> tuple[list[bytes], int, int]:
    """The batches from `position` on, checked to follow one another without a gap:
    (payloads, the first one's base, the offset after them). The first base is `position`
    unless `inside` let the first batch straddle it. A batch across the position (without
    `inside`) or a gap means the source is not the log this mirror copied (`Diverged`)."""
    payloads: list[bytes] = []
    first = expected = position
    for base, data in batches:
        try:
            count = read_header(data).record_count
        except InvalidBatchError as error:
            raise SourceError(f"the source sent a batch that does not decode: {error}") from None
        if base + count <= expected and not payloads:
            continue  # a whole batch before the position (the read's first may start earlier)
        if inside and not payloads and base < position:
            first = base  # straddles the position: filtered whole, its outputs below it dropped
        elif base != expected:
            raise Diverged(f"the source's batch at {base} does not follow offset {expected} "
                           "(its log is not the one this mirror copied)")
        payloads.append(data)
        expected = base + count
    return payloads, first, expected


def filter_from(matcher: RecordMatcher, payloads: list[bytes], first: int, position: int,
                skipped: tuple[tuple[int, int], ...] = ()) -> list[tuple[int, bytes]]:
    """The contiguous source batches starting at `first` through the filter, as (base, bytes),
    those based below `position` left out (pure; run it in a worker thread)."""
    try:
        out = filter_chunk(matcher, payloads, first, skipped)
    except FILTER_FAULTS as error:
        raise SourceError(f"the source sent a batch the filter cannot read: {error!r}") from None
    kept: list[tuple[int, bytes]] = []
    base = first
    for data in out:
        if base >= position:
            kept.append((base, data))
        base += read_header(data).record_count
    return kept


def starting_at(outputs: list[tuple[int, bytes]], position: int) -> list[bytes]:
    """The pull's outputs, which must start exactly at `position` (the sink's log end): else
    the position is no output boundary of the source's filtered batch, so the mirror's log
    is not this source's (`Diverged`, as an unfiltered batch across the position)."""
    if not outputs or outputs[0][0] != position:
        at = outputs[0][0] if outputs else "the chunk's end"
        raise Diverged(f"offset {position} is no batch boundary of the source's filtered batch (next at {at}): "
                       "its log is not the one this mirror copied")
    return [data for _, data in outputs]


def pieces(payloads: list[bytes], start: int, bytes_max: int,
           entries_max: int = ENTRIES_PER_PROPOSAL_MAX) -> list[tuple[int, int, list[bytes]]]:
    """Contiguous batches from offset `start` as proposals (start, end, batches) of at most
    `entries_max` batches and `bytes_max` bytes each (one batch alone may be larger)."""
    assert entries_max >= 1 and bytes_max >= 1
    out: list[tuple[int, int, list[bytes]]] = []
    current: list[bytes] = []
    size = 0
    begin = end = start
    for data in payloads:
        if current and (len(current) >= entries_max or size + len(data) > bytes_max):
            out.append((begin, end, current))
            current, size, begin = [], 0, end
        current.append(data)
        size += len(data)
        end += read_header(data).record_count
    if current:
        out.append((begin, end, current))
    return out
