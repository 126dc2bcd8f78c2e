"""The node's flusher: small flushes inline, large ones on the fsync thread, failures typed."""

from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest
import structlog

from multiraft.runtime.flusher import (
    DETACH_BYTES_MIN,
    DETACH_STORES_MAX,
    FSYNC_PARALLEL_MAX,
    Flusher,
)
from raftlog.messages import HardState
from raftlog.types import Index, Term
from storage.errors import DiskFullError, SyncFailedError
from storage.files import OsFiles
from storage.node_state import decode_hard_state
from storage.segments import SegmentStore
from storage.state_db import HARD_STATE, StateDatabase, group_key
from tests.storage.helpers import entries

pytestmark = pytest.mark.asyncio


@pytest.fixture
def stores(tmp_path):
    db = StateDatabase(str(tmp_path / "state"))
    made = [SegmentStore(g, str(tmp_path / str(g)), db, OsFiles()) for g in (1, 2)]
    yield db, made
    for store in made:
        store.close()
    db.close()


async def test_large_flushes_go_to_the_fsync_thread_and_finish_in_order(stores, monkeypatch):
    # Goal: a flush over DETACH_BYTES_MIN fsyncs off the event loop, a small one on it;
    # both report durability, and close() waits for what is under way.
    db, (big, small) = stores
    threads = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        import threading

        threads.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    flusher = Flusher(db, structlog.get_logger())
    count = 0
    while count * 100 < DETACH_BYTES_MIN:  # entries of about 100 bytes of values each
        big.append(entries(count * 10 + 1, count * 10 + 11, count=5))
        count += 1
    await flusher.sync(big)
    assert big.sync().durable_index == big.last_index()
    assert threads and threads[-1].startswith("fsync")
    small.append(entries(1, 3))
    await flusher.sync(small)
    assert not threads[-1].startswith("fsync"), "a small flush stays on the loop"
    await flusher.close()


async def test_a_small_flush_of_several_stores_goes_to_the_fsync_thread(tmp_path, monkeypatch):
    # Goal: a flush of more than one store with data fsyncs off the loop however small it
    # is (one fsync per store adds up; on the thread they run side by side); a small
    # flush of one store stays on the loop.
    db = StateDatabase(str(tmp_path / "state"))
    many = [SegmentStore(g, str(tmp_path / str(g)), db, OsFiles()) for g in range(1, DETACH_STORES_MAX + 2)]
    threads: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        threads.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    flusher = Flusher(db, structlog.get_logger())
    try:
        for stores_in_flush, on_thread in ((1, False), (2, True), (DETACH_STORES_MAX + 1, True), (1, False)):
            for store in many[:stores_in_flush]:
                store.append(entries(store.last_index() + 1, store.last_index() + 2))
            threads.clear()  # (a new segment's directory is fsynced as it is made)
            await asyncio.gather(*(flusher.sync(store) for store in many[:stores_in_flush]))
            assert threads and all(name.startswith("fsync") == on_thread for name in threads), threads
            assert all(s.sync().durable_index == s.last_index() for s in many[:stores_in_flush])
        await flusher.close()
    finally:
        for store in many:
            store.close()
        db.close()


