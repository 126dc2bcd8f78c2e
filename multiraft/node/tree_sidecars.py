"""Closed segments' tree sidecars on a node: written after a build, and built in the background.

A tree build takes a closed segment wholly inside its span from the segment's sidecar
(storage/tree_sidecar.py, storage/scrub.py), so a verify of identical copies reads the
open segment and the sidecars, not the log. Sidecars come from two places:

- **a build that read a closed segment whole** (a verify meeting a segment without a
  sidecar, or a deep verify, which reads them all) hands back what it computed on the
  way; `SidecarWriter.save` writes it (`ReplicaTrees.build` calls it once the tree is built);
- **the warmer** (`SidecarWarmer.run`, one task a node): every `SCAN_S` it looks at each
  partition replica's closed segments and builds the sidecar of each that lacks a
  matching one, reading it a slice at a time on the loop (the store is the loop's), as a
  verify's build does. So a segment gets its sidecar soon after it closes, and the first
  verify after a large copy is as cheap as the next. Its cost is one more read and hash
  of every closed segment, once, on each replica (about 1 ms per MiB here: docs/mirror.md
  "Incremental trees"), spread over passes of at most `SEGMENTS_PER_PASS` segments.

The write: the temporary file is written on the loop (a few KiB), fsynced on a thread,
and renamed over the sidecar's name (the directory fsynced) only if the store still
holds the segment unchanged; else it is dropped. A failure to write (a full disk) costs
only the sidecar: the next verify reads the segment again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from raftlog.storage import StorageError
from raftlog.types import GroupId
from storage.scrub import SegmentLeavesBuilder, still_described, valid_sidecar
from storage.tree_sidecar import SegmentLeaves, stage_sidecar

if TYPE_CHECKING:
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

SCAN_S = 2.0  # how often the warmer looks for closed segments without a sidecar
SEGMENTS_PER_PASS = 16  # built per pass at most (a 64 MiB segment: about 70 ms of hashing, in slices)
CHECKS_PER_PASS = 1024  # sidecars read and checked per pass at most (a few KiB each): a restart's first passes


class SidecarWriter:
    """Writes sidecars, one write per segment at a time on this node (a verify's build and the
    warmer may compute the same one: the second is skipped, as its temporary file is the first's)."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger
        self._writing: set[str] = set()  # segment paths whose sidecar is being written

    async def save(self, store: SegmentStore, made: list[SegmentLeaves]) -> int:
        """Write the sidecars a build computed of `store`'s closed segments; how many were written."""
        written = 0
        for sidecar in made:
            segment = still_described(store, sidecar)
            if segment is None or segment.path in self._writing:
                continue
            self._writing.add(segment.path)
            try:
                written += await self._save_one(store, segment.path, sidecar)
            finally:
                self._writing.discard(segment.path)
        return written

    async def _save_one(self, store: SegmentStore, path: str, sidecar: SegmentLeaves) -> int:
        try:
            staged = stage_sidecar(store.files, path, sidecar)
        except OSError as error:
            self._logger.warning("tree_sidecar_not_written", group_id=int(store.group), path=path, error=str(error))
            return 0
        try:
            await asyncio.to_thread(staged.fsync)
        except OSError as error:
            staged.abandon()
            self._logger.warning("tree_sidecar_not_written", group_id=int(store.group), path=path, error=str(error))
            return 0
        except BaseException:
            staged.abandon()
            raise
        if store.closed or still_described(store, sidecar) is None:  # dropped, reopened or cut meanwhile
            staged.abandon()
            return 0
        try:
            staged.install(store.directory)
        except OSError as error:  # the rename or the directory's fsync: a sidecar found later is checked anyway
            self._logger.warning("tree_sidecar_not_written", group_id=int(store.group), path=path, error=str(error))
            return 0
        return 1


class SidecarWarmer:
    """Builds the missing sidecars of this node's partition replicas' closed segments."""

    def __init__(self, registry: GroupRegistry, writer: SidecarWriter, logger: Any) -> None:
        self._registry = registry
        self._writer = writer
        self._logger = logger
        # Per group: the store checked, and its closed segments known to have a matching
        # sidecar, as (first index, last index, size): a reopened and closed again segment differs.
        self._known: dict[GroupId, tuple[SegmentStore, set[tuple[int, int, int]]]] = {}
        self.built = 0
        self.bytes_hashed = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SCAN_S)
            await self.pass_once()

    async def pass_once(self) -> int:
        """One pass over the replicas; the sidecars built."""
        budget = [SEGMENTS_PER_PASS, CHECKS_PER_PASS]
        built = 0
        self._known = {g: v for g, v in self._known.items() if self._registry.stores.get(g) is v[0]}
        for group_id in sorted(self._registry.partitions):
            if budget[0] <= 0 or budget[1] <= 0:
                break
            store = self._registry.stores.get(group_id)
            if store is None or store.closed:
                continue
            built += await self._warm(group_id, store, budget)
            await asyncio.sleep(0)
        if built:
            self._logger.debug("tree_sidecars_built", count=built)
        return built

    async def _warm(self, group_id: GroupId, store: SegmentStore, budget: list[int]) -> int:
        known = self._known.setdefault(group_id, (store, set()))[1]  # failed ones too: not tried again
        built = 0
        for segment in store.segments:
            if budget[0] <= 0 or budget[1] <= 0 or self._registry.stores.get(group_id) is not store:
                break
            shape = (int(segment.first_index), int(segment.last_index), segment.size)
            if not segment.closed or shape in known or segment.first_index < store.first_index():
                continue  # open, known, or compacted into (its first entries are no longer readable)
            budget[1] -= 1
            try:
                if valid_sidecar(store, segment) is not None:
                    known.add(shape)
                    continue
                budget[0] -= 1
                made = await self._build(group_id, store, segment)
            except StorageError as error:  # retention dropped it meanwhile, its index keys are gone, ...
                self._logger.debug("tree_sidecar_skipped", group_id=int(group_id), segment=shape[0], error=str(error))
                known.add(shape)
                continue
            # A segment that cannot have one (a frame fails its check) is not read again by every
            # pass: a verify reads it and reports the damage (the warmer starts no repair itself).
            known.add(shape)
            if made is not None and await self._writer.save(store, [made]):
                built += 1
                self.built += 1
        return built

    async def _build(self, group_id: GroupId, store: SegmentStore, segment: Any) -> SegmentLeaves | None:
        builder = SegmentLeavesBuilder(store, segment)
        while not builder.step():
            await asyncio.sleep(0)  # a slice at a time: the loop serves the groups between
            if self._registry.stores.get(group_id) is not store:
                return None
        self.bytes_hashed += builder.bytes_hashed
        return builder.result
