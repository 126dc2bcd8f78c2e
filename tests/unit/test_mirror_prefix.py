"""Goal: the parts of a resync that keeps the identical prefix (docs/mirror.md, "Repair"),
each on its own: where the sink leader cuts (the last DATA entry wholly below the first
differing offset; none past a CONFIG entry), the catalog's new incarnation naming the
cut and keeping the old first start point, what a replica of the old group can keep
(storage/prefix.py), and one host's build over real segment files: the new group's log
is the old one's up to the cut, committed only to its start point, the old group's files
gone; a replica that cannot keep it, a build that fails half way and one a crash
interrupted all leave nothing of the new group behind (it starts as a new replica would).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.errors import InvalidRequest
from multiraft.metadata.catalog import Catalog, groups_for_node
from multiraft.metadata.catalog_records import LocalGroup, PartitionInfo
from multiraft.metadata.commands import (
    RegisterNode,
    ReplaceReplica,
    ReplicaLeft,
    decode_command,
    encode_command,
)
from multiraft.metadata.mirror_commands import ResyncMirrorPartition
from multiraft.node import mirror_prefix
from multiraft.node.mirror_bootstrap import bootstrap_mirror
from multiraft.node.mirror_prefix import (
    PrefixBuilder,
    choose_cut,
    config_after,
    cut_point,
    settled_cut,
)
from multiraft.node.replicas import Replicas
from multiraft.state.mirror_meta import MirrorSkips, encode_mirror_meta
from multiraft.state.partition import PartitionState
from raftlog.messages import Entry, EntryKind, HardState
from raftlog.types import GroupId, Index, NodeId, Offset, Term
from storage.config import StoreConfig
from storage.errors import CorruptionError
from storage.prefix import PREFIX_MARKER, check_kept, plan_prefix
from storage.recovery import load_state
from storage.segments import SegmentStore
from storage.state_db import CHECK_ALL, StateDatabase, group_key
from storage.write_behind import WriteBehindFiles
from tests.storage.helpers import data_entry
from tests.unit.test_mirror_catalog import LINK, MIRROR, _catalog

CONFIG = StoreConfig(segment_bytes_max=4096)
OLD, NEW = GroupId(5), GroupId(9)
LAST = 60  # entries in the old log, from 4 on; every fifth a META entry, the rest DATA of 3 records
VOTERS = (NodeId(1), NodeId(2), NodeId(3))
FIRST = (Index(3), Term(1))  # the first start point of a mirror partition with three voters
INFO = PartitionInfo(0, OLD, VOTERS)  # the old incarnation in the catalog: never moved


def _entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(Index(i), Term(term), EntryKind.META, b"meta-%d" % i) if i % 5 == 0
            else data_entry(i, term, count=3, value_bytes=60) for i in range(lo, hi)]


class _Host:
    """One host's storage: the database, the write-behind double (as chaos runs it), and an
    old group's store, with the narrow collaborators `PrefixBuilder` takes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = StateDatabase(str(root / "state"))
        self.files = WriteBehindFiles(str(root))
        self.groups = root / "groups"
        self.store = self.open(OLD)
        bootstrap_mirror(self.store, list(VOTERS), "orders", 0, 0)  # a mirror's first start point: entry 3
        for first in range(4, LAST + 1, 6):  # several appends: the store rolls segments between them
            self.store.append([e for e in _entries(4, 31) + _entries(31, LAST + 1, term=2)
                               if first <= e.index < first + 6])
        self.store.set_hard_state(HardState(term=Term(2), commit=Index(LAST)))
        self.store.sync()
        self.registry = SimpleNamespace(stores={OLD: self.store}, groups={OLD: SimpleNamespace(failed=False)})
        self.storage = SimpleNamespace(files=self.files, db=self.db, groups_directory=self.groups)
        self.closed: list[GroupId] = []
        self.synced = True  # what the close reports of its sync
        self.builder = PrefixBuilder(self.registry, self.storage, self.close, _Logger())  # type: ignore[arg-type]

    def open(self, group: GroupId) -> SegmentStore:
        return SegmentStore(group, str(self.groups / str(group)), self.db, self.files, CONFIG)

    async def close(self, group: GroupId, delete: bool, before_close: Any) -> None:
        store = self.registry.stores.pop(group)
        del self.registry.groups[group]
        store.sync()
        before_close(store, self.synced)
        store.close()
        self.closed.append(group)

    async def prepare(self, upto: Index, term: Term, next_offset: Offset) -> None:
        info = PartitionInfo(0, NEW, VOTERS, prefix=(OLD, upto, term, next_offset))
        catalog = SimpleNamespace(topics={"orders": SimpleNamespace(partitions=(info,))})
        async with asyncio.timeout(30):
            await self.builder.prepare(catalog, [(NEW, LocalGroup("orders", 0, info.replicas))])  # type: ignore[arg-type]


