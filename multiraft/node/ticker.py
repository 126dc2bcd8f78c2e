"""One timer for every awake group of a node, the node's pings, and silence detection.

Silence is counted in the ticks this node ran, not in wall time: after a stall of
our own, peers' frames still wait in our sockets and must not look like silence.
So the ticker owns the clock of the node's `PeerLiveness`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.runtime.liveness import PeerLiveness
from raftlog.core.quorum import has_quorum
from raftlog.messages import Role

if TYPE_CHECKING:
    from multiraft.node.config import NodeConfig
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime

# Quiet followers wake when their leader's node has been silent this many election timeouts.
# Waking is dear (every group the silent node leads starts ticking here), so a
# stall of a busy peer must not pass for a death; a dead leader of an idle group is
# replaced a little later instead (Kafka waits 9 s for a broker's session to expire).
WAKE_SILENCE_PERIODS = 2
# Quiet leaders woken per tick because a member they went quiet past is live again: a
# node back from a restart is caught up group by group, not by thousands woken at once.
RETURN_WAKES_PER_TICK_MAX = 64


class Ticker:
    def __init__(self, config: NodeConfig, registry: GroupRegistry, logger: Any) -> None:
        self._config = config
        self._registry = registry
        self._logger = logger
        self.ticks_run = 0
        self.ticks_skipped = 0
        self.liveness = PeerLiveness(
            config.election_timeout_ticks * config.tick_ms / 1000,
            clock=lambda: self.ticks_run * config.tick_ms / 1000,
        )
        self._silent: set[int] = set()
        self.peer_silences = 0  # peers that fell silent long enough to wake quiet groups
        self.groups_woken_by_silence = 0  # quiet followers woken because their leader fell silent
        self.groups_back_to_quiet = 0  # groups such a silence woke for nothing (sleep_again)
        # Quiet leaders past absent members (quiescence.py): timers for their ISR, and the
        # ones to wake because a member is live again.
        self._timers: list[tuple[int, int, GroupRuntime, int | None]] = []  # (due tick, seq, runtime, spell)
        self._timer_seq = itertools.count()
        self._not_live: set[int] = set()
        self._to_wake: deque[GroupRuntime] = deque()
        self.groups_woken_for_isr = 0
        self.groups_woken_for_return = 0

    def now(self) -> int:
        """The node's tick count: the clock quiet groups measure their quiet spells by."""
        return self.ticks_run

    def wake_after(self, ticks: int, runtime: GroupRuntime) -> None:
        """Wake `runtime` in `ticks` ticks if it is still in the quiet spell it is in now
        (GroupDeps.wake_after_ticks). One timer per quiet spell; a spell that ended
        leaves a stale one, dropped when due or when stale ones pile up."""
        assert ticks >= 1
        if len(self._timers) > 2 * len(self._registry.groups) + 1024:
            self._timers = [t for t in self._timers if self._still_quiet(t[2], t[3])]
            heapq.heapify(self._timers)
        heapq.heappush(self._timers, (self.ticks_run + ticks, next(self._timer_seq), runtime, runtime.quiet_since))

    async def run(self, peer_ids: Callable[[], list[int]], ping: Callable[[list[int]], None]) -> None:
        """Tick every awake group; ping `peer_ids()` every heartbeat interval; wake the quiet
        followers of a leader whose node fell silent."""
        config = self._config
        interval = config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        count = 0
        awake = self._registry.awake
        while True:
            next_tick += interval
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            if loop.time() - next_tick > interval:
                # Overloaded: drop the missed ticks rather than fire them in a burst, which
                # would time out elections whose answers are merely queued (etcd does too).
                self.ticks_skipped += int((loop.time() - next_tick) / interval)
                next_tick = loop.time()
            count += 1
            self.ticks_run = count
            peers = peer_ids()
            if count % config.heartbeat_interval_ticks == 0:
                ping(peers)
            silent = self.liveness.silent(peers, WAKE_SILENCE_PERIODS)
            if silent != self._silent:
                self._on_silence_change(silent)
            self._wake_quiet_leaders(count, peers)
            # Quiet groups cost nothing per tick: only the awake ones are walked.
            for runtime in list(awake.values()):
                runtime.tick()

    def _on_silence_change(self, silent: set[int]) -> None:
        """Log which peers fell silent or came back. The quiet followers of a leader on a
        newly silent node wake (to elect), and the quiet leaders left without a quorum of
        live voters (to step down); nothing else does: a held voter has its own release
        timer, and a leader that keeps a quorum learns of a dead member when the controller
        declares its node dead (Replicas wakes it then, for the ISR). A peer back before its
        followers here campaigned was slow, not dead: they go quiet again rather than
        disturb its leaders."""
        back = self._silent - silent
        fell_silent = silent - self._silent
        woken = 0
        if fell_silent:
            for runtime in list(self._registry.groups.values()):
                if runtime.quiesced and _depends_on(runtime, fell_silent, silent):
                    runtime.wake_for_silence()
                    woken += 1
        slept = sum(1 for r in self._registry.groups.values() if r.sleep_again()) if back else 0
        self._logger.info("peers_silent", silent=sorted(silent), heard_again=sorted(back), woken=woken,
                          back_to_quiet=slept)
        self.peer_silences += len(fell_silent)
        self.groups_woken_by_silence += woken
        self.groups_back_to_quiet += slept
        self._silent = silent


    def _wake_quiet_leaders(self, now: int, peers: list[int]) -> None:
        """Timers that are due, and the quiet leaders whose absent members are live again
        (a bounded number a tick): they wake to catch those members up."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, runtime, spell = heapq.heappop(timers)
            if self._still_quiet(runtime, spell):
                runtime.wake()
                self.groups_woken_for_isr += 1
        not_live = self.liveness.silent(peers, 1.0)
        back, self._not_live = self._not_live - not_live, not_live
        if back:
            groups = self._registry.groups
            for group_id in list(self._registry.led):
                runtime = groups.get(group_id)
                if runtime is not None and runtime.quiesced and not back.isdisjoint(runtime.quiet_past):
                    self._to_wake.append(runtime)
        for _ in range(min(len(self._to_wake), RETURN_WAKES_PER_TICK_MAX)):
            runtime = self._to_wake.popleft()
            if self._registered_and_quiet(runtime):
                runtime.wake()
                self.groups_woken_for_return += 1

    def _registered_and_quiet(self, runtime: GroupRuntime) -> bool:
        return runtime.quiesced and self._registry.groups.get(runtime.group_id) is runtime

    def _still_quiet(self, runtime: GroupRuntime, spell: int | None) -> bool:
        return runtime.quiet_since == spell and self._registered_and_quiet(runtime)


def _depends_on(runtime: GroupRuntime, fell_silent: set[int], silent: set[int]) -> bool:
    """Does this quiet replica need its clock because `fell_silent` fell silent (`silent`:
    every silent peer)? A follower of a leader among them: it must elect a successor. A
    leader whose other voters are now all silent but too few to leave a quorum: only its
    clock lets CheckQuorum step it down; quiet, it would claim to lead (and answer reads
    from a high watermark the others moved past) until the partition healed. A leader
    that keeps a quorum stays quiet (a node killed beside 10,000 partitions wakes none of
    the survivors' leaders)."""
    core = runtime.core
    if core.role is Role.LEADER:
        voters = core.membership.voters
        return not fell_silent.isdisjoint(voters) and not has_quorum(voters, voters - silent)
    return core.leader != 0 and core.leader in fell_silent