async def test_the_fsyncs_of_a_threaded_flush_run_side_by_side_and_all_finish_when_one_fails(tmp_path, monkeypatch):
    # Goal: the files of one flush are fsynced in parallel (ext4 commits fsyncs issued
    # together in one journal commit): every fsync of a FSYNC_PARALLEL_MAX-store flush
    # waits at one barrier, which only parallel fsyncs pass. When one of them fails, the
    # others still run to their end (each closes its duplicate descriptor) and every
    # waiter of the flush gets the error.
    db = StateDatabase(str(tmp_path / "state"))
    many = [SegmentStore(g, str(tmp_path / str(g)), db, OsFiles()) for g in range(1, FSYNC_PARALLEL_MAX + 1)]
    real_fsync = os.fsync
    barrier = threading.Barrier(FSYNC_PARALLEL_MAX, timeout=5)
    finished: list[str] = []

    def together(fd):
        barrier.wait()  # BrokenBarrierError (a failed flush) if they ran one after the other
        real_fsync(fd)
        finished.append(threading.current_thread().name)

    flusher = Flusher(db, structlog.get_logger())
    try:
        for store in many:
            store.append(entries(1, 3))  # (making the segment fsyncs its directory: not counted)
        monkeypatch.setattr(os, "fsync", together)
        await asyncio.wait_for(asyncio.gather(*(flusher.sync(store) for store in many)), 10)
        assert len(finished) == FSYNC_PARALLEL_MAX and len(set(finished)) == FSYNC_PARALLEL_MAX, finished
        assert all(s.sync().durable_index == s.last_index() for s in many)

        finished.clear()
        calls = 0

        def one_fails(fd):
            nonlocal calls
            calls += 1
            if calls == 4:
                raise OSError(errno.EIO, "I/O error")
            real_fsync(fd)
            finished.append(threading.current_thread().name)

        monkeypatch.setattr(os, "fsync", one_fails)
        for store in many:
            store.append(entries(3, 4))
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(flusher.sync(store) for store in many), return_exceptions=True), 10)
        assert all(isinstance(outcome, OSError) for outcome in outcomes), outcomes
        assert len(finished) == FSYNC_PARALLEL_MAX - 1, "every other fsync ran to its end"
        await flusher.close()
    finally:
        for store in many:
            store.close()
        db.close()


async def test_flushes_bound_for_the_thread_while_one_runs_there_wait_and_go_as_one(tmp_path, monkeypatch):
    # Goal: group commit across loop turns. While a flush runs on the fsync thread, the
    # flushes that would queue behind it (several stores each, two loop turns) wait and
    # then run as one flush (one fsync round), not one each; all their waiters wake
    # after their own entries are durable.
    db = StateDatabase(str(tmp_path / "state"))
    many = [SegmentStore(g, str(tmp_path / str(g)), db, OsFiles()) for g in range(1, 6)]
    release = threading.Event()
    real_fsync = os.fsync
    calls = 0

    def first_waits(fd):
        nonlocal calls
        calls += 1
        if calls == 1:
            assert release.wait(5)
        real_fsync(fd)

    flusher = Flusher(db, structlog.get_logger())
    try:
        for store in many:
            store.append(entries(1, 3))  # (making the segment fsyncs its directory: not counted)
        monkeypatch.setattr(os, "fsync", first_waits)
        running = flusher.sync_in_background(many[0])
        await asyncio.sleep(0.05)
        second = [flusher.sync(many[1]), flusher.sync(many[2])]
        await asyncio.sleep(0.05)
        third = [flusher.sync(many[3]), flusher.sync(many[4])]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in [running, *second, *third]) and flusher.flushes == 0
        release.set()
        await asyncio.wait_for(asyncio.gather(running, *second, *third), 5)
        assert flusher.flushes == 2, "the first flush, then one for the four stores that waited"
        assert calls == 5 and all(s.sync().durable_index == s.last_index() for s in many)
        await flusher.close()
    finally:
        for store in many:
            store.close()
        db.close()


async def test_a_background_sync_runs_on_the_thread_and_a_later_small_flush_waits_behind_it(stores, monkeypatch):
    # Goal: a leader's own appends (sync_in_background) never fsync on the event loop,
    # however small; and while such a flush runs, a small flush of the same store goes
    # to the thread after it, so its waiter never wakes before the earlier entries are
    # durable (a segment written before a roll is not fsynced by the later flush).
    db, (store, _) = stores
    threads = []
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            assert release.wait(5)
        real_fsync(fd)

    flusher = Flusher(db, structlog.get_logger())
    store.append(entries(1, 3))  # (making the segment fsyncs its directory: not counted)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    background = flusher.sync_in_background(store)
    await asyncio.sleep(0.05)
    assert threads == ["fsync_0"] and store.sync_in_flight
    store.append(entries(3, 4))
    later = flusher.sync(store)
    await asyncio.sleep(0.05)
    assert not later.done() and len(threads) == 1, "the small flush waited on the thread"
    release.set()
    await asyncio.wait_for(later, 5)
    assert background.done() and threads[-1].startswith("fsync")
    assert not store.sync_in_flight
    await flusher.close()


