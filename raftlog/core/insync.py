"""In-sync replica tracking by time, the way Kafka users know it.

A follower is *in sync* while it was caught up to the leader's log at some moment
within the last `lag_ticks` ticks. "Caught up at tick t" means its match index
reached the leader's last index as it stood at tick t. Measuring lag in time, not
in entries, keeps a follower that is merely slow during a burst in the ISR: each
acknowledgement catches it up to some recent tick, so it only leaves the ISR when
it stays behind longer than the lag time (no shuttling in and out under bursts).

The leader samples its last index once per tick into a bounded window; a match
update finds, by bisection, the latest sampled tick whose last index it covers.

A follower that *lost* entries it had acknowledged (a replica whose damaged log
was cut at restart) is out at once, whenever it last caught up: the leader learns
it holds less than its match said, and a short replica is not in sync. It comes
back in only when its match covers the leader's last index as of a tick at or
after the loss: being caught up before the loss says nothing about it now.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from raftlog.types import Index, NodeId

NEVER = -(1 << 62)


class InSyncTracker:
    def __init__(self, lag_ticks: int) -> None:
        assert lag_ticks >= 1
        self._lag_ticks = lag_ticks
        # Parallel windows of (tick, leader last index at the end of that tick).
        self._ticks: list[int] = []
        self._last_indexes: list[int] = []
        self._caught_up_tick: dict[NodeId, int] = {}
        # Followers known to have lost entries, and the tick the leader learned it: out of
        # the ISR until caught up to the leader's log as of that tick or later.
        self._lost_at: dict[NodeId, int] = {}
        self._since = 0  # the tick this leadership began

    def reset(self, now: int, in_sync: Iterable[NodeId], others: Iterable[NodeId]) -> None:
        """Start a leadership: `in_sync` begin in the ISR (as Kafka does), `others` outside it."""
        self._since = now
        self._ticks.clear()
        self._last_indexes.clear()
        self._caught_up_tick = {node: now for node in in_sync}
        self._lost_at.clear()
        for node in others:
            self._caught_up_tick[node] = NEVER

    def add(self, node: NodeId) -> None:
        self._caught_up_tick.setdefault(node, NEVER)

    def remove(self, node: NodeId) -> None:
        self._caught_up_tick.pop(node, None)
        self._lost_at.pop(node, None)

    def lost(self, node: NodeId, now: int) -> None:
        """`node` holds less than it acknowledged (the leader forgot its match): out of the
        ISR now, until its match covers the leader's last index as of `now` or later."""
        if node in self._caught_up_tick:
            self._lost_at[node] = now

    def sample(self, now: int, last_index: Index) -> None:
        """Record the leader's last index at the end of tick `now`."""
        if self._ticks and self._ticks[-1] == now:
            self._last_indexes[-1] = max(self._last_indexes[-1], last_index)
        else:
            assert not self._ticks or self._ticks[-1] < now, "ticks only move forward"
            self._ticks.append(now)
            self._last_indexes.append(last_index)
        # Keep just the window that can still matter.
        horizon = now - self._lag_ticks - 1
        cut = bisect.bisect_left(self._ticks, horizon)
        if cut > 0:
            del self._ticks[:cut]
            del self._last_indexes[:cut]

    def record_match(self, node: NodeId, match: Index, now: int, leader_last: Index) -> None:
        if node not in self._caught_up_tick:
            return
        if match >= leader_last:
            caught_up = now
        else:
            # The latest sampled tick whose last index the follower covers.
            position = bisect.bisect_right(self._last_indexes, match) - 1
            if position < 0:
                return
            caught_up = self._ticks[position]
        lost_at = self._lost_at.get(node)
        if lost_at is not None:
            if caught_up < lost_at:
                return  # caught up to where the leader's log stood before the loss: still short
            del self._lost_at[node]
        if caught_up > self._caught_up_tick[node]:
            self._caught_up_tick[node] = caught_up

    def in_sync(self, now: int) -> frozenset[NodeId]:
        return frozenset(
            node for node, tick in self._caught_up_tick.items()
            if now - tick <= self._lag_ticks and node not in self._lost_at
        )

    def out_of_sync(self, now: int) -> frozenset[NodeId]:
        return frozenset(self._caught_up_tick) - self.in_sync(now)

    def lag_ticks(self, node: NodeId, now: int) -> int:
        """Ticks since `node` was last caught up: the follower lag in time that the ISR
        rule compares with the lag time. For a node not caught up since this leadership
        began, the ticks since it began (a lower bound: this leader knows no better)."""
        return now - max(self._caught_up_tick.get(node, NEVER), self._since)

    def caught_up_tick(self, node: NodeId) -> int:
        return self._caught_up_tick.get(node, NEVER)
