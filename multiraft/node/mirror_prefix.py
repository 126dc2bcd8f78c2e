"""A resync that keeps the identical prefix (docs/mirror.md, "Repair").

A mirror partition whose committed batches differ from its source's from offset X on is
replaced by a new incarnation, a new Raft group (a committed entry cannot be taken back,
storage gives offsets in log order). Its entries whose records all lie below X were
identical; the new incarnation keeps them instead of copying them again:

- **The cut** (`choose_cut`, on the sink leader that found the difference): the last DATA
  entry of its log whose records all lie below X and after which no mirror skip is
  pending (`settled_cut`), its term and the offset after it. It
  travels in `ResyncMirrorPartition`; the catalog names it on the new partition. No cut
  (a resync without a prefix) when that keeps nothing; when this leader's log no longer
  starts at the partition's first start point (retention compacted it: no replica would
  keep anything, below); when the source's log now starts past the mirror's (a replica
  that kept nothing could not be refilled from its first offset); when a CONFIG entry
  follows it (the new group would start with a membership the catalog no longer names);
  or when the partition moved since this incarnation began (`PartitionInfo.initial` set:
  the new group's start point names the first voters, which are no longer all its hosts,
  and the kept log holds the move's CONFIG entries).
- **The build** (`PrefixBuilder.prepare`, on every host, before the reconciler opens the
  new group for the first time): the old group is stopped and synced (a failed sync:
  this host keeps nothing, its files may not be durable); if this replica's
  log still starts at the old group's first start point and holds the cut entry with the
  cut's term and offset (storage/prefix.py `plan_prefix`), its files up to it are linked
  (closed ones) or copied (the one holding the cut, up to it) into the new group's
  directory, checked, and installed with that start point and a commit there
  (`far_install.replace_log`). Otherwise this host starts the new group as a new replica
  would (at the old incarnation's first start point: the catalog keeps its initial voters
  and start offset), but at the cut's term (mirror_bootstrap.py says why), and the new
  group's leader catches it up by the usual paths, as after a build that fails for any
  reason (an unexpected one is logged as an error). Either way the old group's directory
  goes, as a resync's always did.

Why every replica of the new group holds one log: each holds a prefix of one log, the old
group's first start point followed by its committed entries up to the cut (a host that
kept them: Raft's log matching from the cut entry's term; one that kept nothing: that
start point alone, or nothing if it was not among the first voters), with its commit at
that start point. A leader of the new group commits the kept entries with an entry of its
own term, and its log decides for the rest, as in any Raft group whose followers hold
more or less of an uncommitted tail: every voter starts at the cut's term at least, so
that own term is above every kept entry's, and its entries conflict with kept ones at
their indexes (never pass for them). storage/prefix.py says why the commit stays at the
first start point and what a crash mid-build leaves.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from multiraft.errors import ClientError
from multiraft.node.mirror_bootstrap import first_start
from multiraft.state.mirror_meta import (
    MIRROR_META_PREFIX,
    SKIPS_PENDING_MAX,
    MirrorPromote,
    decode_mirror_meta,
    is_mirror_meta,
)
from raftlog.messages import EntryKind
from raftlog.storage import StorageError, UnavailableError
from raftlog.types import GroupId, Index, Offset, Term
from storage.errors import CorruptionError
from storage.far_install import StagedSegment, replace_log, staged_name
from storage.offsets import lookup
from storage.prefix import (
    PREFIX_MARKER,
    KeptFile,
    PrefixPlan,
    check_kept,
    forget_group_state,
    plan_prefix,
)
from storage.segment import PARTIAL_SUFFIX

if TYPE_CHECKING:
    from multiraft.metadata.catalog import Catalog, LocalGroup
    from multiraft.metadata.catalog_records import PartitionInfo
    from multiraft.node.local_storage import LocalStorage
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

CONFIG_SCAN_ENTRIES = 16  # entries read per loop turn when looking for a CONFIG after the cut
CUT_SCAN_ENTRIES = 16  # entries read per loop turn when looking for pending skips up to the cut
COPY_CHUNK_BYTES = 4 * 1024 * 1024  # of the cut file, a loop turn


def cut_point(store: SegmentStore, differs_at: int) -> tuple[Index, Term, Offset] | None:
    """(index, term, next offset) of the last DATA entry of `store` whose records all lie
    below `differs_at`; None when none does past the log's start."""
    if not store.log_start_offset < differs_at <= store.log_end_offset:
        return None
    index, _ = lookup(store, Offset(differs_at - 1))
    if store.offset_after(index) > differs_at:  # this entry reaches `differs_at`: not kept
        if index - 1 <= store.snapshot().meta.index:
            return None
        base = store.offset_after(Index(index - 1))
        if base <= store.log_start_offset:
            return None
        index, _ = lookup(store, Offset(base - 1))
    assert store.offset_after(index) <= differs_at
    return index, store.term(index), store.offset_after(index)