class _Logger:
    def bind(self, **_: object) -> _Logger:
        return self

    def info(self, *_: object, **__: object) -> None: ...

    warning = error = info


def _cut(store: SegmentStore, index: int) -> tuple[Index, Term, Offset]:
    return Index(index), store.term(Index(index)), store.offset_after(Index(index))


# -- where the sink leader cuts ---------------------------------------------------------


def test_the_cut_is_the_last_data_entry_wholly_below_the_first_differing_offset(tmp_path: Path) -> None:
    store = _Host(tmp_path).store
    end_of_12 = store.offset_after(Index(12))
    assert cut_point(store, end_of_12) == _cut(store, 12)  # a batch ending right there is kept
    assert cut_point(store, end_of_12 + 1) == _cut(store, 12)  # entry 13 reaches past it: not kept
    # Entry 16 follows the META entry 15: a difference inside 16 keeps up to 14, not the META.
    assert cut_point(store, store.offset_after(Index(15)) + 1) == _cut(store, 14)
    assert cut_point(store, store.log_end_offset) == _cut(store, LAST - 1)  # 60 is META
    # Nothing below the first batch's end to keep; offsets outside the log.
    assert cut_point(store, 1) is None and cut_point(store, 0) is None  # entry 4 holds offsets 0-2
    assert cut_point(store, store.log_end_offset + 1) is None


@pytest.mark.asyncio
async def test_no_cut_when_a_config_entry_follows_or_the_source_starts_past_it(tmp_path: Path) -> None:
    store = _Host(tmp_path).store
    at = store.offset_after(Index(40))
    async with asyncio.timeout(10):
        assert not await config_after(store, Index(39))
        # Entry 40 is a META entry: the cut is the DATA entry before it.
        assert await choose_cut(store, at, 0, INFO) == tuple(map(int, _cut(store, 39)))
        assert await choose_cut(store, at, 1, INFO) is None  # the source no longer holds the mirror's first offset
        two = PartitionInfo(0, OLD, VOTERS[:2])
        assert await choose_cut(store, at, 0, two) is None  # a log not at its first start point
        store.append([Entry(Index(LAST + 1), Term(2), EntryKind.CONFIG, b"conf")])
        assert await config_after(store, Index(39)) and not await config_after(store, Index(LAST + 1))
        assert await choose_cut(store, at, 0, INFO) is None  # the membership would go back


class _Growing:
    """A store the pipeline appends to while it is read: each read of a slice is followed by
    more entries than a slice holds."""

    def __init__(self, store: SegmentStore) -> None:
        self.store, self.reads = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def frames(self, lo: Index, hi: Index) -> Any:
        self.reads += 1
        assert self.reads <= 20, "the scan chases the tail"
        frames = list(self.store.frames(lo, hi))
        last = self.store.last_index()
        self.store.append([data_entry(i, 2) for i in range(last + 1, last + 2 * mirror_prefix.CONFIG_SCAN_ENTRIES)])
        return frames


