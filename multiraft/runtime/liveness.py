"""Which peer nodes are alive, and who leads the groups this node hosts no replica of.

Every frame from a peer proves it alive; pings (one per peer per heartbeat
interval, whatever the groups do) keep that true while all groups are quiet.
Every `LEADERS_EVERY_PINGS`-th ping carries the sender's full list of led groups,
so any node can name the leader of any partition (describe, forwarding): Redpanda
disseminates its leaders table the same way. About a second stale at most.

A peer not heard from yet counts as alive for one silence period after this node
started: a peer that is merely slower to start would otherwise be "silent" at
once, and the first requests forwarded to it fail as outcome-unknown.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from raftlog.types import GroupId
from raftlog.wire import WireError

LEADERS_EVERY_PINGS = 10
LEADER_ENTRY = struct.Struct(">QQ")  # group id, term
LEADERS_PER_PING_MAX = 100_000  # 1.6 MB: far inside the frame limit


class PeerLiveness:
    def __init__(self, silence_s: float, clock=time.monotonic) -> None:
        self.silence_s = silence_s
        self._clock = clock
        self._started = clock()
        self._last_heard: dict[int, float] = {}
        self._leaders_heard: dict[GroupId, tuple[int, int]] = {}  # group -> (leader node, term)
        self.leaders_version = 0  # bumped when what a peer says it leads changes (the balancer's idle check)
        self._pings_sent = 0

    def heard(self, node: int) -> None:
        self._last_heard[node] = self._clock()

    def gone(self, node: int) -> None:
        """`node`'s process is gone (its raft port refuses connections): silent from now
        on, not only after a silence period, until a frame from it proves it back."""
        self._last_heard[node] = float("-inf")

    def is_live(self, node: int) -> bool:
        return self._clock() - self._last_heard.get(node, self._started) <= self.silence_s

    def silent(self, peers: list[int], periods: float = 1.0) -> set[int]:
        """The peers not heard from for more than `periods` silence periods."""
        now, limit = self._clock(), self.silence_s * periods
        return {p for p in peers if now - self._last_heard.get(p, self._started) > limit}

    def next_ping(self, led: Callable[[], list[tuple[GroupId, int]]]) -> bytes:
        """The next ping's body: empty, or every few pings the (group, term) list that
        `led` returns (asked for only then: it walks every group)."""
        self._pings_sent += 1
        if self._pings_sent % LEADERS_EVERY_PINGS:
            return b""
        return b"".join(LEADER_ENTRY.pack(g, t) for g, t in led()[:LEADERS_PER_PING_MAX])

    def on_leaders(self, source: int, body: bytes) -> None:
        """A peer's full list of the groups it leads: it replaces what we had from it,
        and beats what others said for a group only with a term at least as high."""
        if len(body) % LEADER_ENTRY.size:
            raise WireError("leaders list is not a whole number of entries")
        heard = self._leaders_heard
        before = {g: term for g, (node, term) in heard.items() if node == source}
        for group_id in before:
            del heard[group_id]
        after = {}
        for group_id, term in LEADER_ENTRY.iter_unpack(body):
            known = heard.get(GroupId(group_id))
            if known is None or known[1] <= term:
                heard[GroupId(group_id)] = (source, term)
                after[group_id] = term
        if after != before:
            self.leaders_version += 1

    def leader_heard(self, group_id: GroupId) -> int:
        return self._leaders_heard.get(group_id, (0, 0))[0]
