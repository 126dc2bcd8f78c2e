"""Latency histograms the runtime fills and `/metrics` reads (DESIGN.md section 10).

Fixed buckets, plain counters: observing is a bisect and two additions, cheap
enough for the produce path. Node-wide (summed over groups): a thousand groups
times a dozen buckets per series would drown a Prometheus server, and the
per-group figures that matter (lag, ISR, indexes) are gauges already.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Seconds: 100 us to 10 s, roughly x2.5 apart (fsyncs, replication round trips, applies),
# plus 75 ms: with the loop-lag sampler's 25 ms period a lag above it is a stall past 100 ms
# (multiraft/runtime/loop_lag.py), the bound DESIGN.md section 10 and the hostile run check.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
           5.0, 10.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = BUCKETS  # upper bounds, increasing (longer tasks than a produce take their own)
    counts: list[int] = field(default_factory=list)  # one per bound, and the last: above every bound
    total: float = 0.0

    def __post_init__(self) -> None:
        assert self.bounds and all(a < b for a, b in zip(self.bounds, self.bounds[1:], strict=False))
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        assert len(self.counts) == len(self.bounds) + 1

    def observe(self, seconds: float) -> None:
        assert seconds >= 0
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound, observations at or below it), +Inf last."""
        running, out = 0, []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass
class NodeLatencies:
    fsync: Histogram = field(default_factory=Histogram)  # one flush: segment fsyncs + state write
    replicate: Histogram = field(default_factory=Histogram)  # leader: proposal -> applied (committed)
    apply: Histogram = field(default_factory=Histogram)  # one Ready's committed entries applied
    loop_lag: Histogram = field(default_factory=Histogram)  # how late the event loop ran a timer (loop_lag.py)