@pytest.mark.asyncio
async def test_the_config_scan_ends_at_the_log_end_it_began_with(tmp_path: Path) -> None:
    growing = _Growing(_Host(tmp_path).store)
    async with asyncio.timeout(10):
        assert not await config_after(growing, Index(9))  # type: ignore[arg-type]
    # Entries 10..60, 16 a slice: four reads, whatever was appended meanwhile.
    assert growing.reads == 4 and growing.store.last_index() > LAST + 60


@pytest.mark.asyncio
async def test_no_cut_once_the_partition_moved(tmp_path: Path) -> None:
    store = _Host(tmp_path).store
    at = store.offset_after(Index(40))
    async with asyncio.timeout(10):
        # Made on {1,2,3}, moved to {1,4,5}: a new incarnation at the first start point would
        # name {1,2,3}, of which only node 1 hosts it.
        moved = PartitionInfo(0, OLD, (NodeId(1), NodeId(4), NodeId(5)), initial=VOTERS)
        assert await choose_cut(store, at, 0, moved) is None
        # Moved away and back: the voters are the first ones again, but the log holds the moves.
        assert await choose_cut(store, at, 0, dataclasses.replace(moved, replicas=VOTERS)) is None
        assert await choose_cut(store, at, 0, INFO) is not None


def _skips(index: int, *ranges: tuple[int, int]) -> Entry:
    return Entry(Index(index), Term(1), EntryKind.META, encode_mirror_meta(MirrorSkips(tuple(ranges))))


@pytest.mark.asyncio
async def test_no_cut_inside_a_chunk_whose_skips_reach_past_it(tmp_path: Path) -> None:
    # A chunk is a META entry naming the source's skipped batches over its whole range, then
    # one DATA entry per batch. Entries 4, 5: offsets 0-5. Chunk at 6: its META names the
    # batch at 9 (entry 8) skipped; 7, 8, 9: offsets 6-14. Chunk at 10: its META names 18
    # (entry 12) skipped; 11, 12: offsets 15-20. Entry 13: 21-23.
    host = _Host(tmp_path)
    store = host.open(NEW)
    bootstrap_mirror(store, list(VOTERS), "orders", 0, 0)
    store.append([data_entry(4, 1, count=3), data_entry(5, 1, count=3), _skips(6, (9, 3)),
                  *[data_entry(i, 1, count=3) for i in (7, 8, 9)], _skips(10, (18, 3)),
                  data_entry(11, 1, count=3), data_entry(12, 1, count=3), data_entry(13, 1, count=3)])
    store.sync()
    assert store.offset_after(Index(13)) == 24

    def pending_after(upto: int) -> set[tuple[int, int]]:  # the partition's own rules, applied again
        state = PartitionState(topic="orders", partition=0, applied_index=Index(3), next_offset=Offset(0),
                               mirror=True)
        for entry in store.entries(Index(4), Index(upto + 1), 1 << 30):
            state.apply(entry)
        return state.mirror_skips

    async with asyncio.timeout(10):
        # A difference at 9: entry 7 (6-8) is wholly below it, but the chunk's skip of the
        # batch at 9 would stay pending past it; the cut goes back before the chunk, to 5.
        assert cut_point(store, 9) == _cut(store, 7) and pending_after(7) == {(9, 3)}
        assert await choose_cut(store, 9, 0, INFO) == tuple(map(int, _cut(store, 5)))
        assert pending_after(5) == set()
        # At 12: entry 8 (9-11) ends the skip; nothing pends after it.
        assert await choose_cut(store, 12, 0, INFO) == tuple(map(int, _cut(store, 8))) and pending_after(8) == set()
        # At 18 and 21: inside the second chunk, whose skip of 18 pends after 11; back to 9.
        assert pending_after(11) == {(18, 3)}
        assert await choose_cut(store, 18, 0, INFO) == tuple(map(int, _cut(store, 9)))
        assert await choose_cut(store, 21, 0, INFO) == tuple(map(int, _cut(store, 12)))  # 12 ends the skip
        assert await settled_cut(store, Index(13)) == _cut(store, 13)
        assert await settled_cut(store, Index(4)) == _cut(store, 4)


