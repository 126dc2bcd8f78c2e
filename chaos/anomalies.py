"""The anomaly classes the history checker reports, and how one is worded.

`chaos/checker.py` says what each class means; this module holds the names,
the `Anomaly` record, and the helpers every check words its explanation with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chaos.history import PartitionKey

ANOMALY_CLASSES = (
    "inconsistent-offsets",
    "duplicate",
    "unexpected",
    "G1a",
    "lost-write",
    "unseen",
    "final-read-incomplete",
    "poll-skip",
    "nonmonotonic-poll",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "nonmonotonic-send",
    "int-nonmonotonic-send",
    "int-send-skip",
    "offset-hole",
    "read-beyond-hw",
    "nonmonotonic-hw",
    "committed-offset-nonlinearizable",
    # Consumer groups (chaos/group_checks.py says what each means).
    "group-undelivered",
    "group-drain-incomplete",
    "group-offset-backwards",
    "group-two-owners-epoch",
    "group-two-owners",
    "group-fetch-unowned",
    # Mirrors, `--mirror` runs (chaos/mirror_checks.py says what each means).
    "mirror-lost",
    "mirror-differs",
    "mirror-duplicate",
    "mirror-position-backwards",
    "mirror-incomplete",
    # A mirror following its source, `--mirror` runs (chaos/mirror_follow_checks.py).
    "mirror-not-grown",
    "mirror-resync-stuck",
    # A filtered mirror, `--mirror` runs (chaos/mirror_filter_checks.py).
    "mirror-filter-leaked",
)

# Values or ops named in one explanation; the rest are counted.
LISTED_MAX = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    name: str
    key: PartitionKey
    explanation: str
    ops: tuple[int, ...]  # indices of the ops involved

    def __post_init__(self) -> None:
        assert self.name in ANOMALY_CLASSES, self.name


def anomaly(name: str, key: PartitionKey, explanation: str, ops: Iterable[int]) -> Anomaly:
    return Anomaly(name=name, key=key, explanation=explanation, ops=tuple(ops))



def offset_runs(sorted_offsets: list[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for offset in sorted_offsets:
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def listing(items: Sequence[object]) -> str:
    shown = ", ".join(repr(item) for item in items[:LISTED_MAX])
    if len(items) > LISTED_MAX:
        shown += f" (+{len(items) - LISTED_MAX} more)"
    return shown