async def test_an_fsync_that_fails_on_the_thread_fails_every_waiter_typed(stores, monkeypatch):
    # Goal: ENOSPC from the fsync thread reaches the waiting groups as DiskFullError
    # (they fail and reopen), never a hang.
    db, (big, other) = stores

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    flusher = Flusher(db, structlog.get_logger())
    big.append(entries(1, 2000, count=5))
    monkeypatch.setattr(os, "fsync", full)
    waiting = [flusher.sync(big), flusher.sync(other)]
    for future in waiting:
        with pytest.raises(DiskFullError):
            await future
    monkeypatch.undo()
    await flusher.close()


async def test_a_store_whose_fsync_failed_syncs_no_more_and_fails_only_its_own_waiters(stores, monkeypatch):
    # Goal: after a failed fsync a log reports nothing durable again (a later fsync may
    # "succeed" over pages the kernel dropped): its group fails and is reopened. Another
    # group's flush in the same turn goes on; nothing piles up per sync.
    db, (broken, healthy) = stores
    flusher = Flusher(db, structlog.get_logger())
    broken.append(entries(1, 3))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError):
        await flusher.sync(broken)
    monkeypatch.undo()
    healthy.append(entries(1, 3))
    refused, served = flusher.sync(broken), flusher.sync(healthy)
    with pytest.raises(SyncFailedError):
        await refused
    await served
    assert healthy.sync().durable_index == 2
    await flusher.close()


def _stored_commit(db: StateDatabase, group: int) -> int:
    value = db.get(group_key(HARD_STATE, group))
    return 0 if value is None else decode_hard_state(value).commit


async def test_a_moved_commit_index_rides_with_the_next_flush_or_is_stored_after_a_delay(stores, monkeypatch):
    # Goal: a commit-only change costs no flush of its own: the next flush (of any group)
    # stores it, and without one it is stored after COMMIT_STORE_DELAY_S; a store closed
    # meanwhile is skipped.
    monkeypatch.setattr("multiraft.runtime.flusher.COMMIT_STORE_DELAY_S", 0.05)
    db, (leader, other) = stores
    flusher = Flusher(db, structlog.get_logger())
    leader.append(entries(1, 4))  # indexes 1-3
    await flusher.sync(leader)
    leader.set_hard_state(HardState(term=Term(1), commit=Index(3)))
    flusher.store_lazily(leader)
    assert _stored_commit(db, 1) == 0, "not stored on its own"
    other.append(entries(1, 3))
    await flusher.sync(other)
    flusher.write_states()  # what the woken group does before it applies
    assert _stored_commit(db, 1) == 3, "stored with another group's flush"

    leader.append(entries(4, 5))
    await flusher.sync(leader)
    leader.set_hard_state(HardState(term=Term(1), commit=Index(4)))
    flusher.store_lazily(leader)
    await asyncio.sleep(0.2)
    assert _stored_commit(db, 1) == 4, "stored after the delay without another flush"

    leader.set_hard_state(HardState(term=Term(1), commit=Index(4)))
    other.set_hard_state(HardState(term=Term(1), commit=Index(2)))
    flusher.store_lazily(other)
    other.close()
    await asyncio.sleep(0.2)
    assert _stored_commit(db, 2) == 0, "a closed store is not written"
    await flusher.close()


async def test_a_flush_wakes_its_waiters_before_it_writes_the_states(stores):
    # Goal: a follower's answer waits for its entries' fsync, not for the database write
    # of its commit and applied indexes: the waiter runs first, the state is written when
    # it calls write_states (or, if nobody does, one loop turn later), once for all stores.
    db, (one, two) = stores
    flusher = Flusher(db, structlog.get_logger())
    for store in (one, two):
        store.append(entries(1, 3))
        store.set_hard_state(HardState(term=Term(1), commit=Index(0)))
    await asyncio.gather(flusher.sync(one), flusher.sync(two))
    flusher.write_states()
    writes = []
    original = db.write
    db.write = lambda batch, sync: (writes.append(sync), original(batch, sync=sync))  # type: ignore[method-assign]

    one.append(entries(3, 4))
    one.set_hard_state(HardState(term=Term(1), commit=Index(2)))
    two.set_hard_state(HardState(term=Term(1), commit=Index(2)))
    flusher.store_lazily(two)
    await flusher.sync(one)
    assert (_stored_commit(db, 1), _stored_commit(db, 2), writes) == (0, 0, []), "not before the waiter ran"
    flusher.write_states()
    assert (_stored_commit(db, 1), _stored_commit(db, 2), writes) == (2, 2, [False]), "one unsynced write"
    flusher.write_states()
    assert writes == [False], "nothing is written twice"

    # Nobody calls (a leader's flush with nothing to apply): the write comes after what
    # the woken waiter woke in its turn (a leader's answer to its client).
    for _ in range(3):
        await asyncio.sleep(0)  # what earlier flushes scheduled has run
    one.append(entries(4, 5))
    one.set_hard_state(HardState(term=Term(1), commit=Index(3)))
    await flusher.sync(one)
    loop = asyncio.get_running_loop()
    seen_by_woken: asyncio.Future[int] = loop.create_future()
    loop.call_soon(lambda: seen_by_woken.set_result(_stored_commit(db, 1)))
    assert await seen_by_woken == 2, "what the waiter woke ran before the write"
    for _ in range(3):
        await asyncio.sleep(0)
    assert (_stored_commit(db, 1), writes) == (3, [False, False]), "then written without a call"
    await flusher.close()