async def settled_cut(store: SegmentStore, upto: Index) -> tuple[Index, Term, Offset] | None:
    """The last DATA entry at or before `upto` after which no mirror skip is pending, as
    (index, term, next offset); None when none is. Read from the log's start, a slice a
    loop turn, with the partition's own rules (multiraft/state/partition.py: a META entry's
    skips from its offset on become pending, a DATA entry drops those below its end).

    Why: a chunk is a META entry naming the source's skipped batches in its whole range,
    then one DATA entry per batch, so a cut can fall inside a chunk with some of its skips
    past the cut's offset. Applied again in the new incarnation, they would stay pending,
    and mark skipped a batch the source serves again at the same (base, count) and no
    longer skips (the source changed: that is why it resyncs), hiding its records."""
    pending: set[tuple[int, int]] = set()
    settled = None
    at = Index(store.snapshot().meta.index + 1)
    while at <= upto:
        hi = Index(min(upto + 1, at + CUT_SCAN_ENTRIES))
        for info, payload in store.frames(at, hi):
            if info.kind is EntryKind.DATA:
                pending = {s for s in pending if s[0] >= info.next_offset}
                if not pending:
                    settled = (info.index, info.term, info.next_offset)
            elif info.kind is EntryKind.META and is_mirror_meta(bytes(payload[:len(MIRROR_META_PREFIX)])):
                try:
                    command = decode_mirror_meta(bytes(payload))
                except ClientError:
                    continue  # the apply refuses it too: nothing pending
                if isinstance(command, MirrorPromote):
                    pending = set()
                    continue
                fresh = {r for r in command.ranges if r[0] >= info.base_offset}
                if len(pending | fresh) <= SKIPS_PENDING_MAX:
                    pending |= fresh
        at = hi
        await asyncio.sleep(0)
        if store.closed:
            raise UnavailableError("the log closed while it was read")
    return settled


async def config_after(store: SegmentStore, after: Index) -> bool:
    """Whether a CONFIG entry follows entry `after` in `store`'s log up to its last entry
    when called, read a slice a loop turn. The end is read once: the pipeline keeps
    appending meanwhile, and a scan that chased the tail under steady ingest would not end.
    A move begun later sets `initial`, which the catalog checks when the resync applies."""
    at, end = Index(after + 1), store.last_index()
    while at <= end:
        hi = Index(min(end + 1, at + CONFIG_SCAN_ENTRIES))
        if any(info.kind is EntryKind.CONFIG for info, _ in store.frames(at, hi)):
            return True
        at = hi
        await asyncio.sleep(0)
        if store.closed:
            raise UnavailableError("the log closed while it was read")
    return False


