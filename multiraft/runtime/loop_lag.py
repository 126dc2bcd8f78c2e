"""How long the node's event loop is held: the one figure that says a request stalled it.

Every group's heartbeats, every answer and every fsync hand-off run on one event
loop, so a single request that holds it for 200 ms delays them all; a node whose
loop stalls past an election timeout makes its followers campaign. This task asks
to be woken every PERIOD_S and records how late it was woken in a histogram
(`raftlog_event_loop_lag_seconds` on /metrics), as Node.js's `monitorEventLoopDelay`
and Go's scheduler latency metric do. Twenty wake-ups a second cost nothing next to
a tick of the groups.
"""

from __future__ import annotations

import asyncio

from multiraft.runtime.histograms import Histogram

PERIOD_S = 0.05


async def watch_loop_lag(histogram: Histogram, period_s: float = PERIOD_S) -> None:
    clock = asyncio.get_running_loop().time
    while True:
        due = clock() + period_s
        await asyncio.sleep(period_s)
        histogram.observe(max(0.0, clock() - due))
