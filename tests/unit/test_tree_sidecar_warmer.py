"""The node's tree sidecar writer and warmer (multiraft/node/tree_sidecars.py) over real stores
and a stub registry: an idle pass touches no store, only stores told of a change are looked at,
the bytes hashed go through the rate, and no write failure escapes into the warmer's task."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.node.tree_sidecars import (
    WARMER_SLICE_BYTES,
    ChangedStores,
    SidecarWarmer,
    SidecarWriter,
)
from raftlog.messages import HardState
from raftlog.types import GroupId, Index, Term
from storage.config import StoreConfig
from storage.scrub import SegmentLeavesBuilder, build_tree, valid_sidecar
from storage.segments import SegmentStore
from storage.tree_sidecar import is_sidecar
from tests.storage.helpers import GROUP, SegmentHarness, data_entry


class _Logger:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.events.append(event)


def _written(harness: SegmentHarness, entries: int = 60) -> SegmentStore:
    store = harness.store
    for first in range(1, entries + 1, 4):
        store.append([data_entry(i, 1, count=5, value_bytes=40) for i in range(first, first + 4)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(entries)))
    store.sync()
    return store


def _registry(stores: dict[GroupId, Any]) -> SimpleNamespace:
    return SimpleNamespace(stores=stores, partitions=dict.fromkeys(stores, object()))


class _QuietStore:
    """A store the warmer must not look into: reading its segments is counted."""

    def __init__(self, group: int) -> None:
        self.group, self.closed, self.reads = GroupId(group), False, 0

    @property
    def segments(self) -> list[Any]:
        self.reads += 1
        return []

    def first_index(self) -> Index:
        return Index(1)


def test_an_idle_pass_over_many_stores_touches_none(tmp_path: Path) -> None:
    # Goal: issue 26's idle budget: at 10,000 quiet partitions a pass with nothing to do looks
    # into no store (it sorted and walked every one before: 25-61 ms of CPU a pass, every 2 s);
    # a store told of a change (a segment closed) is looked at, once, and only it.
    stores = {GroupId(g): _QuietStore(g) for g in range(1, 10_001)}
    changed = ChangedStores()
    warmer = SidecarWarmer(_registry(stores), SidecarWriter(_Logger()), changed, _Logger())  # type: ignore[arg-type]
    for store in stores.values():  # each opened holding closed segments
        changed.note(store)  # type: ignore[arg-type]
    for _ in range(20):  # the checks per pass bound how many a pass finishes: a few passes
        asyncio.run(warmer.pass_once())
    assert all(s.reads == 1 for s in stores.values()) and warmer.stores_looked_at == len(stores)
    began = time.process_time()
    for _ in range(10):
        asyncio.run(warmer.pass_once())
    idle_ms = (time.process_time() - began) * 100
    assert warmer.stores_looked_at == len(stores) and all(s.reads == 1 for s in stores.values())
    assert idle_ms < 5, f"an idle pass cost {idle_ms:.1f} ms of CPU"
    changed.note(stores[GroupId(77)])  # type: ignore[arg-type]
    asyncio.run(warmer.pass_once())
    assert warmer.stores_looked_at == len(stores) + 1 and stores[GroupId(77)].reads == 2


def test_the_warmer_builds_what_a_closed_segment_lacks_once(tmp_path: Path) -> None:
    # Goal: through the store's own notice (SegmentStore's `on_segments_changed`): the warmer
    # writes each closed segment's sidecar, and a second pass finds nothing to look at.
    changed = ChangedStores()
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096))
    harness.store.close()
    harness.store = SegmentStore(GROUP, os.path.join(str(tmp_path), "groups", str(GROUP)), harness.db, harness.files,
                                 StoreConfig(segment_bytes_max=4096), on_segments_changed=changed.note)
    store = _written(harness)
    writer = SidecarWriter(_Logger())
    warmer = SidecarWarmer(_registry({GROUP: store}), writer, changed, _Logger(), bytes_per_s=0)  # type: ignore[arg-type]
    closed = [s for s in store.segments if s.closed]
    assert asyncio.run(warmer.pass_once()) == len(closed) == writer.counts.written > 3
    assert all(valid_sidecar(store, s) is not None for s in closed)
    looked = warmer.stores_looked_at
    assert asyncio.run(warmer.pass_once()) == 0 and warmer.stores_looked_at == looked
    harness.close()


def test_the_warmer_hashes_within_its_rate(tmp_path: Path) -> None:
    # Goal: the warmer's reads go through a token bucket: hashing about 150 KB at 1 MB/s takes
    # at least 0.1 s (the bucket's burst aside), and every byte is counted.
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096))
    store = _written(harness, entries=600)
    closed = [s for s in store.segments if s.closed]
    changed = ChangedStores()
    changed.note(store)
    writer = SidecarWriter(_Logger())
    warmer = SidecarWarmer(_registry({GROUP: store}), writer, changed, _Logger(), bytes_per_s=1_000_000)  # type: ignore[arg-type]
    began = time.monotonic()

    async def warm() -> None:
        async with asyncio.timeout(30):
            while await warmer.pass_once():
                pass

    asyncio.run(warm())
    elapsed = time.monotonic() - began
    hashed = writer.counts.warmer_bytes_hashed
    assert writer.counts.written == len(closed) and hashed > 150_000
    assert elapsed >= (hashed - 50_000) / 1_000_000, f"{hashed} bytes hashed in {elapsed:.3f} s"
    harness.close()


def test_the_warmer_holds_the_loop_a_small_slice_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: background hashing never holds the loop for a verify-sized slice (8 MiB, about
    # 10 ms here): each step of a warmer build hashes at most WARMER_SLICE_BYTES and one batch.
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4 << 20))
    store = harness.store
    for first in range(1, 61, 4):  # 60 batches of ~100 KB: a closed segment of ~4 MiB
        store.append([data_entry(i, 1, count=100, value_bytes=1000) for i in range(first, first + 4)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(60)))
    store.sync()
    assert any(s.closed for s in store.segments)
    changed = ChangedStores()
    changed.note(store)
    steps: list[int] = []
    original = SegmentLeavesBuilder.step

    def counted(builder: SegmentLeavesBuilder, *args: Any, **kwargs: Any) -> bool:
        before = builder.bytes_hashed
        done = original(builder, *args, **kwargs)
        steps.append(builder.bytes_hashed - before)
        return done

    monkeypatch.setattr(SegmentLeavesBuilder, "step", counted)
    writer = SidecarWriter(_Logger())
    warmer = SidecarWarmer(_registry({GROUP: store}), writer, changed, _Logger(), bytes_per_s=0)  # type: ignore[arg-type]
    asyncio.run(warmer.pass_once())
    assert writer.counts.written >= 1 and sum(steps) == writer.counts.warmer_bytes_hashed > 2 * WARMER_SLICE_BYTES
    assert len(steps) > 2 and max(steps) < WARMER_SLICE_BYTES + 110_000, steps
    harness.close()


def test_a_failed_write_never_escapes_into_the_warmer(tmp_path: Path) -> None:
    # Goal: a sidecar write failing (a full disk; its temporary file removed meanwhile by a
    # drop, recovery or an install) is logged and counted; the warmer's pass completes (its
    # task is never restarted for it) and leaves no temporary file behind.
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096), durable_files=False)
    store = _written(harness)
    files, rename = store.files, store.files.rename

    def vanished(source: str, target: str) -> None:
        os.unlink(source)  # what forget_sidecar does when the segment is dropped meanwhile
        rename(source, target)

    files.rename = vanished  # type: ignore[method-assign]
    changed = ChangedStores()
    changed.note(store)
    logger = _Logger()
    writer = SidecarWriter(logger)
    warmer = SidecarWarmer(_registry({GROUP: store}), writer, changed, logger, bytes_per_s=0)  # type: ignore[arg-type]
    assert asyncio.run(warmer.pass_once()) == 0
    assert writer.counts.write_failures > 3 and "tree_sidecar_not_written" in logger.events
    assert not any(is_sidecar(name) for name in os.listdir(store.directory))

    class Raising(SidecarWriter):
        def write(self, store: Any, computed: Any) -> bool:
            raise OSError(5, "input/output error")

    changed.note(store)
    warmer = SidecarWarmer(_registry({GROUP: store}), Raising(logger), changed, logger, bytes_per_s=0)  # type: ignore[arg-type]
    assert asyncio.run(warmer.pass_once()) == 0
    harness.close()


def test_a_build_offers_its_sidecars_and_a_drop_before_the_write_writes_nothing(tmp_path: Path) -> None:
    # Goal: sidecars a build computed are written by the writer's own task after the build's
    # answer; a segment retention dropped before that gets none (no error, no stray file).
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096))
    store = _written(harness)
    writer = SidecarWriter(_Logger())

    async def scenario() -> None:
        built = build_tree(store, 0, int(store.log_end_offset))
        writer.offer(store, built.made)
        assert writer.counts.written == 0, "nothing written before the build's caller goes on"
        store.compact(Index([s for s in store.segments if s.closed][2].last_index))  # the first three go
        async with asyncio.timeout(10):
            await writer.flush()
        assert writer.counts.written == len(built.made) - 3 and writer.counts.write_failures == 0
        await writer.close()

    asyncio.run(scenario())
    kept = {os.path.basename(s.path) for s in store.segments}
    names = store.files.list_dir(store.directory)
    assert all(name.removesuffix(".leaves") in kept for name in names if is_sidecar(name))
    harness.close()


@pytest.mark.parametrize("pending", [1, 300])
def test_offered_writes_are_bounded(tmp_path: Path, pending: int) -> None:
    # Goal: the writer's queue is bounded: past PENDING_WRITES_MAX an offered sidecar is
    # dropped and counted (a cache: the next verify or the warmer makes it again).
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096))
    store = _written(harness)
    builder = SegmentLeavesBuilder(store, store.segments[0])
    while not builder.step():
        pass
    assert builder.computed is not None
    writer = SidecarWriter(_Logger())

    async def scenario() -> None:
        writer.offer(store, [builder.computed] * pending)
        await writer.flush()

    asyncio.run(scenario())
    assert writer.counts.writes_dropped == max(0, pending - 256)
    assert writer.counts.written == min(pending, 256)
    harness.close()
