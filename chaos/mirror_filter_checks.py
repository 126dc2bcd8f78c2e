"""The checks of a filtered mirror (chaos/mirror_filtered.py, docs/mirror.md "Record
filters"): pure functions over what the run read at its end.

A filtered mirror keeps its source's offsets: each source batch [b, b+n) is covered on
the sink by batches inside [b, b+n) only, every record that matches the link's filter
at its source offset (key, value, headers, timestamp unchanged), every other offset in
a gap batch (offsets, no records). Read through `/log` (gap batches served as stored):

- `mirror-filter-leaked`: a record on the sink that the filter does not match, or whose
  value is a source record the filter does not match (anywhere in the sink's log);
- `mirror-lost`: a matching source record (below the sink's end) that the sink does not
  hold anywhere;
- `mirror-differs`: a matching record held at another offset (shifted) or with another
  key, headers or timestamp; a source offset below the sink's end that no sink batch
  covers (a gap batch missing); a sink batch that crosses a source batch's bounds or
  lies past the source's end; a sink record the source never held; a sink whose high
  watermark passes the source's;
- `mirror-duplicate`: a source offset covered by two sink batches, or a value the sink
  holds twice;
- `mirror-incomplete`: the sink did not reach the source's end (offsets past it are not
  judged, leaks excepted).

The *consume* route (records, not `/log`) of a partition must return exactly the
matching records below the sink's end, at their offsets: gaps invisible.

The filter's matching is implemented here on its own (`matches`), not imported from the
product: a checker sharing the product's filter would share its bugs.
"""

from __future__ import annotations

import base64
import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from chaos.anomalies import Anomaly, anomaly, listing, offset_runs
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy, compare_ends
from storage.batch import decode_columns, is_gap, read_header

Headers = tuple[tuple[str, bytes], ...]


