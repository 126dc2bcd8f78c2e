"""The nemesis: faults scheduled from the seed, one at a time, start then stop.

Each fault kind picks its targets from the seed's random stream, starts, holds for
a few seconds (longer than the 500 ms election timeout) and stops (heals). About
a quarter of the slots stay quiet. Every window is recorded (kind, detail, start,
end) for the report's shaded plots and the summary's counts.

Process faults (kill, pause, corrupt, power failure) need nothing but PIDs;
network, clock and disk faults use `chaos.faults` inside the runner's namespaces
and are offered only when capability detection says they work here.

A `move` (chaos/moves.py: a node decommissioned, then recommissioned) is the one
kind that runs beside the others: picked, it starts in its own task and the
schedule goes on, so kills, pauses and partitions hit the cluster while replicas
move. At most one move runs at a time (a slot that draws `move` then draws again
among the other kinds); its window closes when the move recommissions its node.
When the main phase ends, `run` waits for the move in flight to close (bounded
by the move's own limits).

A kind may be owed slots (`due`: a time into the run; the first slot from then on
takes it, quiet or not) and limited (`limits`: at most so many windows a run); a
`--mirror` run owes its source growths and truncation their slots
(chaos/mirror_follow.py). Without either, the draw is the same as before them.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey
from chaos.moves import Mover, MoveRecord
from chaos.stopping import sleep_or_stop

HOLD_S = (1.5, 5.0)
GAP_S = (1.0, 4.0)
QUIET_SHARE = 0.25
# How `kill` picks its targets, uniformly; "all" is a whole-cluster power failure.
KILL_TARGETS = ("one", "leader", "metadata-leader", "minority", "all")


@dataclass
class Window:
    kind: str
    detail: str
    start_s: float
    end_s: float | None = None


@dataclass
class Nemesis:
    cluster: ChaosCluster
    keys: list[PartitionKey]
    rng: random.Random
    kinds: list[str]
    # kind -> starter returning (what it did, its healer): network, clock, disk, corruption
    extra: dict[str, Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    heals: list[float] = field(default_factory=list)  # monotonic times of every heal
    mover: Mover | None = None  # set when `move` is among the kinds
    topics: tuple[str, ...] = ()  # what a move's target is chosen by (replicas held)
    # (seconds since `started`, kind): slots owed to a kind, taken by the first slot from
    # then on, quiet share or not (chaos/mirror_follow.py: so every run grows and truncates).
    due: list[tuple[float, str]] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)  # kind -> at most this many windows a run
    _move: asyncio.Task[MoveRecord] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if "move" in self.kinds and self.mover is None:
            self.mover = Mover(self.cluster, random.Random(self.rng.random()), self.started)
        self.due = sorted(self.due)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._schedule(stop)
            if self._move is not None:
                await self._move  # closes on `stop`: the recommission, bounded
        finally:
            if self._move is not None and not self._move.done():  # cancelled: the run is interrupted
                self._move.cancel()
                await asyncio.gather(self._move, return_exceptions=True)

    async def _schedule(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or_stop(stop, self.rng.uniform(*GAP_S))
            if stop.is_set():
                return
            kind = self._owed()
            if kind is None:
                if self.rng.random() < QUIET_SHARE or not self.kinds:
                    continue
                kind = self._draw()
                if kind is None:
                    continue
            if kind == "move":
                if self._move is None or self._move.done():
                    await self._start_move(stop)
                    continue
                others = [k for k in self.kinds if k != "move"]
                if not others:
                    continue
                kind = self.rng.choice(others)
            opened = len(self.windows)
            heal = await self._start(kind)
            await sleep_or_stop(stop, self.rng.uniform(*HOLD_S))
            await heal()
            self.windows[opened].end_s = time.monotonic() - self.started
            self.heals.append(time.monotonic())

    def _owed(self) -> str | None:
        """The earliest owed kind whose time has come (and that is still within its limit)."""
        now = time.monotonic() - self.started
        while self.due and self.due[0][0] <= now:
            _, kind = self.due.pop(0)
            if kind in self.kinds and self.counts[kind] < self.limits.get(kind, sys.maxsize):
                return kind
        return None

    def _draw(self) -> str | None:
        """A kind at random among those within their limits (without limits: `rng.choice(kinds)`,
        the same draw as before limits existed, so old seeds schedule the same faults)."""
        allowed = [k for k in self.kinds if self.counts[k] < self.limits.get(k, sys.maxsize)]
        return self.rng.choice(allowed) if allowed else None

    def _open(self, kind: str, detail: str) -> Window:
        self.counts[kind] += 1
        window = Window(kind, detail, time.monotonic() - self.started)
        self.windows.append(window)
        return window

    async def _start_move(self, stop: asyncio.Event) -> None:
        assert self.mover is not None
        if self._move is not None:
            await self._move  # done: re-raises what went wrong in it
        node = await self.mover.pick(self.topics)
        if node is None:
            return
        window = self._open("move", f"n{node}: decommission asked")

        def close(record: MoveRecord) -> None:
            window.detail = record.describe()
            window.end_s = time.monotonic() - self.started
            if record.refused:
                self.counts["move-refused"] += 1
        self._move = asyncio.create_task(self.mover.run(node, stop, close))

    async def _start(self, kind: str) -> Callable[[], Awaitable[None]]:
        if kind == "kill":
            return await self._kill()
        if kind == "power":
            return await self._kill("all")  # every node at once: a power failure
        if kind == "pause":
            return await self._pause()
        if kind in self.extra:
            detail, heal = await self.extra[kind]()
            self._open(kind, detail)
            return heal
        raise AssertionError(f"unknown fault kind {kind}")

    async def target(self, how: str) -> list[int]:
        """Nodes by role: one, a minority, the leader of a random partition, the metadata leader, all."""
        alive = self.cluster.serving() or self.cluster.ids
        if how == "leader":
            key = self.rng.choice(self.keys)
            leader = await asyncio.to_thread(self.cluster.leader_of, key.topic, key.partition)
            return [leader] if leader else [self.rng.choice(alive)]
        if how == "metadata-leader":
            leader = await asyncio.to_thread(self.cluster.metadata_leader)
            return [leader] if leader else [self.rng.choice(alive)]
        if how == "minority":
            return self.rng.sample(self.cluster.ids, (len(self.cluster.ids) - 1) // 2)
        if how == "all":
            return list(self.cluster.ids)
        return [self.rng.choice(alive)]

    async def _kill(self, how: str | None = None) -> Callable[[], Awaitable[None]]:
        how = how or self.rng.choice(KILL_TARGETS)
        nodes = await self.target(how)
        self._open("power" if how == "all" else "kill", f"{how}: {nodes}")
        for node in nodes:
            self.cluster.kill(node)

        async def restart() -> None:
            for node in nodes:
                if node in self.cluster.down:
                    self.cluster.start(node)
        return restart

    async def _pause(self) -> Callable[[], Awaitable[None]]:
        how = self.rng.choice(["one", "leader", "minority"])
        nodes = await self.target(how)
        self._open("pause", f"{how}: {nodes}")
        for node in nodes:
            self.cluster.pause(node)

        async def resume() -> None:
            for node in nodes:
                self.cluster.resume(node)
        return resume
