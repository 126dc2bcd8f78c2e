"""Cross-group group commit: one database write per event-loop turn for every group.

Each group's Ready loop writes its entries and hard state to its own store, then
asks the flusher to make them durable and waits. The flusher runs once per
event-loop turn for everyone who asked: it fsyncs each touched segment file once
(a large flush on its one fsync thread: an fsync blocks for 0.1-2 ms here, and on
the event loop it took a sixth of a busy leader's time, during which no request
was parsed and no follower answer read; the files of one flush are fsynced in
parallel, see `FSYNC_PARALLEL_MAX`), then writes all the groups' hard states
in *one* rocksdict batch, synced only if some group's term or vote changed (a
vote must be durable before it is sent).

Why it matters: a synced rocksdict write holds the GIL for about a millisecond
(../shared/DEPS.md). With a thousand groups electing at once, one synced write
per group would block the event loop for a second per round, answers would
arrive after the election timeout, and elections would never settle. Batched,
the round costs one write.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from multiraft.runtime.histograms import Histogram
from storage.config import FlushMode
from storage.segments import PendingSync, SegmentStore
from storage.state_db import StateDatabase

# Below this much appended data a flush fsyncs on the event loop: a small fsync is
# quick, and the hop to the fsync thread and back cost more than it (sequential
# single-record writes: +1.2 ms p50, +0.5 ms CPU per follower when every fsync hopped).
DETACH_BYTES_MIN = 64 * 1024
# A flush of more stores than this fsyncs on the thread whatever its bytes: each store
# is at least one fsync of its own, and a node electing or restarting a thousand groups
# flushes hundreds of small stores at once (a restarting node spent 17 % of its samples
# in fsync on the loop, docs/scale.md), while one hop to the thread costs about one.
DETACH_STORES_MAX = 8
# The fsyncs of one threaded flush run side by side, this many at a time. On ext4 each
# fsync of a file commits the journal; fsyncs issued together share a commit and the
# device's cache flush. Measured here (8 files, 12.5 KB appended to each): 1.6 ms one
# after the other, 0.73-0.86 ms in parallel, 0.26 ms for one file of the same 100 KB.
# Partitions spread over a node are many files per flush: a produce over 8 partitions
# flushed 2-3 stores per round, one after the other, at half the rate of 1 partition
# (issue 26). A flush of several stores with data therefore always goes to the thread.
FSYNC_PARALLEL_MAX = 8
# A leader's commit index moves once per write, after the write's own flush: stored
# at once it cost a second flush per write (a database write and a loop turn). It
# rides along with the next flush instead (the next write's, usually within a
# millisecond), or is stored after this delay at the latest. Raft never needs it
# durable, but recovery uses it as a witness (a log ending below it lost durable
# entries and goes into repair), so the delay stays short.
COMMIT_STORE_DELAY_S = 0.01


class Flusher:
    def __init__(self, db: StateDatabase, logger: Any) -> None:
        self._db = db
        self._logger = logger
        self._waiting: list[tuple[SegmentStore, asyncio.Future[None]]] = []
        self._scheduled = False
        self._detach = False  # the next flush runs on the fsync thread, whatever its size
        # One thread, so threaded flushes finish in the order they began (the stores
        # also order their syncs, as a small flush on the loop can finish first).
        self._fsync_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        # Its helpers: the other fsyncs of the flush the fsync thread runs (`_run_all`).
        self._fsync_helpers = ThreadPoolExecutor(max_workers=FSYNC_PARALLEL_MAX - 1, thread_name_prefix="fsync-helper")
        self._in_flight: set[asyncio.Future[None]] = set()
        self._lazy: dict[int, SegmentStore] = {}  # stores whose only change is a commit index
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._interval_timers: dict[int, asyncio.TimerHandle] = {}  # stores whose interval fsync is due later
        self._due: dict[int, SegmentStore] = {}  # flushed stores whose state is not written yet
        self._due_scheduled = False
        self.flushes = 0
        self.synced_writes = 0
        self.latency: Histogram | None = None

    def sync(self, store: SegmentStore) -> asyncio.Future[None]:
        """A future resolved once everything `store` was given so far is durable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append((store, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def sync_in_background(self, store: SegmentStore) -> asyncio.Future[None]:
        """Like `sync`, for a caller that does not wait for it (a leader's own appends):
        the fsyncs run on the fsync thread whatever their size, so a slow fsync never
        holds up the event loop, where the followers' answers that commit the entries
        are read meanwhile."""
        self._detach = True
        return self.sync(store)

    def store_lazily(self, store: SegmentStore) -> None:
        """`store`'s commit index moved and nothing else: store it with the next flush."""
        self._lazy[id(store)] = store
        if self._lazy_timer is None:
            self._lazy_timer = asyncio.get_running_loop().call_later(COMMIT_STORE_DELAY_S, self._store_lazy)

    def _retry_when_due(self, store: SegmentStore) -> None:
        """An `interval_ms` store skipped its fsync (the interval was not up): flush it
        when it is, whether or not anything else is written by then."""
        due_ms = store.interval_sync_due_ms()
        if due_ms is None or id(store) in self._interval_timers:
            return

        def due() -> None:
            del self._interval_timers[id(store)]
            if not store.closed:
                self.sync(store).add_done_callback(_consume_outcome)

        self._interval_timers[id(store)] = asyncio.get_running_loop().call_later(due_ms / 1000 + 0.001, due)

    def _store_lazy(self) -> None:
        self._lazy_timer = None
        lazy, self._lazy = self._lazy, {}
        for store in lazy.values():
            if not store.closed:
                self.sync(store).add_done_callback(_consume_outcome)

    async def close(self) -> None:
        """Wait for the flushes under way and the one waiting for them (their stores and the
        database stay open until then)."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))
            await asyncio.sleep(0)  # the waiting flush, scheduled by the one that ended, starts
        for timer in self._interval_timers.values():
            timer.cancel()
        self._interval_timers.clear()
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()  # the stores' own final sync stores what waits here
            self._lazy_timer = None
        self._write_states_later()
        self._fsync_thread.shutdown(wait=True)
        self._fsync_helpers.shutdown(wait=True)

    def _flush(self) -> None:
        """Start every waiting store's fsyncs on the fsync thread, so the event loop keeps
        serving (reads, other groups, the next requests) while the disk works; a small
        flush of one store (or one with nothing to fsync: only a commit index moved)
        runs here. A flush bound for the thread while another runs there waits for it."""
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        began = time.perf_counter()
        pending: list[tuple[SegmentStore, PendingSync]] = []
        refused: dict[int, BaseException] = {}
        stores = list({id(store): store for store, _ in waiting}.values())
        # Decided before the syncs start: fsyncs that stay on the loop need no duplicate
        # descriptors. A store with a flush still running on the thread is flushed there
        # too, after it: a waiter woken here first could take the earlier flush's
        # entries for durable (a segment it wrote before a roll is not fsynced here).
        detach = self._detach or len(stores) > DETACH_STORES_MAX or any(store.sync_in_flight for store in stores) or (
            sum(store.unsynced_bytes for store in stores) >= DETACH_BYTES_MIN
        ) or sum(1 for store in stores if store.unsynced_bytes) > 1
        if detach and self._in_flight:
            # It would queue on the thread behind the flush running there: it waits here
            # instead, and whatever arrives meanwhile joins it, so a busy node runs one
            # flush per fsync round, not one per loop turn (each its own fsyncs).
            self._waiting = waiting + self._waiting
            self._detach = True
            return
        self._detach = False
        for store in stores:
            try:
                started = store.start_sync(detached=detach)
            except Exception as error:  # this store's groups fail (and reopen); not the others
                refused[id(store)] = error
                continue
            if started is not None:
                pending.append((store, started))
            else:
                self._retry_when_due(store)
        if refused:
            for store, future in waiting:
                if id(store) in refused and not future.done():
                    future.set_exception(refused[id(store)])
            waiting = [(store, future) for store, future in waiting if id(store) not in refused]
        fsyncs = [fsync for _, started in pending for fsync in started.fsyncs]
        if not detach:
            try:
                _run_all(fsyncs)
            except Exception as error:
                self._failed(waiting, pending, error)
                return
            self._finish(waiting, pending, began)
            return
        job = asyncio.get_running_loop().run_in_executor(self._fsync_thread, _run_all, fsyncs, self._fsync_helpers)
        self._in_flight.add(job)

        def done(job: asyncio.Future[None]) -> None:
            self._in_flight.discard(job)
            error = job.exception()
            if error is not None:
                self._failed(waiting, pending, error)
            else:
                self._finish(waiting, pending, began)
            if self._waiting and not self._scheduled:  # the flush that waited for this one
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

        job.add_done_callback(done)

    @staticmethod
    def _failed(
        waiting: list[tuple[SegmentStore, asyncio.Future[None]]],
        pending: list[tuple[SegmentStore, PendingSync]],
        error: BaseException,
    ) -> None:
        """Stores whose fsyncs were in the failed batch sync no more (their groups fail and
        are reopened); the others' syncs had nothing of their own to make durable."""
        for store, started in pending:
            if started.fsyncs:
                store.abandon_sync(error)
            else:
                store.finish_sync(started)
        _fail(waiting, error)

    def _finish(
        self,
        waiting: list[tuple[SegmentStore, asyncio.Future[None]]],
        pending: list[tuple[SegmentStore, PendingSync]],
        began: float,
    ) -> None:
        """The fsyncs are done: record them, then wake the waiters. The stores' state
        (hard state, applied index) is written in one database write for all of them:
        before the waiters wake when a term or vote changed (a vote is durable before it
        is sent) or a lazier flush policy wants it synced with the files; otherwise right
        after, when the first woken group calls `write_states` (see there)."""
        try:
            for store, started in pending:
                store.finish_sync(started)
            due = self._due
            for store, _ in waiting:
                due[id(store)] = store
            lazy, self._lazy = self._lazy, {}
            due.update(lazy)  # commit indexes waiting for a flush: this one
            lazy_policy = any(s.config.flush.mode is not FlushMode.FSYNC for s, _ in pending)
            fsynced = any(started.segments for _, started in pending)
            if (fsynced and lazy_policy) or any(store.vote_unsaved() for store in due.values()):
                self.write_states(sync=True)
        except Exception as error:
            _fail(waiting, error)
            return
        self.flushes += 1
        if self.latency is not None:
            self.latency.observe(time.perf_counter() - began)
        for _, future in waiting:
            if not future.done():
                future.set_result(None)
        if self._due and not self._due_scheduled:
            # Two turns on: after the woken groups' turns and after what those woke (a
            # leader's answer to its client), none of which waits for this write then.
            self._due_scheduled = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._write_states_later)

    def write_states(self, sync: bool = False) -> None:
        """Write the state of every store a finished flush left due, in one database write.

        Why after the waiters woke: a follower's answer to its leader waits for its
        entries to be durable, not for its commit index or applied index (Raft needs
        neither stored; recovery takes them as a lower bound). Written before, the
        write sat on every sequential write's critical path (about 0.1 ms of a
        follower's turn). A group with entries to apply calls this after sending its
        answers and before applying, so nothing it serves is above what is stored, as
        before. A leader's flush usually has nothing to apply (its entries commit
        later, with their commit index stored lazily): then the write waits two loop
        turns, so the commit that the followers' answers bring, and the answer to the
        client, do not wait behind it either.
        Synced when `sync` or when some store's term or vote changed. Raises if the
        write fails; the stores then sync no more (their groups fail and reopen)."""
        due, self._due = self._due, {}
        if not due:
            return
        batch = self._db.batch()
        must_sync = sync
        for store in due.values():
            if not store.closed:  # a closing store stored its own state
                must_sync = store.stage_state(batch) or must_sync
        try:
            self._db.write(batch, sync=must_sync)
        except Exception as error:
            for store in due.values():
                store.abandon_sync(error)
            raise
        self.synced_writes += int(must_sync)

    def _write_states_later(self) -> None:
        self._due_scheduled = False
        try:
            self.write_states()
        except Exception as error:  # the stores' next flush fails their groups
            self._logger.error("state_write_failed", error=repr(error))


def _consume_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a failure here fails the group's next real flush too


def _run_all(fsyncs: list[Any], helpers: ThreadPoolExecutor | None = None) -> None:
    """Run every fsync; with `helpers`, side by side (this thread runs the first). Every
    one runs to its end even when another fails (each closes its own descriptor); the
    first error is raised after all of them."""
    if helpers is None or len(fsyncs) < 2:
        for fsync in fsyncs:
            fsync()
        return
    others = [helpers.submit(fsync) for fsync in fsyncs[1:]]
    error: BaseException | None = None
    try:
        fsyncs[0]()
    except BaseException as failed:  # raised below, after the others finished
        error = failed
    for other in others:
        try:
            other.result()
        except BaseException as failed:
            error = error or failed
    if error is not None:
        raise error


def _fail(waiting: list[tuple[SegmentStore, asyncio.Future[None]]], error: BaseException) -> None:
    for _, future in waiting:
        if not future.done():
            future.set_exception(error)
