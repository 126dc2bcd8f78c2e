"""A seeded in-memory network: delay, loss, duplication, reordering and partitions.

Every decision comes from the simulator's one `random.Random`, so a run replays
exactly from its seed. Reordering is not a separate knob: messages on one path get
independent random delays, so they overtake each other whenever jitter is on.
Partitions are sets of blocked directed links, which expresses symmetric splits,
isolated nodes, and one-way (asymmetric) failures alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raftlog.types import NodeId


@dataclass(slots=True)
class NetworkFaults:
    """What this network does to messages; every field off means a perfect LAN."""

    delay_min: int = 1
    delay_jitter: int = 0  # > 0 reorders messages on a path
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0


@dataclass(slots=True)
class SimNetwork:
    rng: random.Random
    faults: NetworkFaults = field(default_factory=NetworkFaults)
    blocked: set[tuple[NodeId, NodeId]] = field(default_factory=set)
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0

    def deliveries(self, source: NodeId, target: NodeId) -> list[int]:
        """Delays at which a message from `source` to `target` arrives (none, one or two)."""
        self.sent += 1
        if (source, target) in self.blocked:
            self.dropped += 1
            return []
        faults = self.faults
        if faults.loss_rate and self.rng.random() < faults.loss_rate:
            self.dropped += 1
            return []
        delays = [self._delay()]
        if faults.duplicate_rate and self.rng.random() < faults.duplicate_rate:
            self.duplicated += 1
            delays.append(self._delay() + self.rng.randrange(1, 20))
        return delays

    def _delay(self) -> int:
        jitter = self.faults.delay_jitter
        return self.faults.delay_min + (self.rng.randrange(jitter + 1) if jitter else 0)

    # -- partitions --------------------------------------------------------------

    def isolate(self, node: NodeId, nodes: list[NodeId], one_way: bool = False) -> None:
        """Cut `node` off from everyone; `one_way` drops only what it sends."""
        for other in nodes:
            if other != node:
                self.blocked.add((node, other))
                if not one_way:
                    self.blocked.add((other, node))

    def split(self, side: list[NodeId], nodes: list[NodeId]) -> None:
        """Two sides that cannot talk to each other (majority/minority, or halves)."""
        rest = [n for n in nodes if n not in side]
        for a in side:
            for b in rest:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def block_link(self, source: NodeId, target: NodeId) -> None:
        self.blocked.add((source, target))

    def heal(self) -> None:
        self.blocked.clear()
