"""The mirror checks of a `--mirror` run (chaos/mirror.py): pure functions over what the
run read at its end and sampled during it.

A mirror topic in the sink cluster must hold its source topic's log with the same
offsets and the same stored batch bytes, never less (once caught up), never more,
and its pull position, replicated state, must never go back. After the heal the
runner waits (bounded) for every mirror partition to reach the source's end, reads
both logs whole through the `/log` route (stored batches, skipped ones included)
and hands them here with the positions sampled from `GET /v1/admin/mirrors/{name}`:

- `mirror-lost`: a record the source's log holds (below the sink's end) that no
  sink batch holds: a skipped batch, a log started late;
- `mirror-differs`: offsets not identical (a source batch's base offset that starts
  no sink batch, or the reverse, or the sink holding offsets past the source's end)
  or a batch at one base offset with other bytes; also a pull that said `diverged`;
- `mirror-duplicate`: a value the sink holds more times than the source (a batch
  appended twice);
- `mirror-position-backwards`: a partition's position, as one sink node incarnation
  reported it while pulling, below one it reported before; or a position reported
  above the end of the sink's caught-up log (copied offsets that vanished);
- `mirror-incomplete`: the sink did not reach the source's end within the bound: its
  own verdict, never counted as lost (the offsets past the sink's end are not judged).

Values are the workload's (unique per partition on the source); they are compared as
the stored record value bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from chaos.anomalies import Anomaly, anomaly, listing, offset_runs
from chaos.history import PartitionKey
from storage.batch import decode_columns, read_header

# Pull states whose position was set by the pull itself (from the leader's applied log):
# `starting`, `resyncing` and `paused` may still show a new status object's 0.
SETTLED_STATES = frozenset({"running", "backing_off", "source_truncated", "diverged"})


@dataclass(frozen=True, slots=True)
class LogCopy:
    """One side's log of one partition as read at the end: stored batches by base offset."""

    log_start: int
    high_watermark: int
    batches: tuple[tuple[int, bytes], ...]
    # (base offset, records) of the batches the log holds but skips on reads (`Raftlog-Skipped`:
    # a producer's retried duplicates); a mirror must skip the same ones.
    skipped: tuple[tuple[int, int], ...] = ()

    def records(self, below: int) -> list[tuple[int, bytes | None]]:
        """(offset, value) of every record below `below`."""
        found: list[tuple[int, bytes | None]] = []
        for base, data in self.batches:
            if base >= below:
                break
            for index, value in enumerate(decode_columns(data).values):
                if base + index < below:
                    found.append((base + index, value))
        return found


@dataclass(frozen=True, slots=True)
class PositionSample:
    """One partition's pull position as a sink node incarnation reported it."""

    at_s: float  # since the run began
    node: str  # the sink node incarnation pulling it, e.g. `s2#1`
    key: PartitionKey
    state: str
    position: int


@dataclass
class MirrorVerdicts:
    anomalies: list[Anomaly] = field(default_factory=list)
    compared: int = 0  # partitions compared
    identical: int = 0  # of them: the same offsets and bytes up to the source's end
    records: int = 0  # records compared


def check_mirror(source: Mapping[PartitionKey, LogCopy], sink: Mapping[PartitionKey, LogCopy | None],
                 samples: Iterable[PositionSample] = (), diverged: Iterable[tuple[PartitionKey, str]] = (),
                 waited_s: float = 0.0) -> MirrorVerdicts:
    """`sink[key]` None: the sink's copy could not be read at all (incomplete)."""
    verdicts = MirrorVerdicts()
    ends: dict[PartitionKey, int] = {}
    for key in sorted(source):
        mine, theirs = source[key], sink.get(key)
        verdicts.compared += 1
        if theirs is None:
            verdicts.anomalies.append(anomaly("mirror-incomplete", key, f"the sink's copy was not read in "
                                              f"{waited_s:.0f} s; source end {mine.high_watermark}", ()))
            continue
        found = compare_logs(key, mine, theirs, waited_s)
        verdicts.anomalies += found
        verdicts.records += max(0, min(mine.high_watermark, theirs.high_watermark) - mine.log_start)
        if not found:
            verdicts.identical += 1
        if theirs.high_watermark >= mine.high_watermark:
            ends[key] = theirs.high_watermark  # caught up: every position reported is at most this
    verdicts.anomalies += positions_backwards(samples, ends)
    for key, text in diverged:
        verdicts.anomalies.append(anomaly("mirror-differs", key, f"the pull said diverged: {text}", ()))
    return verdicts


def compare_ends(key: PartitionKey, source: LogCopy, sink: LogCopy, waited_s: float, what: str) -> list[Anomaly]:
    """The two ends: a sink short of the source's end has not caught up within the bound
    (incomplete, the offsets past it not judged); one past it holds offsets the source never had."""
    found: list[Anomaly] = []
    if sink.high_watermark < source.high_watermark:
        found.append(anomaly("mirror-incomplete", key, f"{what} reached {sink.high_watermark} of the source's "
                             f"{source.high_watermark} in {waited_s:.0f} s (offsets past it not judged)", ()))
    if sink.high_watermark > source.high_watermark:
        found.append(anomaly("mirror-differs", key, f"{what} holds offsets {source.high_watermark}.."
                             f"{sink.high_watermark - 1} past the source's end {source.high_watermark}", ()))
    return found