# -- the catalog --------------------------------------------------------------------------


def test_a_prefix_resync_names_the_cut_and_keeps_the_first_start_point() -> None:
    catalog = _catalog(LINK, MIRROR)
    old = catalog.topic("orders").partitions[1]
    command = ResyncMirrorPartition(name="orders", partition=1, group_id=old.group_id, start_offset=77,
                                    prefix_index=40, prefix_term=2, prefix_offset=1234, prefix_voters=old.replicas)
    assert decode_command(encode_command(command)) == command
    # The leader saw other voters than the partition's replicas now (a move ended meanwhile):
    # the kept log would name them, so the catalog resyncs whole instead.
    elsewhere = _catalog(LINK, MIRROR)
    other = dataclasses.replace(command, prefix_voters=(NodeId(9),))
    assert elsewhere.apply(Index(10), other).ok
    whole = elsewhere.topic("orders").partitions[1]
    assert whole.prefix == () and whole.start_offset == 77 and whole.group_id != old.group_id
    assert catalog.apply(Index(10), command).ok
    fresh = catalog.topic("orders").partitions[1]
    assert fresh.group_id == catalog.next_group_id - 1 and fresh.prefix == (old.group_id, 40, 2, 1234)
    # A host that keeps nothing starts as the old incarnation did: same voters, same start offset.
    assert (fresh.initial, fresh.start_offset, fresh.replicas) == (old.initial, old.start_offset, old.replicas)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.topics == catalog.topics
    # A later resync without a prefix forgets it.
    assert catalog.apply(Index(11), ResyncMirrorPartition(name="orders", partition=1, group_id=fresh.group_id,
                                                          start_offset=77)).ok
    assert catalog.topic("orders").partitions[1].prefix == ()


@pytest.mark.parametrize("back", [False, True])
def test_a_partition_moved_since_its_incarnation_began_resyncs_whole(back: bool) -> None:
    # Made on node 1, moved to node 2 (and back to 1): the new incarnation would start at the
    # first start point naming node 1 alone, which no longer hosts it (or a kept log holding
    # the moves' CONFIG entries), so no prefix, even when the leader's voters are the replicas.
    moves = [RegisterNode(node_id=NodeId(2), raft_addr="b:1", http_addr="b:2"),
             ReplaceReplica(topic="orders", partition=1, old=NodeId(1), new=NodeId(2)),
             ReplicaLeft(topic="orders", partition=1, node=NodeId(1))]
    if back:
        moves += [ReplaceReplica(topic="orders", partition=1, old=NodeId(2), new=NodeId(1)),
                  ReplicaLeft(topic="orders", partition=1, node=NodeId(2))]
    catalog = _catalog(LINK, MIRROR, *moves)
    old = catalog.topic("orders").partitions[1]
    assert old.initial == (NodeId(1),) and old.replicas == ((NodeId(1),) if back else (NodeId(2),))
    command = ResyncMirrorPartition(name="orders", partition=1, group_id=old.group_id, start_offset=77,
                                    prefix_index=40, prefix_term=2, prefix_offset=1234, prefix_voters=old.replicas)
    assert catalog.apply(Index(20), command).ok
    fresh = catalog.topic("orders").partitions[1]
    assert fresh.group_id != old.group_id and fresh.prefix == ()
    assert (fresh.initial, fresh.start_offset) == ((), 77)  # bootstrapped by its replicas, at the source's start


# What 536c881, before the kept prefix, wrote for a resync (encode_command: sorted keys, no spaces).
OLD_RESYNC = b'{"group_id":7,"name":"orders","partition":1,"start_offset":77,"type":"resync_mirror_partition","v":1}'


