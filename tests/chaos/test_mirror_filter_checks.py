"""The filtered mirror's checks (chaos/mirror_filter_checks.py) against hand-made logs:
a clean copy passes; a leaked record, a lost matching record, a record at a shifted
offset, a doubled offset and a missing gap each fail with their class."""

from __future__ import annotations

from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy
from chaos.mirror_filter_checks import (
    Rec,
    check_consumed,
    check_filtered,
    matches,
    records_of,
    summary_part,
)
from storage.batch import Compression, Record, encode_batch, encode_gap_batch

KEY = PartitionKey("filt-a", 0)
FILTER = [{"key_prefix": "k1"}, {"header": "keep", "value": "yes"}]
T0 = 1_800_000_000_000


def rec(key: str | None, value: str, headers: tuple[tuple[str, bytes], ...] = (), delta: int = 0) -> Record:
    return Record(None if key is None else key.encode(), value.encode(), headers, delta)


# Three source batches: a mixed one (kept, other, other, kept, kept), one all kept, one all other.
SOURCE_BATCHES = [
    [rec("k1-1", "v1"), rec("k2-2", "v2", delta=3), rec(None, "v3", (("keep", b"no"),), 4),
     rec("x", "v4", (("keep", b"yes"),), 5), rec("k10", "v5", delta=9)],
    [rec("k1-6", "v6", (("trace", b"1"),))],
    [rec("K1-7", "v7"), rec("k2-8", "v8", (("kept", b"yes"),), 1)],
]


def source_log(compression: Compression = Compression.NONE) -> LogCopy:
    batches, base = [], 0
    for i, records in enumerate(SOURCE_BATCHES):
        batches.append((base, encode_batch(records, first_timestamp_ms=T0 + i * 100, compression=compression)))
        base += len(records)
    return LogCopy(0, base, tuple(batches))


def filtered(source: LogCopy) -> list[tuple[int, bytes]]:
    """A reference filter of the source, as the product's model says (runs and gaps)."""
    out: list[tuple[int, bytes]] = []
    for (base, _), records in zip(source.batches, SOURCE_BATCHES, strict=True):
        first = T0 + 100 * [b for b, _ in source.batches].index(base)
        runs: list[tuple[bool, list[Record]]] = []
        for record in records:
            kept = matches(record.key, record.headers, FILTER)
            if runs and runs[-1][0] == kept:
                runs[-1][1].append(record)
            else:
                runs.append((kept, [record]))
        at = base
        for kept, run in runs:
            out.append((at, encode_batch(run, first_timestamp_ms=first) if kept
                        else encode_gap_batch(len(run), first_timestamp_ms=first)))
            at += len(run)
    return out


def sink_log(batches: list[tuple[int, bytes]], end: int = 8) -> LogCopy:
    return LogCopy(0, end, tuple(sorted(batches, key=lambda b: b[0])))


def names(verdict_anomalies: list) -> list[str]:
    return sorted({a.name for a in verdict_anomalies})


def test_matches_is_the_documented_filter() -> None:
    assert matches(b"k1-x", (), FILTER) and matches(b"k10", (), FILTER)
    assert not matches(None, (), FILTER) and not matches(b"K1", (), FILTER) and not matches(b"xk1", (), FILTER)
    assert matches(None, (("a", b""), ("keep", b"yes")), FILTER)
    assert not matches(None, (("keep", b"yes!"),), FILTER) and not matches(None, (("kept", b"yes"),), FILTER)
    assert matches(None, (("keep", b"anything"),), [{"header": "keep"}])


def test_a_clean_filtered_copy_passes_and_is_counted() -> None:
    source = source_log()
    verdict = check_filtered(KEY, source, sink_log(filtered(source)), FILTER)
    assert verdict.anomalies == []
    assert (verdict.matching, verdict.gap_offsets, verdict.gap_batches, verdict.split) == (4, 4, 2, 1)
    assert verdict.identical


def test_compressed_source_batches_compare_by_records() -> None:
    source = source_log(Compression.ZLIB)
    assert check_filtered(KEY, source, sink_log(filtered(source)), FILTER).anomalies == []


def test_a_leaked_record_fails() -> None:
    source = source_log()
    batches = [b for b in filtered(source) if b[0] != 1]  # the gap at 1..2 ...
    batches.append((1, encode_batch([rec("k2-2", "v2", delta=3)], first_timestamp_ms=T0)))  # ... with a record
    batches.append((2, encode_gap_batch(1, first_timestamp_ms=T0)))
    verdict = check_filtered(KEY, source, sink_log(batches), FILTER)
    assert names(verdict.anomalies) == ["mirror-filter-leaked"]


def test_a_whole_batch_copied_unfiltered_leaks() -> None:
    source = source_log()
    batches = [*(b for b in filtered(source) if b[0] != 6), source.batches[2]]
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-filter-leaked"]