def may_keep_prefix(info: PartitionInfo) -> bool:
    """Whether a resync of this incarnation may keep a prefix: not if the partition moved
    since it began. The new incarnation starts at the old one's first start point, whose
    membership is its first voters (`bootstrap_voters`): after a move some of them no
    longer host it and some hosts are not among them (a partition made on {1,2,3} and moved
    to {1,4,5} would start with one voter of three hosting it: no election could win), and
    the kept log would hold the move's CONFIG entries. Only a move sets `initial` (until a
    whole resync), so an incarnation without it never changed its membership: its log holds
    no CONFIG entry past its first start point, and its first voters are its replicas."""
    return not info.initial


async def choose_cut(store: SegmentStore, differs_at: int, source_log_start: int,
                     info: PartitionInfo) -> tuple[int, int, int] | None:
    """The cut a resync keeps, or None: a resync without a prefix (see the module's docstring).
    `info`: the partition as the catalog names it now (its first voters say where its first
    start point is)."""
    if not may_keep_prefix(info):
        return None
    meta = store.snapshot().meta
    if (meta.index, meta.term) != first_start(info.bootstrap_voters):
        return None  # compacted: no replica's log likely starts at its first start point any more
    try:
        cut = cut_point(store, differs_at)
        # The source must still hold this partition from its first offset on: if the new
        # group's leader turns out to be a replica that kept nothing, it refills from there.
        if cut is None or source_log_start > store.log_start_offset:
            return None
        cut = await settled_cut(store, cut[0])  # no mirror skip pending past the cut
        if cut is None or await config_after(store, cut[0]):
            return None
    except StorageError:
        return None  # the log moved under the reads (retention), or a read failed its check
    return int(cut[0]), int(cut[1]), int(cut[2])


