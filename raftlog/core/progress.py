"""What a leader knows about each follower, and how fast it may send to it.

A follower's progress is in one of three states (as in etcd-io/raft):
- PROBE: the leader does not know where the logs match; it sends one append at
  a time and waits for the answer (or a heartbeat response) before the next.
- REPLICATE: the logs match up to `match`; appends stream optimistically, bounded
  by the in-flight window (messages and bytes).
- INSTALL: the follower needs entries the leader no longer holds; a snapshot /
  segment transfer is under way, and nothing else is sent until it finishes.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from raftlog.types import Index


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    INSTALL = "install"


@dataclass(slots=True)
class Inflights:
    """A bounded window of appends sent but not yet acknowledged: (last index, bytes)."""

    messages_max: int
    bytes_max: int
    _window: deque[tuple[int, int]] = field(default_factory=deque)
    _bytes: int = 0

    def add(self, last_index: int, size_bytes: int) -> None:
        assert not self.full(), "the caller checks full() before sending"
        if self._window:
            assert last_index > self._window[-1][0], "in-flight appends are sent in order"
        self._window.append((last_index, size_bytes))
        self._bytes += size_bytes

    def free_up_to(self, index: int) -> None:
        window = self._window
        while window and window[0][0] <= index:
            self._bytes -= window.popleft()[1]

    def free_first(self) -> None:
        if self._window:
            self._bytes -= self._window.popleft()[1]

    def full(self) -> bool:
        return len(self._window) >= self.messages_max or self._bytes >= self.bytes_max

    def reset(self) -> None:
        self._window.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._window)


@dataclass(slots=True)
class Progress:
    match: Index
    next: Index
    inflights: Inflights
    is_learner: bool = False
    state: ProgressState = ProgressState.PROBE
    # PROBE: an append is outstanding; wait for its answer or a heartbeat response.
    probe_sent: bool = False
    # INSTALL: the snapshot index being installed, and ticks spent waiting for it.
    install_index: Index = Index(0)
    install_ticks: int = 0
    # Heard from since the last CheckQuorum round.
    recent_active: bool = False
    # REPLICATE: ticks left before appends stream to a follower found far behind (the
    # driver may hold it for a far-horizon install meanwhile: Config.far_wait_lag_entries).
    far_wait: int = 0

    def __post_init__(self) -> None:
        assert self.next > self.match, "next always lies beyond match"

    def become_probe(self) -> None:
        if self.state is ProgressState.INSTALL:
            self.next = Index(max(self.match + 1, self.install_index + 1))
        else:
            self.next = Index(self.match + 1)
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = Index(self.match + 1)
        self._reset(ProgressState.REPLICATE)

    def become_install(self, snapshot_index: Index) -> None:
        self._reset(ProgressState.INSTALL)
        self.install_index = snapshot_index

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.install_index = Index(0)
        self.install_ticks = 0
        self.far_wait = 0
        self.inflights.reset()

    def forget_match(self, next_probe: Index) -> None:
        """The follower holds less than it acknowledged: it lost entries (a replica whose
        storage was damaged, in repair). Nothing it acknowledged can be counted on any more,
        so `match` goes back to 0 (which only ever delays a commit) and probing restarts at
        `next_probe`."""
        self.match = Index(0)
        self.become_probe()
        self.next = Index(max(1, next_probe))

    def maybe_update(self, index: Index) -> bool:
        """Record that the follower holds the log up to `index`; False if that is old news."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        if self.next < index + 1:
            self.next = Index(index + 1)
        return updated

    def sent_entries(self, last_index: Index, size_bytes: int) -> None:
        """Account for an append carrying entries up to `last_index`."""
        if self.state is ProgressState.REPLICATE:
            self.next = Index(last_index + 1)
            self.inflights.add(last_index, size_bytes)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True
        else:
            raise AssertionError("no appends are sent while a follower installs a snapshot")

    def maybe_decrease_to(self, rejected: Index, match_hint: Index) -> bool:
        """Back off after the follower rejected the append at `rejected`; False if stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # an answer to an old append
            self.next = Index(self.match + 1)
            return True
        if self.next - 1 != rejected:
            return False  # not the probe we are waiting for
        self.next = Index(max(min(rejected, match_hint + 1), self.match + 1))
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.far_wait > 0 or self.inflights.full()
        return True