async def test_a_new_term_or_vote_is_written_and_synced_before_the_waiters_wake(stores):
    # Goal: a vote is durable before the message that carries it is sent, so a flush
    # with a term or vote change writes (synced) before its waiters run.
    db, (one, _) = stores
    flusher = Flusher(db, structlog.get_logger())
    one.append(entries(1, 3))
    one.set_hard_state(HardState(term=Term(2), vote=2, commit=Index(1)))
    synced_before = flusher.synced_writes
    await flusher.sync(one)
    stored = decode_hard_state(db.get(group_key(HARD_STATE, 1)))
    assert (stored.term, stored.vote, stored.commit) == (2, 2, 1)
    assert flusher.synced_writes == synced_before + 1
    await flusher.close()


async def test_a_failed_state_write_fails_the_stores_next_flush(stores, monkeypatch):
    # Goal: a state write that fails after the waiters woke is not lost silently: the
    # caller gets the error and every store of that write fails its next flush (typed),
    # so its group reopens from disk.
    db, (one, two) = stores
    flusher = Flusher(db, structlog.get_logger())
    one.append(entries(1, 3))
    one.set_hard_state(HardState(term=Term(1), commit=Index(0)))
    await flusher.sync(one)  # a new term: written before the waiter woke
    one.append(entries(3, 4))
    one.set_hard_state(HardState(term=Term(1), commit=Index(2)))
    await flusher.sync(one)  # only the commit moved: written by write_states

    def broken(batch, sync):
        raise OSError(errno.EIO, "state database write failed")

    monkeypatch.setattr(db, "write", broken)
    with pytest.raises(OSError):
        flusher.write_states()
    monkeypatch.undo()
    one.append(entries(4, 5))
    with pytest.raises(SyncFailedError):
        await flusher.sync(one)
    two.append(entries(1, 2))
    await flusher.sync(two)  # another store goes on
    await flusher.close()


async def test_a_failed_hand_over_to_the_os_refuses_only_its_own_store(tmp_path, monkeypatch):
    # Goal: with the chaos write-behind double, a small (on-the-loop) flush first hands
    # each store's held-back appends to the OS; ENOSPC there fails that store's waiter
    # (typed: its group reopens) and the other store's flush in the same turn goes on.
    from storage.write_behind import WriteBehindFiles

    db = StateDatabase(str(tmp_path / "state"))
    files = WriteBehindFiles(str(tmp_path))
    full_store, other = (SegmentStore(g, str(tmp_path / str(g)), db, files) for g in (1, 2))
    try:
        flusher = Flusher(db, structlog.get_logger())
        full_store.append(entries(1, 3))
        other.append(entries(1, 3))
        real_writev = os.writev
        full_fd = full_store._segments[-1].handle.fd

        def writev(fd, buffers):
            if fd == full_fd:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_writev(fd, buffers)

        monkeypatch.setattr(os, "writev", writev)
        refused, served = flusher.sync(full_store), flusher.sync(other)
        with pytest.raises(DiskFullError):
            await refused
        await served
        monkeypatch.undo()
        assert other.sync().durable_index == 2
        await flusher.close()
    finally:
        full_store.close()
        other.close()
        db.close()
