"""The history checker: does a chaos history show raftlog breaking its promise?

A port of Jepsen's queue checker (`jepsen.tests.kafka`, CHAOS.md 2.3) plus the
stricter checks our log allows (CHAOS.md 2.4, 5.3). Everything is derived from
one *version order* per partition (`chaos/version_order.py`): which value sits at which
offset, according to every ok poll and every send that must have committed (an
ok send, or an ambiguous one some poll saw a value of). Offsets with no known
value are dropped and the rest numbered 0, 1, 2... (the *dense index*), so
"skipped over" and "went backwards" are measured in values that exist, and a
hole (a refused duplicate batch keeps its offsets, `docs/node.md`) is not
mistaken for a skip. One pass builds it; every check after is a linear pass.

Classes (a single one fails a run):

- `inconsistent-offsets`: one offset holds two different values.
- `duplicate`: one value sits at two offsets (the idempotence check).
- `unexpected`: a poll read a value nobody sent to that partition.
- `G1a`: a poll read a value whose every send failed (a refused write is visible).
- `lost-write`: an acknowledged value below the highest index anyone read was
  never read (Jepsen's bound; conservative when offsets disagree).
- `unseen`: an acknowledged value the final full read did not return. Only this
  tells lost from late, which is why runs end with that read.
- `final-read-incomplete`: the runner's final read of a partition never covered
  the highest offset the history saw (chaos/finalread.py says why: a node stuck
  at a high watermark, no confirmed leader). Not a loss found, a check that could
  not finish; for that partition, `unseen` judges only values at offsets below
  the high watermark the read reached.
- `poll-skip` / `nonmonotonic-poll`: a poll asked for `position` and got a first
  record past the next existing value (skipping some) or before it. Our polls
  use manual positions, so the consumer's position *is* Jepsen's "last value the
  previous op read": the runner continues at the last offset + 1 or seeks.
- `int-poll-skip` / `int-nonmonotonic-poll`: consecutive records within a poll.
- `nonmonotonic-send`: a send landed at or before a value of an earlier send
  it had to follow: for plain sends, the last *ok* send of the same process
  (acknowledged before this one was invoked; an ambiguous one may land anywhere);
  for idempotent sends, the previous sequence of the same producer and epoch
  (the server refuses out-of-order sequences, even across retries).
- `int-nonmonotonic-send` / `int-send-skip`: values within one send out of order,
  or with other values between them. Jepsen reports `int-send-skip` for
  information only, because a Kafka send may span interleaved producer batches;
  our send is one batch to one partition, appended whole at consecutive offsets,
  so a gap inside it is a bug.
- `offset-hole`: an offset below the final read's high watermark that the final
  read did not return (beyond the refused ranges the caller says are legal).
- `read-beyond-hw`: a (committed-isolation) poll returned an offset at or above
  the high watermark it reported.
- `nonmonotonic-hw`: a process saw a partition's high watermark go down on one
  server incarnation. Followers lag and a restarted node re-applies its log, so
  only one incarnation's view must grow; with no node recorded, per process.
- `committed-offset-nonlinearizable`: a group's commit/fetch ops on one partition
  admit no linearization as a register (a Wing-Gong search with Lowe's memo).
- consumer group members (`chaos/group_checks.py`): `group-undelivered`,
  `group-drain-incomplete`, `group-offset-backwards`, `group-two-owners-epoch`,
  `group-two-owners`, `group-fetch-unowned`. Records members fetched count as
  reads everywhere above (offsets, unexpected values, ambiguous sends).

Not checked, on purpose: Jepsen's ext-send-skip (other producers interleave
legitimately), `precommitted-read` and the Elle cycle classes (`G0`, `G1c` and
their process/realtime variants): CHAOS.md 2.3 and 5.3 define them over
transactions, and our API has none, so no op has both reads and writes to make
a dependency edge between completions.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from chaos import group_checks, log_checks, offset_register, version_order
from chaos.anomalies import ANOMALY_CLASSES, Anomaly
from chaos.history import AnyOp, Outcome, PartitionKey, Value
from chaos.offset_register import CheckLimits
from chaos.version_order import HistoryByKind, VersionOrder

__all__ = ["ANOMALY_CLASSES", "Anomaly", "CheckLimits", "CheckResult", "check"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    anomalies: tuple[Anomaly, ...]
    # What could not be decided, and why (a search over budget, no final read).
    unchecked: tuple[str, ...]
    stats: Mapping[str, int]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        """Anomalies per class, in `ANOMALY_CLASSES` order, only classes present."""
        counts = Counter(anomaly.name for anomaly in self.anomalies)
        return {name: counts[name] for name in ANOMALY_CLASSES if counts[name]}

    def of_class(self, name: str) -> list[Anomaly]:
        assert name in ANOMALY_CLASSES, name
        return [anomaly for anomaly in self.anomalies if anomaly.name == name]

    def summary(self) -> str:
        """The fragment for the runner's `chaos:` line, e.g. `anomalies: lost-write=2 duplicate=1`."""
        counts = self.counts()
        text = " ".join(f"{name}={count}" for name, count in counts.items()) or "none"
        if self.unchecked:
            text += f" unchecked={len(self.unchecked)}"
        return f"anomalies: {text}"


