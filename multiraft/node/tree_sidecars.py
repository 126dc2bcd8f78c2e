"""Closed segments' tree sidecars on a node: written after a build, and built in the background.

A tree build takes a closed segment wholly inside its span from the segment's sidecar
(storage/tree_sidecar.py, storage/scrub.py), so a verify of identical copies reads the
open segment and the sidecars, not the log. Sidecars come from two places:

- **a build that read a closed segment whole** (a verify meeting a segment without a
  sidecar, or a deep verify, which reads them all) hands back what it computed on the
  way; `ReplicaTrees.build` offers it to `SidecarWriter`, which writes it in its own
  task after the answer went (`offer`: never on the verify's path);
- **the warmer** (`SidecarWarmer.run`, one task a node): every `SCAN_S` it builds the
  sidecar of each closed segment that lacks a matching one, reading it a slice at a time
  on the loop (the store is the loop's) as a verify's build does, in smaller slices
  (`WARMER_SLICE_BYTES`: background work beside produce). So a segment gets its
  sidecar soon after it closes, and the first verify after a large copy is as cheap as
  the next.

**The warmer's cost is bounded**, whatever the node hosts (issue 26's idle budget: 10,000
quiet partitions must cost next to nothing):
- a pass looks only at the stores whose closed segments changed since it last finished
  them (`ChangedStores`: the store tells, SegmentStore's `on_segments_changed`, when a
  segment closes, is reopened or dropped, and when it opens holding closed segments); an
  idle node's pass touches no store. A store it could not finish (a budget ran out) stays
  on its list for the next pass;
- per store it remembers the segments it checked (`known`, by first index and generation:
  a reopened or refilled segment is another), pruned to the store's segments each time;
- it yields to the loop every `CHECKS_PER_YIELD` sidecar checks (each reads a small
  file) and between slices of a build; at most `CHECKS_PER_PASS` checks and
  `SEGMENTS_PER_PASS` builds a pass (a restart's cold cache spreads over passes);
- the bytes it hashes go through a token bucket at `tree_sidecar_bytes_per_s` (node
  config; 64 MiB/s by default, about 7 % of a core at the ~950 MB/s a build hashes
  here, docs/mirror.md; 0: no limit), as the move throttle bounds copies
  (multiraft/node/move_throttle.py).

The write (storage/tree_sidecar.py `write_sidecar`): a few KiB, no fsync (a cache checked
by CRC and stamp), on the loop in one go right after the check that the store still holds
the very segment read at the same generation (`still_described`), so nothing of the
store's changes between the check and the rename. A failure to write (a full disk) costs
only the sidecar: the next verify reads the segment again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multiraft.node.move_throttle import BytePace
from multiraft.runtime.supervision import watch
from raftlog.storage import StorageError
from raftlog.types import GroupId
from storage.scrub import ComputedSidecar, SegmentLeavesBuilder, still_described, valid_sidecar
from storage.tree_sidecar import write_sidecar

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segment import Segment
    from storage.segments import SegmentStore

SCAN_S = 2.0  # how often the warmer looks at the stores whose closed segments changed
SEGMENTS_PER_PASS = 16  # built per pass at most (a 64 MiB segment: about 70 ms of hashing, in slices)
CHECKS_PER_PASS = 1024  # sidecars read and checked per pass at most (a few KiB each): a restart's first passes
CHECKS_PER_YIELD = 32  # sidecar checks between two yields to the loop (each a small file read)
# Bytes hashed per slice of a warmer build (a verify's build takes storage/scrub.py's 8 MiB):
# the warmer is background work beside produce, and a slice holds the loop (about 1 ms a MiB
# read and hashed here), so its slices stay near a millisecond; at least one batch a slice.
WARMER_SLICE_BYTES = 1 << 20
PENDING_WRITES_MAX = 256  # sidecars offered by builds, waiting for the writer; more are dropped (a cache)


@dataclasses.dataclass(slots=True)
class SidecarCounts:
    """What sidecars did on this node (/metrics: raftlog_tree_sidecar_*)."""

    written: int = 0  # by the writer, for builds and for the warmer
    write_failures: int = 0  # a write failed (a full disk): logged, the segment is read next time
    writes_dropped: int = 0  # offered past PENDING_WRITES_MAX
    warmer_bytes_hashed: int = 0  # read and hashed by the warmer
    segments_from_sidecars: int = 0  # closed segments a build took from their sidecars
    ignored: int = 0  # sidecars there that did not match their segment: the segment was read
    mismatched: int = 0  # deep builds: a matching stamp, other bytes (rot, or a bug)


class ChangedStores:
    """The stores whose closed segments changed, by group (the newest store of a group wins).
    One entry per group at most: bounded by the groups a node opens."""

    def __init__(self) -> None:
        self._stores: dict[GroupId, SegmentStore] = {}

    def note(self, store: SegmentStore) -> None:
        self._stores[store.group] = store

    def take(self) -> dict[GroupId, SegmentStore]:
        taken, self._stores = self._stores, {}
        return taken


class SidecarWriter:
    """Writes sidecars: `write` at once (the warmer), `offer` in the writer's own task (builds)."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger
        self.counts = SidecarCounts()
        self._pending: collections.deque[tuple[SegmentStore, ComputedSidecar]] = collections.deque()
        self._task: asyncio.Task[None] | None = None  # drains `_pending`; owned here, awaited by `close`

    def write(self, store: SegmentStore, computed: ComputedSidecar) -> bool:
        """Write `computed` if `store` still holds its segment unchanged; never raises an OSError."""
        segment = still_described(store, computed)
        if segment is None:
            return False  # dropped, reopened or replaced since the build: nothing to describe
        try:
            write_sidecar(store.files, segment.path, computed.sidecar)
        except OSError as error:
            self.counts.write_failures += 1
            self._logger.warning("tree_sidecar_not_written", group_id=int(store.group), path=segment.path,
                                 error=str(error))
            return False
        self.counts.written += 1
        return True

    def offer(self, store: SegmentStore, made: list[ComputedSidecar]) -> None:
        """Write these later, in the writer's task: a build's answer never waits for them."""
        for computed in made:
            if len(self._pending) >= PENDING_WRITES_MAX:
                self.counts.writes_dropped += 1
                continue
            self._pending.append((store, computed))
        self._start()

    def _start(self) -> None:
        if self._pending and (self._task is None or self._task.done()):  # done: cancelled before it ran
            self._task = watch(asyncio.create_task(self._drain(), name="tree-sidecar-writes"),
                               "tree-sidecar-writes", self._logger)

    async def flush(self) -> None:
        """Until what was offered is written (tests; the node's `close` drops it instead)."""
        self._start()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            while self._pending:
                store, computed = self._pending.popleft()
                self.write(store, computed)
                await asyncio.sleep(0)  # one small file at a time: the loop goes on between
        finally:
            self._task = None

    async def close(self) -> None:
        """Drop what waits and stop the task (the node stops)."""
        self._pending.clear()
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclasses.dataclass(slots=True)
class _Budget:
    builds: int = SEGMENTS_PER_PASS
    checks: int = CHECKS_PER_PASS

    @property
    def spent(self) -> bool:
        return self.builds <= 0 or self.checks <= 0