class PrefixBuilder:
    """Builds new mirror incarnations' first logs from the old ones' files, on one host."""

    def __init__(self, registry: GroupRegistry, storage: LocalStorage,
                 close_group: Callable[[GroupId, bool, Callable[[SegmentStore, bool], None]], Awaitable[None]],
                 logger: Any) -> None:
        self._registry = registry
        self._storage = storage
        self._close_group = close_group
        self._logger = logger
        self.counts = {"built": 0, "fallbacks": 0, "bytes_linked": 0, "bytes_copied": 0}

    async def prepare(self, catalog: Catalog, missing: list[tuple[GroupId, LocalGroup]]) -> None:
        """Before the reconciler opens `missing`: build the kept prefix of each new incarnation
        that names one and was never opened here."""
        for group_id, local in missing:
            topic = catalog.topics.get(local.topic)
            if topic is None or local.partition >= len(topic.partitions):
                continue
            info = topic.partitions[local.partition]
            if info.group_id == group_id and info.prefix:
                old, upto, term, next_offset = info.prefix
                await self._prepare(group_id, GroupId(old), (Index(upto), Term(term), Offset(next_offset)),
                                    first_start(info.bootstrap_voters))

    def _directory(self, group_id: GroupId) -> str:
        return str(self._storage.groups_directory / str(group_id))

    async def _prepare(self, group_id: GroupId, old: GroupId, cut: tuple[Index, Term, Offset],
                       start: tuple[Index, Term]) -> None:
        upto = cut[0]
        files = self._storage.files
        assert files is not None
        directory = self._directory(group_id)
        marker = os.path.join(directory, PREFIX_MARKER)
        if files.exists(directory) and not files.exists(marker):
            return  # opened here before: it is what it is
        if files.exists(marker):
            self._forget(group_id)  # a build a crash interrupted
        log = self._logger.bind(group_id=group_id, old_group=old, upto=upto)
        plans: list[PrefixPlan | str] = []

        def plan_stopped(store: SegmentStore, synced: bool) -> None:  # the old group stopped, its store open
            if not synced:  # its files may not be durable: a link would keep what a crash loses
                plans.append("its log could not be synced at its close")
                return
            try:
                plans.append(plan_prefix(store, *cut, start))
            except (OSError, StorageError) as error:
                plans.append(f"its log could not be read: {error!r}")
            except Exception as error:  # a bug: keep nothing rather than fail the close (and the pass)
                log.error("mirror_prefix_plan_failed", error=repr(error))
                plans.append(f"planning failed: {error!r}")

        if old in self._registry.stores and not self._registry.groups[old].failed:
            await self._close_group(old, False, plan_stopped)
        plan = plans[0] if plans else "the old incarnation is not open here"
        try:
            if isinstance(plan, str):
                self.counts["fallbacks"] += 1
                log.warning("mirror_prefix_not_kept", reason=plan)
                return
            await self._build(group_id, directory, marker, plan, log)
        finally:
            if plans:  # closed here, so the reconciler no longer sees it: its files go now
                files.remove_tree(self._directory(old))

    async def _build(self, group_id: GroupId, directory: str, marker: str, plan: PrefixPlan, log: Any) -> None:
        files, db = self._storage.files, self._storage.db
        assert files is not None and db is not None
        began = time.monotonic()
        try:
            files.make_dirs(directory)
            files.close(files.create(marker))
            files.sync_dir(directory)
            staged = await self._stage(directory, plan)
            replace_log(group_id, directory, db, files, staged, plan.start, plan.term, int(time.time() * 1000),
                        commit=plan.start.snapshot.meta.index)
            files.unlink(marker)
            files.sync_dir(directory)
        except Exception as error:  # whatever failed, this host keeps nothing
            # OSError, CorruptionError, StorageError are expected (a full disk, a rotten file);
            # anything else (an AssertionError of the write-behind double's link check, a
            # bug) is logged as an error and falls back too, rather than fail the
            # reconciler's pass and with it the opening of every other group.
            if not isinstance(error, OSError | CorruptionError | StorageError):
                log.error("mirror_prefix_build_failed", error=repr(error))
            self._forget(group_id)
            self.counts["fallbacks"] += 1
            log.warning("mirror_prefix_not_kept", reason=repr(error))
            return
        self.counts["built"] += 1
        linked = sum(f.size_bytes for f in plan.files if f.whole)
        self.counts["bytes_linked"] += linked
        self.counts["bytes_copied"] += plan.kept_bytes - linked
        log.info("mirror_prefix_kept", next_offset=plan.next_offset, files=len(plan.files), bytes=plan.kept_bytes,
                 seconds=round(time.monotonic() - began, 3))

    async def _stage(self, directory: str, plan: PrefixPlan) -> list[StagedSegment]:
        """Each kept file as `<segment>.incoming` in `directory`, durable, then checked whole on threads."""
        files = self._storage.files
        assert files is not None
        paths = []
        for kept in plan.files:
            path = os.path.join(directory, staged_name(kept.first_index))
            if kept.whole:
                files.link(kept.source, path)
            else:
                await self._copy(kept, path)
            paths.append(path)
        files.sync_dir(directory)
        return list(await asyncio.gather(*(asyncio.to_thread(check_kept, path, kept)
                                           for path, kept in zip(paths, plan.files, strict=True))))

    async def _copy(self, kept: KeptFile, path: str) -> None:
        """The cut file's bytes up to the cut entry's end, a chunk a loop turn, fsynced, named."""
        files = self._storage.files
        assert files is not None
        partial = path + PARTIAL_SUFFIX
        source = files.open(kept.source)
        try:
            target = files.create(partial)
            try:
                for position in range(0, kept.size_bytes, COPY_CHUNK_BYTES):
                    size = min(COPY_CHUNK_BYTES, kept.size_bytes - position)
                    files.append(target, [files.read(source, position, size)])
                    await asyncio.sleep(0)
                files.to_os(target)
                await asyncio.to_thread(files.detached_fsync(target))
            finally:
                files.close(target)
        finally:
            files.close(source)
        files.rename(partial, path)

    def _forget(self, group_id: GroupId) -> None:
        """Whatever an unfinished build left of `group_id`: its files and its records."""
        files, db = self._storage.files, self._storage.db
        assert files is not None and db is not None
        files.remove_tree(self._directory(group_id))
        forget_group_state(db, group_id)
