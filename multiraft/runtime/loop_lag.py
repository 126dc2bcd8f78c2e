"""How long the node's event loop is held: the one figure that says a request stalled it.

Every group's heartbeats, every answer and every fsync hand-off run on one event
loop, so a single request that holds it for 200 ms delays them all; a node whose
loop stalls past an election timeout makes its followers campaign. This task asks
to be woken every PERIOD_S and records how late it was woken in a histogram
(`raftlog_event_loop_lag_seconds` on /metrics), as Node.js's `monitorEventLoopDelay`
and Go's scheduler latency metric do. Forty wake-ups a second cost nothing next to
a tick of the groups.

A stall of S seconds that begins during the sleep shows as a lag of at least
S - PERIOD_S, so lags above 100 ms - PERIOD_S (the 75 ms bucket) count every stall
past 100 ms; with a 50 ms period the 100 ms bucket missed stalls of up to ~150 ms
and the 50 ms one flagged stalls of 50-100 ms.
"""

from __future__ import annotations

import asyncio

from multiraft.runtime.histograms import Histogram

PERIOD_S = 0.025


async def watch_loop_lag(histogram: Histogram, period_s: float = PERIOD_S) -> None:
    clock = asyncio.get_running_loop().time
    while True:
        due = clock() + period_s
        await asyncio.sleep(period_s)
        histogram.observe(max(0.0, clock() - due))
