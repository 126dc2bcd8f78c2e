"""One timer for every awake group of a node, the node's pings, and silence detection.

Silence is counted in the ticks this node ran, not in wall time: after a stall of
our own, peers' frames still wait in our sockets and must not look like silence.
So the ticker owns the clock of the node's `PeerLiveness`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.runtime.liveness import PeerLiveness
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
            # Quiet groups cost nothing per tick: only the awake ones are walked.
            for runtime in list(awake.values()):
                runtime.tick()

    def _on_silence_change(self, silent: set[int]) -> None:
        """Log which peers fell silent or came back. The quiet followers of a leader on a
        newly silent node wake (to elect); nothing else does: a held voter has its own
        release timer, and a leader learns of a dead member when the controller declares
        its node dead (Replicas wakes it then, for the ISR). A peer back before its
        followers here campaigned was slow, not dead: they go quiet again rather than
        disturb its leaders."""
        back = self._silent - silent
        fell_silent = silent - self._silent
        woken = 0
        if fell_silent:
            for runtime in list(self._registry.groups.values()):
                if runtime.quiesced and _depends_on(runtime, fell_silent):
                    runtime.wake_for_silence()
                    woken += 1
        slept = sum(1 for r in self._registry.groups.values() if r.sleep_again()) if back else 0
        self._logger.info("peers_silent", silent=sorted(silent), heard_again=sorted(back), woken=woken,
                          back_to_quiet=slept)
        self.peer_silences += len(fell_silent)
        self.groups_woken_by_silence += woken
        self.groups_back_to_quiet += slept
        self._silent = silent


def _depends_on(runtime: GroupRuntime, silent: set[int]) -> bool:
    """Does this quiet replica need its clock because `silent` fell silent? Only a
    follower of a leader among them: it must elect a successor."""
    core = runtime.core
    return core.role is not Role.LEADER and core.leader != 0 and core.leader in silent