class SidecarWarmer:
    """Builds the missing sidecars of this node's partition replicas' closed segments."""

    def __init__(self, registry: GroupRegistry, writer: SidecarWriter, changed: ChangedStores, logger: Any,
                 bytes_per_s: int = 64 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert bytes_per_s >= 0
        self._registry = registry
        self._writer = writer
        self._changed = changed
        self._logger = logger
        self._pace = BytePace(bytes_per_s, clock)
        self._pending: dict[GroupId, SegmentStore] = {}  # noted, not finished yet
        # Per group: the closed segments checked (first index, generation), with a sidecar
        # that matches or none possible (a frame fails its check: a verify reports that).
        self._known: dict[GroupId, set[tuple[int, int]]] = {}
        self.stores_looked_at = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SCAN_S)
            await self.pass_once()

    async def pass_once(self) -> int:
        """One pass over the stores whose closed segments changed; the sidecars built."""
        self._pending.update(self._changed.take())
        budget, built = _Budget(), 0
        for group_id, store in list(self._pending.items()):
            if budget.spent:
                break
            registered = self._registry.stores.get(group_id)
            if registered is None and not store.closed:
                continue  # being opened: looked at once the registry holds it
            if store.closed or registered is not store or group_id not in self._registry.partitions:
                del self._pending[group_id]  # closed, replaced (its successor tells), or the metadata group
                if registered is None:
                    self._known.pop(group_id, None)  # the group is gone from this node
                continue
            self.stores_looked_at += 1
            done, count = await self._warm(group_id, store, budget)
            built += count
            if done:
                del self._pending[group_id]
            await asyncio.sleep(0)
        if built:
            self._logger.debug("tree_sidecars_built", count=built)
        return built

    async def _warm(self, group_id: GroupId, store: SegmentStore, budget: _Budget) -> tuple[bool, int]:
        """Check (and build) `store`'s closed segments not known yet: (all done, how many built)."""
        segments = [s for s in store.segments if s.closed and s.first_index >= store.first_index()]
        known = self._known.get(group_id, set()) & {(int(s.first_index), s.generation) for s in segments}
        self._known[group_id] = known  # pruned to the segments the store holds now
        built = checks = 0
        for segment in segments:
            key = (int(segment.first_index), segment.generation)
            if key in known:
                continue
            if budget.spent or self._registry.stores.get(group_id) is not store:
                return False, built
            budget.checks -= 1
            checks += 1
            if checks % CHECKS_PER_YIELD == 0:
                await asyncio.sleep(0)
            built += await self._check(store, segment, known, key, budget)
        return True, built

    async def _check(self, store: SegmentStore, segment: Segment, known: set[tuple[int, int]],
                     key: tuple[int, int], budget: _Budget) -> int:
        """One segment: known if its sidecar matches, else built and written. How many written."""
        try:
            if valid_sidecar(store, segment) is not None:
                known.add(key)
                return 0
            budget.builds -= 1
            computed = await self._build(store, segment)
            # A segment that cannot have one (a frame fails its check) is not read again by every
            # pass: a verify reads it and reports the damage (the warmer starts no repair itself).
            # One changed under the build is another segment (generation) and is looked at anew.
            known.add(key)
            # `write` logs its own OSErrors; inside the `try` all the same: no failure of one
            # sidecar may end the pass (the supervised task would restart, its lists lost).
            return 0 if computed is None else int(self._writer.write(store, computed))
        except (StorageError, OSError) as error:  # dropped meanwhile, its index keys gone, a read failed, ...
            self._logger.debug("tree_sidecar_skipped", group_id=int(store.group), segment=key[0], error=str(error))
            return 0

    async def _build(self, store: SegmentStore, segment: Segment) -> ComputedSidecar | None:
        builder = SegmentLeavesBuilder(store, segment)
        while True:
            await self._pace.ready()  # the token bucket allows the next slice (in debt after a big one)
            before = builder.bytes_hashed
            finished = builder.step(bytes_max=WARMER_SLICE_BYTES)
            hashed = builder.bytes_hashed - before
            self._pace.spent(hashed)
            self._writer.counts.warmer_bytes_hashed += hashed
            if finished:
                return builder.computed
            await asyncio.sleep(0)  # a slice at a time: the loop serves the groups between