def test_a_lost_matching_record_fails() -> None:
    source = source_log()
    batches = [b for b in filtered(source) if b[0] != 5] + [(5, encode_gap_batch(1, first_timestamp_ms=T0))]
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-lost"]


def test_a_record_at_a_shifted_offset_fails() -> None:
    source = source_log()
    # The run at 3..4 written one offset late: 3 a gap, 4..5 the run, the all-kept batch's 5 lost.
    batches = [b for b in filtered(source) if b[0] not in (3, 5)]
    batches += [(3, encode_gap_batch(1, first_timestamp_ms=T0)),
                (4, encode_batch([rec("x", "v4", (("keep", b"yes"),), 5), rec("k10", "v5", delta=9)],
                                 first_timestamp_ms=T0))]
    found = names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies)
    assert "mirror-differs" in found and "mirror-lost" in found


def test_another_timestamp_or_header_differs() -> None:
    source = source_log()
    batches = [b for b in filtered(source) if b[0] != 5]
    batches.append((5, encode_batch([rec("k1-6", "v6", (("trace", b"2"),))], first_timestamp_ms=T0 + 100)))
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-differs"]
    batches[-1] = (5, encode_batch([rec("k1-6", "v6", (("trace", b"1"),))], first_timestamp_ms=T0 + 101))
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-differs"]


def test_a_doubled_offset_fails() -> None:
    source = source_log()
    batches = [*filtered(source), (6, encode_gap_batch(1, first_timestamp_ms=T0))]  # 6 covered twice
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-duplicate"]


def test_a_run_appended_twice_fails() -> None:
    source = source_log()
    batches = filtered(source)
    batches.append((0, dict(batches)[0]))
    assert "mirror-duplicate" in names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies)


def test_a_missing_gap_fails() -> None:
    source = source_log()
    batches = [b for b in filtered(source) if b[0] != 6]  # the all-other batch's gap
    assert names(check_filtered(KEY, source, sink_log(batches), FILTER).anomalies) == ["mirror-differs"]


def test_a_batch_across_source_batches_fails() -> None:
    source = source_log()
    # The run 3..4 and the kept batch at 5 as one batch (timestamps as the source's): same
    # records at the same offsets, but a sink batch that crosses a source batch's end.
    wrong = [b for b in filtered(source) if b[0] not in (3, 5)]
    wrong.append((3, encode_batch([rec("x", "v4", (("keep", b"yes"),), 5), rec("k10", "v5", delta=9),
                                   rec("k1-6", "v6", (("trace", b"1"),), 100)], first_timestamp_ms=T0)))
    found = check_filtered(KEY, source, sink_log(wrong), FILTER).anomalies
    assert [a.name for a in found] == ["mirror-differs"] and "bounds" in found[0].explanation


def test_ends() -> None:
    source = source_log()
    short = [b for b in filtered(source) if b[0] < 5]
    assert names(check_filtered(KEY, source, sink_log(short, end=5), FILTER).anomalies) == ["mirror-incomplete"]
    assert names(check_filtered(KEY, source, None, FILTER).anomalies) == ["mirror-incomplete"]
    longer = [*filtered(source), (8, encode_gap_batch(2, first_timestamp_ms=T0))]
    assert "mirror-differs" in names(check_filtered(KEY, source, sink_log(longer, end=10), FILTER).anomalies)


def consumed_of(batches: list[tuple[int, bytes]]) -> list[Rec]:
    return records_of(LogCopy(0, 8, tuple(batches)))


def test_the_consume_route_returns_exactly_the_matching_records() -> None:
    source = source_log()
    good = consumed_of(filtered(source))
    assert [r.offset for r in good] == [0, 3, 4, 5]
    assert check_consumed(KEY, source, good, 8, FILTER) == []
    leaked = [*good, Rec(6, b"K1-7", b"v7", (), T0 + 200)]
    assert names(check_consumed(KEY, source, leaked, 8, FILTER)) == ["mirror-filter-leaked"]
    assert names(check_consumed(KEY, source, good[:-1], 8, FILTER)) == ["mirror-lost"]
    assert check_consumed(KEY, source, good[:-1], 5, FILTER) == []  # read to 5: offset 5 not judged
    shifted = [r._replace(offset=r.offset + 1) if r.offset == 5 else r for r in good]
    assert names(check_consumed(KEY, source, shifted, 8, FILTER)) == ["mirror-differs", "mirror-lost"]
    assert names(check_consumed(KEY, source, good + good[:1], 8, FILTER)) == ["mirror-duplicate"]


def test_summary_says_not_exercised_without_gaps() -> None:
    part = {"topic": "filt-a", "partitions": 2, "identical": 2, "matching": 10, "gap_offsets": 0,
            "gap_batches": 0, "split": 0, "consumed": 5, "consume_key": "filt-a/0"}
    assert summary_part(part).startswith("filtered: NOT EXERCISED")
    assert summary_part(part | {"gap_offsets": 3}).startswith("filtered: filt-a 2/2 partitions identical, 10 ")