def test_a_resync_keeping_nothing_reads_and_writes_as_before_the_prefix() -> None:
    # An upgraded node replays group 0's log, which holds resyncs an older node wrote: they
    # decode as keeping nothing (else the replay fails on every upgraded node, forever).
    whole = ResyncMirrorPartition(name="orders", partition=1, group_id=7, start_offset=77)
    assert decode_command(OLD_RESYNC) == whole
    # One keeping nothing is written byte for byte as before, so an older node applies it.
    assert encode_command(whole) == OLD_RESYNC
    # One keeping a prefix names it (an older node cannot apply it: docs/mirror.md, "Upgrading").
    kept = dataclasses.replace(whole, prefix_index=40, prefix_term=2, prefix_offset=1234, prefix_voters=(NodeId(1),))
    document = json.loads(encode_command(kept))
    assert {key: document[key] for key in ("prefix_index", "prefix_term", "prefix_offset", "prefix_voters")} == {
        "prefix_index": 40, "prefix_term": 2, "prefix_offset": 1234, "prefix_voters": [1]}
    assert decode_command(encode_command(kept)) == kept
    # Absent fields take their defaults, so one present alone is still checked.
    with pytest.raises(InvalidRequest):
        decode_command(OLD_RESYNC.replace(b'"v":1', b'"prefix_index":40,"v":1'))
    with pytest.raises(InvalidRequest):  # an unknown field is still refused
        decode_command(OLD_RESYNC.replace(b'"v":1', b'"prefix_kept":40,"v":1'))


def test_a_catalog_snapshot_from_before_the_prefix_restores() -> None:
    catalog = _catalog(LINK, MIRROR)
    old = catalog.topic("orders").partitions[1]
    assert catalog.apply(Index(10), ResyncMirrorPartition(
        name="orders", partition=1, group_id=old.group_id, start_offset=77, prefix_index=40, prefix_term=2,
        prefix_offset=1234, prefix_voters=old.replicas)).ok
    document = json.loads(catalog.snapshot())
    rows = [row for row in document["topics"] if "prefixes" in row]
    assert len(rows) == 1
    del rows[0]["prefixes"]  # as a snapshot written before the prefix is
    restored = Catalog.restore(json.dumps(document).encode())
    assert restored.topic("orders").partitions[1] == dataclasses.replace(catalog.topic("orders").partitions[1],
                                                                         prefix=())
    assert all(p.prefix == () for p in restored.topic("orders").partitions)


@pytest.mark.parametrize("bad", [{"prefix_index": 3, "prefix_voters": (1,)}, {"prefix_index": -1, "prefix_term": 1},
                                 {"prefix_offset": 2**63}, {"prefix_term": True},
                                 {"prefix_index": 3, "prefix_term": 1}, {"prefix_voters": (1,)},
                                 {"prefix_index": 3, "prefix_term": 1, "prefix_voters": [1]},
                                 {"prefix_index": 3, "prefix_term": 1, "prefix_voters": (0,)},
                                 {"prefix_index": 3, "prefix_term": 1, "prefix_voters": tuple(range(1, 9))}])