def compare_logs(key: PartitionKey, source: LogCopy, sink: LogCopy, waited_s: float = 0.0) -> list[Anomaly]:
    """The sink's copy of one partition against the source's log, up to the lesser end."""
    found = compare_ends(key, source, sink, waited_s, "the sink")
    end = min(source.high_watermark, sink.high_watermark)
    ours = {base: data for base, data in source.batches if base < end}
    theirs = {base: data for base, data in sink.batches if base < end}
    missing = sorted(base for base in ours if base not in theirs and base >= sink.log_start)
    extra = sorted(base for base in theirs if base not in ours)
    other = sorted(base for base in ours.keys() & theirs.keys() if ours[base] != theirs[base])
    if missing or extra:
        parts = ([f"source batches at {listing(missing)} start no sink batch"] if missing else []) + \
                ([f"sink batches at {listing(extra)} start no source batch"] if extra else [])
        found.append(anomaly("mirror-differs", key, f"offsets not identical: {'; '.join(parts)}", ()))
    if other:
        found.append(anomaly("mirror-differs", key, f"{len(other)} batches with other bytes at base offsets "
                             f"{listing(other)}", ()))
    ours_skipped = {r for r in source.skipped if r[0] < end}
    theirs_skipped = {r for r in sink.skipped if r[0] < end}
    if ours_skipped != theirs_skipped:
        parts = ([f"the source skips {listing(sorted(b for b, _ in ours_skipped - theirs_skipped))}, the sink does "
                  "not"] if ours_skipped - theirs_skipped else []) + \
                ([f"the sink skips {listing(sorted(b for b, _ in theirs_skipped - ours_skipped))}, the source does "
                  "not"] if theirs_skipped - ours_skipped else [])
        found.append(anomaly("mirror-differs", key, f"skipped batches differ: {'; '.join(parts)}", ()))
    # Values by what each side holds whole (a value shifted past the lesser end is still
    # held); only the source's records below the sink's end must be on the sink.
    everything = max(source.high_watermark, sink.high_watermark) + 1
    held = Counter(value for _, value in sink.records(everything))
    counted = Counter(value for _, value in source.records(everything))
    lost = sorted(offset for offset, value in source.records(end) if held[value] == 0)
    if lost:
        runs = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in offset_runs(lost)[:8])
        found.append(anomaly("mirror-lost", key, f"{len(lost)} records of the source missing on the sink "
                             f"(source offsets {runs}; sink log start {sink.log_start}, end {sink.high_watermark})",
                             ()))
    twice = sorted((value for value in held if value in counted and held[value] > counted[value]),
                   key=lambda v: v or b"")
    if twice:
        found.append(anomaly("mirror-duplicate", key, f"{len(twice)} values more often on the sink than on the "
                             f"source: {listing([_shown(v) for v in twice])}", ()))
    return found


def positions_backwards(samples: Iterable[PositionSample], ends: Mapping[PartitionKey, int]) -> list[Anomaly]:
    """Positions that went back within one sink node incarnation, and positions past the
    end of a caught-up sink log. Samples not in a settled state are not judged."""
    found: list[Anomaly] = []
    last: dict[tuple[str, PartitionKey], PositionSample] = {}
    highest: dict[PartitionKey, PositionSample] = {}
    for sample in sorted(samples, key=lambda s: s.at_s):
        if sample.state not in SETTLED_STATES:
            continue
        before = last.get((sample.node, sample.key))
        if before is not None and sample.position < before.position:
            found.append(anomaly("mirror-position-backwards", sample.key,
                                 f"{sample.node} reported position {before.position} at {before.at_s:.1f} s "
                                 f"({before.state}), then {sample.position} at {sample.at_s:.1f} s ({sample.state})",
                                 ()))
        last[(sample.node, sample.key)] = sample
        if sample.key not in highest or sample.position > highest[sample.key].position:
            highest[sample.key] = sample
    for key, sample in sorted(highest.items()):
        if key in ends and sample.position > ends[key]:
            found.append(anomaly("mirror-position-backwards", key,
                                 f"{sample.node} reported position {sample.position} at {sample.at_s:.1f} s; "
                                 f"the caught-up sink log ends at {ends[key]}", ()))
    return found


def record_count(data: bytes) -> int:
    return read_header(data).record_count


def _shown(value: bytes | None) -> str:
    if value is None:
        return "null"
    text = value.decode("utf-8", "replace")
    return text if len(text) <= 40 else text[:40] + "..."


def summary_part(verdicts: MirrorVerdicts, promote: str, samples: Sequence[PositionSample]) -> str:
    """`mirror: 8/8 partitions identical (12,345 records), 420 positions sampled, promote: ...`"""
    return (f"mirror: {verdicts.identical}/{verdicts.compared} partitions identical "
            f"({verdicts.records:,} records), {len(samples)} positions sampled, promote: {promote}")