def check(
    history: Iterable[AnyOp],
    *,
    refused_ranges: Mapping[PartitionKey, Iterable[tuple[int, int]]] | None = None,
    incomplete_reads: Mapping[PartitionKey, str] | None = None,
    limits: CheckLimits | None = None,
) -> CheckResult:
    """Check a whole history. `refused_ranges` (base offset, count) per partition:
    batches the server refused on apply, whose offsets no read returns (from the
    end-of-run debug dump); without them such a range shows as an `offset-hole`.
    `incomplete_reads`: partitions whose final read ran out of time before covering
    the history, with the reader's explanation (`final-read-incomplete`)."""
    limits = limits or CheckLimits()
    split = version_order.by_kind(history)
    sends, polls = split.sends, split.ok_polls
    writers = version_order.find_writers(sends)
    orders: dict[PartitionKey, VersionOrder] = defaultdict(VersionOrder)
    version_order.add_polls(orders, polls)
    group_checks.add_group_reads(orders, split.group_fetches)
    acknowledged = version_order.acknowledged_values(sends, orders)
    version_order.add_sends(orders, sends)
    for order in orders.values():
        order.finish()
    finals = version_order.final_reads(polls)
    incomplete = incomplete_reads or {}
    not_judged = log_checks.values_not_judged(finals, orders, acknowledged, incomplete)
    anomalies = [
        *log_checks.log_anomalies(orders),
        *log_checks.read_validity(orders, writers),
        *log_checks.lost_writes(orders, acknowledged),
        *log_checks.unseen(finals, acknowledged, not_judged),
        *log_checks.incomplete_reads(finals, not_judged, incomplete),
        *log_checks.offset_holes(finals, refused_ranges or {}),
        *log_checks.poll_order(orders, polls),
        *log_checks.send_order(orders, sends),
        *log_checks.high_watermarks(polls),
    ]
    anomalies += group_checks.group_anomalies(split.members, split.group_fetches, split.group_commits,
                                              split.fetches, orders, acknowledged)
    commits = [*split.commits, *group_checks.register_commits(split.group_commits)]
    register_anomalies, unchecked = offset_register.committed_offsets(commits, split.fetches, limits)
    anomalies += register_anomalies
    unchecked += [f"{key}: no final read" for key in acknowledged if key not in finals]
    stats = _stats(split, acknowledged, orders)
    return CheckResult(anomalies=tuple(anomalies), unchecked=tuple(unchecked), stats=stats)


def _stats(
    split: HistoryByKind,
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    orders: Mapping[PartitionKey, VersionOrder],
) -> dict[str, int]:
    """Counts for the report (not pass/fail): ops by kind and outcome, and how
    ambiguous sends resolved (CHAOS.md 5.3 statistics)."""
    stats = {f"{kind}-{outcome}": count for (kind, outcome), count in split.outcomes.items()}
    stats["send-info-written"] = stats["send-info-unresolved"] = stats["send-duplicate-answers"] = 0
    for op in split.sends:
        if op.outcome is Outcome.INFO:
            written = version_order.must_have_committed(op, orders)
            stats["send-info-written" if written else "send-info-unresolved"] += 1
        elif op.duplicate:
            stats["send-duplicate-answers"] += 1
    stats["values-acknowledged"] = sum(len(of_key) for of_key in acknowledged.values())
    return dict(sorted(stats.items()))