def test_prefix_shapes_are_bounded(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        ResyncMirrorPartition(**{"name": "t", "partition": 0, "group_id": 5, "start_offset": 0, **bad})  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_pass_does_not_open_an_incarnation_replaced_while_it_awaited() -> None:
    # The reconciler's pass lists the groups to open, then awaits the builds (PrefixBuilder
    # .prepare) while group 0 applies a resync to the same Catalog object. Opened after that,
    # the old incarnation would be created with the new one's start offset and term.
    catalog = _catalog(LINK, MIRROR)
    missing = sorted(groups_for_node(catalog, NodeId(1)).items())
    kept, old = catalog.topic("orders").partitions
    assert catalog.apply(Index(10), ResyncMirrorPartition(
        name="orders", partition=1, group_id=old.group_id, start_offset=77, prefix_index=40, prefix_term=5,
        prefix_offset=1234, prefix_voters=old.replicas)).ok
    opened: list[tuple[GroupId, object]] = []

    def open_store(group_id: GroupId, voters: list[NodeId], config: object, mirror: object,
                   create: bool) -> tuple[object, bool]:
        opened.append((group_id, mirror))
        return SimpleNamespace(), False

    replicas = SimpleNamespace(_registry=SimpleNamespace(groups={}), _closing=set(), _seen_at_start=set(),
                               open_store=open_store, _storage=SimpleNamespace(flusher=object()))
    chunk = Replicas._prepare_chunk(replicas, catalog, missing, True)  # type: ignore[arg-type]
    await chunk.flush
    assert opened == [(kept.group_id, ("orders", 0, 0, 1))]  # the unchanged partition, as it began
    assert replicas._seen_at_start == {old.group_id}  # the next pass deletes what it has on disk


# -- what a replica of the old group keeps -------------------------------------------------


def test_a_replica_keeps_whole_closed_files_and_cuts_the_one_holding_the_cut(tmp_path: Path) -> None:
    store = _Host(tmp_path).store
    plan = plan_prefix(store, *_cut(store, 40), FIRST)
    assert not isinstance(plan, str)
    assert [f.whole for f in plan.files] == [True] * (len(plan.files) - 1) + [False]
    assert plan.files[0].first_index == 4 and plan.files[-1].last_index == 40
    for before, after in zip(plan.files, plan.files[1:], strict=False):
        assert after.first_index == before.last_index + 1 and after.first_offset == before.next_offset
    assert len(plan.files) > 2
    cut = plan.files[-1]
    copy = tmp_path / "cut.seg"
    copy.write_bytes(Path(cut.source).read_bytes()[:cut.size_bytes])
    assert check_kept(str(copy), cut).frames[-1].index == 40  # the bytes up to the cut are whole frames
    with pytest.raises(CorruptionError):  # the whole file holds more than what is kept
        check_kept(cut.source, cut)


@pytest.mark.parametrize(("change", "reason"), [
    ({"upto": Index(LAST + 5)}, "ends at"), ({"term": Term(7)}, "has term"),
    ({"next_offset": Offset(3)}, "ends at offset"), ({"first_start": (Index(2), Term(1))}, "first start point")])
def test_a_replica_whose_log_does_not_match_the_cut_keeps_nothing(tmp_path: Path, change: dict[str, Any],
                                                                  reason: str) -> None:
    store = _Host(tmp_path).store
    upto, term, next_offset = _cut(store, 40)
    arguments = {"upto": upto, "term": term, "next_offset": next_offset, "first_start": FIRST, **change}
    plan = plan_prefix(store, **arguments)
    assert isinstance(plan, str) and reason in plan, plan


# -- one host's build ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_host_builds_the_new_log_from_its_own_copy(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    old = host.store
    upto, term, next_offset = _cut(old, 40)
    want = old.entries(Index(4), Index(41), 1 << 30)
    await host.prepare(upto, term, next_offset)
    assert host.closed == [OLD] and not (host.groups / str(OLD)).exists()
    assert host.builder.counts["built"] == 1 and host.builder.counts["bytes_linked"] > 0
    assert host.builder.counts["bytes_copied"] > 0
    new = host.open(NEW)
    assert (new.first_index(), new.last_index(), new.log_start_offset) == (4, 40, 0)
    assert new.snapshot() == old.snapshot()  # the first start point, as the old group's (and a new replica's)
    assert new.entries(Index(4), Index(41), 1 << 30) == want and new.offset_after(Index(40)) == next_offset
    # Committed only to its start point; the term of its last entry, no vote.
    assert new.initial_state().hard_state == HardState(term=term, vote=NodeId(0), commit=Index(3))
    assert not new.initial_state().needs_repair
    assert not (host.groups / str(NEW) / PREFIX_MARKER).exists()
    new.append([data_entry(41, 3)])  # a log like any other
    new.sync()
    assert new.last_index() == 41


@pytest.mark.asyncio
async def test_a_replica_that_cannot_keep_the_prefix_starts_as_a_new_one(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    upto, _, next_offset = _cut(host.store, 40)
    await host.prepare(upto, Term(9), next_offset)  # not this replica's term at the cut
    assert host.builder.counts == {"built": 0, "fallbacks": 1, "bytes_linked": 0, "bytes_copied": 0}
    assert not (host.groups / str(NEW)).exists() and not (host.groups / str(OLD)).exists()
    assert load_state(host.db, NEW)[1] == HardState()
    # The old incarnation not open here: nothing to close, nothing built.
    other = _Host(tmp_path / "other")
    other.registry.stores.clear()
    await other.prepare(upto, Term(2), next_offset)
    assert other.closed == [] and other.builder.counts["fallbacks"] == 1 and not (other.groups / str(NEW)).exists()


@pytest.mark.asyncio
async def test_a_replica_whose_close_could_not_sync_keeps_nothing(tmp_path: Path) -> None:
    # Its files may not be durable: linked, they would keep what a crash loses.
    host = _Host(tmp_path)
    host.synced = False
    await host.prepare(*_cut(host.store, 40))
    assert host.closed == [OLD] and host.builder.counts["fallbacks"] == 1 and host.builder.counts["built"] == 0
    assert not (host.groups / str(NEW)).exists() and not (host.groups / str(OLD)).exists()


@pytest.mark.asyncio
async def test_a_close_whose_sync_fails_says_so() -> None:
    class Store:
        closed = False

        def sync(self) -> None:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            self.closed = True

    async def stop() -> None: ...

    store, seen = Store(), []
    runtime = SimpleNamespace(stop=stop, failed=False)
    replicas = SimpleNamespace(_registry=SimpleNamespace(remove=lambda _: (runtime, store, None)), _logger=_Logger())
    await Replicas._close_group(replicas, OLD, False, lambda s, synced: seen.append(synced))  # type: ignore[arg-type]
    assert seen == [False] and store.closed
    runtime.failed = True  # a failed group is not synced at all
    await Replicas._close_group(replicas, OLD, False, lambda s, synced: seen.append(synced))  # type: ignore[arg-type]
    assert seen == [False, False]


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", [CorruptionError("a frame fails its check"),
                                     AssertionError("linked before its directory synced")])
