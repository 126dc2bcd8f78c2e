"""One timer for every group of a node, the node's pings, and silence detection.

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

# Quiet groups wake when a member's node has been silent this many election timeouts.
# Waking is dear (every group a node shares with the silent one starts ticking), so a
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
        self.groups_back_to_quiet = 0  # groups such a silence woke for nothing (sleep_again)

    async def run(self, peer_ids: Callable[[], list[int]], ping: Callable[[list[int]], None]) -> None:
        """Tick every group; ping `peer_ids()` every heartbeat interval; wake quiet groups
        of silent peers."""
        config = self._config
        interval = config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        count = 0
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
            for runtime in list(self._registry.groups.values()):
                if runtime.quiesced:
                    # Quiet groups cost nothing per tick unless some peer node fell silent.
                    if not silent or not _depends_on(runtime, silent):
                        continue
                    runtime.wake_for_silence()  # a member's node went silent: elect, or update the ISR
                runtime.tick()

    def _on_silence_change(self, silent: set[int]) -> None:
        """Log which peers fell silent or came back; a peer back before its followers here
        campaigned was slow, not dead: they go quiet again rather than disturb its leaders."""
        back = self._silent - silent
        slept = sum(1 for r in self._registry.groups.values() if r.sleep_again()) if back else 0
        self._logger.info("peers_silent", silent=sorted(silent), heard_again=sorted(back), back_to_quiet=slept)
        self.peer_silences += len(silent - self._silent)
        self.groups_back_to_quiet += slept
        self._silent = silent


def _depends_on(runtime: GroupRuntime, silent: set[int]) -> bool:
    core = runtime.core
    if core.role is not Role.LEADER:
        return core.leader == 0 or core.leader in silent
    return not silent.isdisjoint(core.membership.members)