class Rec(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


def matches(key: bytes | None, headers: Headers, clauses: Sequence[Mapping[str, str]]) -> bool:
    """Any clause matching: `key_prefix` (the key starts with its UTF-8 bytes; no key never
    matches), `header` (a header of that name), `header` + `value` (with that value)."""
    for clause in clauses:
        if "key_prefix" in clause:
            if key is not None and key.startswith(clause["key_prefix"].encode()):
                return True
        elif "value" in clause:
            wanted = (clause["header"], clause["value"].encode())
            if any((name, value) == wanted for name, value in headers):
                return True
        elif any(name == clause["header"] for name, _ in headers):
            return True
    return False


def records_of(copy: LogCopy) -> list[Rec]:
    """Every record of every (non-gap) batch, with its offset and timestamp."""
    found: list[Rec] = []
    for base, data in copy.batches:
        decoded = decode_columns(data)
        first = decoded.header.first_timestamp_ms
        for i, (key, value) in enumerate(zip(decoded.keys, decoded.values, strict=True)):
            found.append(Rec(base + i, key, value, tuple(decoded.headers[i]), first + decoded.timestamp_deltas_ms[i]))
    return found


@dataclass
class FilterVerdict:
    anomalies: list[Anomaly] = field(default_factory=list)
    matching: int = 0  # matching source records checked (below the sink's end)
    gap_offsets: int = 0  # sink offsets in gap batches (below the sink's end)
    gap_batches: int = 0
    split: int = 0  # source batches holding matching and other records both
    identical: bool = True


def check_filtered(key: PartitionKey, source: LogCopy, sink: LogCopy | None, clauses: Sequence[Mapping[str, str]],
                   waited_s: float = 0.0) -> FilterVerdict:
    verdict = FilterVerdict()
    found = verdict.anomalies
    if sink is None:
        found.append(anomaly("mirror-incomplete", key, f"the filtered mirror was not read in {waited_s:.0f} s; "
                             f"source end {source.high_watermark}", ()))
        verdict.identical = False
        return verdict
    end = min(source.high_watermark, sink.high_watermark)
    found += compare_ends(key, source, sink, waited_s, "the filtered mirror")
    found += _coverage(key, source, sink, end, verdict)
    found += _records(key, source, sink, end, clauses, verdict)
    verdict.identical = not found
    return verdict


def _coverage(key: PartitionKey, source: LogCopy, sink: LogCopy, end: int, verdict: FilterVerdict) -> list[Anomaly]:
    """Every source offset in [log start, end) covered by exactly one sink batch, each
    sink batch inside one source batch."""
    found: list[Anomaly] = []
    spans = sorted((base, read_header(data).record_count, is_gap(data)) for base, data in sink.batches)
    source_spans = sorted((base, read_header(data).record_count) for base, data in source.batches)
    missing: list[tuple[int, int]] = []
    doubled: list[tuple[int, int]] = []
    covered = max(source.log_start, sink.log_start)
    if sink.log_start > source.log_start:
        missing.append((source.log_start, min(sink.log_start, end)))
    for base, count, gap in spans:
        if gap and base < end:
            verdict.gap_batches += 1
            verdict.gap_offsets += min(base + count, end) - base
        if base > covered and covered < end:
            missing.append((covered, min(base, end)))
        if base < covered:
            doubled.append((base, min(covered, base + count)))
        covered = max(covered, base + count)
    if covered < end:
        missing.append((covered, end))
    if missing:
        shown = ", ".join(f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in missing[:8])
        found.append(anomaly("mirror-differs", key, f"{sum(b - a for a, b in missing)} source offsets covered by no "
                             f"sink batch (a gap batch or run missing): {shown}", ()))
    if doubled:
        shown = ", ".join(f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in doubled[:8])
        found.append(anomaly("mirror-duplicate", key, f"{sum(b - a for a, b in doubled)} offsets covered by two sink "
                             f"batches: {shown}", ()))
    bounds = {base: base + count for base, count in source_spans}
    starts = [base for base, _ in source_spans]
    crossing = []
    for base, count, _ in spans:
        owner = _owner(starts, base)
        if owner is None or base + count > bounds[owner]:
            if base < source.high_watermark:  # past the source's end: said by the high watermark
                crossing.append(base)
    if crossing:
        found.append(anomaly("mirror-differs", key, f"sink batches at {listing(crossing)} lie across a source batch's "
                             f"bounds", ()))
    return found


def _owner(starts: list[int], offset: int) -> int | None:
    """The base of the source batch holding `offset` (by the bases alone: None below the first)."""
    at = bisect.bisect_right(starts, offset) - 1
    return starts[at] if at >= 0 else None


def _records(key: PartitionKey, source: LogCopy, sink: LogCopy, end: int, clauses: Sequence[Mapping[str, str]],
             verdict: FilterVerdict) -> list[Anomaly]:
    found: list[Anomaly] = []
    skipped = [(b, b + n) for b, n in source.skipped]
    source_records = records_of(source)
    kept = {r.offset: r for r in source_records
            if matches(r.key, r.headers, clauses) and not any(a <= r.offset < b for a, b in skipped)}
    others = {r.value for r in source_records if r.offset not in kept}
    source_values = {r.value for r in source_records}
    mixed: Counter[bool] = Counter()
    for base, data in source.batches:
        count = read_header(data).record_count
        flags = {r in kept for r in range(base, base + count)}
        mixed[len(flags) == 2] += 1
    verdict.split = mixed[True]
    held = records_of(sink)
    at = {r.offset: r for r in held}
    by_value: dict[bytes | None, list[int]] = {}
    for r in held:
        by_value.setdefault(r.value, []).append(r.offset)
    lost, shifted, altered = [], [], []
    for offset, rec in sorted(kept.items()):
        if offset < source.log_start or offset >= end:
            continue
        verdict.matching += 1
        theirs = at.get(offset)
        if theirs is not None and theirs.value == rec.value:
            if theirs != rec:
                altered.append(offset)
        elif rec.value in by_value:
            shifted.append(f"{offset}->{listing(by_value[rec.value])}")
        else:
            lost.append(offset)
    if lost:
        runs = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in offset_runs(lost)[:8])
        found.append(anomaly("mirror-lost", key, f"{len(lost)} matching source records on no sink batch (source "
                             f"offsets {runs}; sink log {sink.log_start}..{sink.high_watermark})", ()))
    if shifted:
        found.append(anomaly("mirror-differs", key, f"{len(shifted)} matching records at another offset on the sink: "
                             f"{listing(shifted)}", ()))
    if altered:
        found.append(anomaly("mirror-differs", key, f"{len(altered)} matching records with another key, headers or "
                             f"timestamp on the sink at {listing(altered)}", ()))
    leaked = [r.offset for r in held if r.value in others or not matches(r.key, r.headers, clauses)]
    if leaked:
        found.append(anomaly("mirror-filter-leaked", key, f"{len(leaked)} records the filter does not match on the "
                             f"sink at {listing(leaked)}", ()))
    strange = [r.offset for r in held if r.value not in source_values and r.offset < source.high_watermark]
    if strange:
        found.append(anomaly("mirror-differs", key, f"{len(strange)} sink records the source does not hold at "
                             f"{listing(strange)}", ()))
    twice = sorted(offsets[0] for value, offsets in by_value.items() if len(offsets) > 1)
    if twice:
        found.append(anomaly("mirror-duplicate", key, f"{len(twice)} values held more than once on the sink "
                             f"(first at {listing(twice)})", ()))
    return found