async def test_a_build_that_fails_half_way_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          failure: Exception) -> None:
    # Whatever fails (an unexpected error too: the reconciler's pass goes on), this host keeps nothing.
    host = _Host(tmp_path)

    def rotten(path: str, kept: Any) -> Any:
        raise failure

    monkeypatch.setattr(mirror_prefix, "check_kept", rotten)
    await host.prepare(*_cut(host.store, 40))
    assert host.builder.counts["fallbacks"] == 1 and host.builder.counts["built"] == 0
    assert not (host.groups / str(NEW)).exists() and load_state(host.db, NEW)[1] == HardState()
    # A plan that fails unexpectedly: the old group still closes, nothing kept.
    other = _Host(tmp_path / "other")
    monkeypatch.setattr(mirror_prefix, "plan_prefix", rotten)
    await other.prepare(*_cut(other.store, 40))
    assert other.closed == [OLD] and other.store.closed and other.builder.counts["fallbacks"] == 1
    assert not (other.groups / str(NEW)).exists() and not (other.groups / str(OLD)).exists()


@pytest.mark.asyncio
async def test_a_build_a_crash_interrupted_is_forgotten_then_done_again(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    upto, term, next_offset = _cut(host.store, 40)
    # What a crash in the middle of an install can leave: the marker, files, half the records.
    directory = host.groups / str(NEW)
    os.makedirs(directory)
    (directory / PREFIX_MARKER).write_bytes(b"")
    (directory / "00000000000000000004.seg").write_bytes(b"half")
    batch = host.db.batch()
    batch.put(group_key(CHECK_ALL, NEW), b"1")
    host.db.write(batch, sync=True)
    await host.prepare(upto, term, next_offset)
    assert host.builder.counts["built"] == 1
    new = host.open(NEW)
    assert new.last_index() == 40 and new.recovery.corruption == ()
    # Opened before (no marker): left as it is, whatever the catalog says.
    new.close()
    host.registry.stores[OLD] = host.store  # (a stand-in: it must not be touched)
    await host.prepare(upto, term, next_offset)
    assert host.builder.counts["built"] == 1 and host.closed == [OLD]