def check_consumed(key: PartitionKey, source: LogCopy, consumed: Iterable[Rec], end: int,
                   clauses: Sequence[Mapping[str, str]]) -> list[Anomaly]:
    """The sink's consume route read from the source's log start to `end` (the sink's end):
    exactly the matching source records there, at their offsets, gaps invisible."""
    skipped = [(b, b + n) for b, n in source.skipped]
    source_records = records_of(source)
    kept = {r.offset: r for r in source_records if source.log_start <= r.offset < end
            and matches(r.key, r.headers, clauses) and not any(a <= r.offset < b for a, b in skipped)}
    others = {r.value for r in source_records} - {r.value for r in kept.values()}
    found: list[Anomaly] = []
    got = list(consumed)
    seen = Counter(r.offset for r in got)
    leaked = [r.offset for r in got if r.value in others or not matches(r.key, r.headers, clauses)]
    wrong = [r.offset for r in got if r.offset in kept and r != kept[r.offset] and r.offset not in leaked]
    stray = [r.offset for r in got if r.offset not in kept and r.offset not in leaked]
    lost = sorted(offset for offset in kept if offset not in seen)
    twice = sorted(offset for offset, n in seen.items() if n > 1)
    if leaked:
        found.append(anomaly("mirror-filter-leaked", key, f"the consume route returned {len(leaked)} records the "
                             f"filter does not match, at {listing(leaked)}", ()))
    if wrong or stray:
        found.append(anomaly("mirror-differs", key, f"the consume route returned records unlike the source's at "
                             f"{listing(sorted(wrong + stray))}", ()))
    if lost:
        runs = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in offset_runs(lost)[:8])
        found.append(anomaly("mirror-lost", key, f"the consume route did not return {len(lost)} matching records "
                             f"(source offsets {runs}; read to {end})", ()))
    if twice:
        found.append(anomaly("mirror-duplicate", key, f"the consume route returned offsets {listing(twice)} twice", ()))
    return found


def consumed_record(item: Mapping[str, Any]) -> Rec:
    """A record of the consume route's answer in `binary` format (base64 fields)."""
    def raw(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)
    headers = tuple((h["name"], base64.b64decode(h["value"])) for h in item.get("headers", []))
    return Rec(int(item["offset"]), raw(item.get("key")), raw(item.get("value")), headers, int(item["timestamp"]))


def summary_part(filtered: Mapping[str, Any]) -> str:
    """`filtered: filt-a 2 partitions, N matching records checked, M gap offsets (G gap
    batches, S source batches split), consume: K records read`; NOT EXERCISED when no
    matching record or no gap was checked."""
    text = (f"{filtered['topic']} {filtered['identical']}/{filtered['partitions']} partitions identical, "
            f"{filtered['matching']:,} matching records checked, {filtered['gap_offsets']:,} gap offsets "
            f"({filtered['gap_batches']:,} gap batches, {filtered['split']:,} source batches split), "
            f"consume: {filtered['consumed']:,} records read on {filtered['consume_key']}")
    if not filtered["matching"] or not filtered["gap_offsets"]:
        return f"filtered: NOT EXERCISED: {text}"
    return f"filtered: {text}"
