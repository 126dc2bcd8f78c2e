"""Flush policies: what each makes durable, and what it reports."""

from __future__ import annotations

import os

from raftlog.messages import HardState
from raftlog.types import Index, NodeId, Term
from storage.config import FlushMode, FlushPolicy, StoreConfig
from tests.storage.helpers import SegmentHarness, entries


def test_policy_parsing():
    # Goal: the config spellings map to policies.
    assert FlushPolicy.parse("fsync") == FlushPolicy()
    assert FlushPolicy.parse("none").mode is FlushMode.NONE
    assert FlushPolicy.parse("interval_ms=50") == FlushPolicy(FlushMode.INTERVAL, 50)


def test_fsync_group_commit_one_fsync_per_file(tmp_path):
    # Goal: many appends, one sync: one fsync of the touched segment, everything durable.
    harness = SegmentHarness(str(tmp_path))
    store = harness.store
    for first in range(1, 50, 7):
        store.append(entries(first, first + 7))
    result = store.sync()
    assert (result.durable_index, result.fsync_count) == (49, 1)
    assert store.sync().fsync_count == 0
    harness.close()


def test_interval_policy_reports_only_what_was_fsynced(tmp_path):
    # Goal: under interval_ms, sync reports durability only once the interval passed.
    config = StoreConfig(flush=FlushPolicy(FlushMode.INTERVAL, 100))
    harness = SegmentHarness(str(tmp_path), config=config)
    store = harness.store
    store.append(entries(1, 5))
    assert store.sync().durable_index == 0
    harness.now_ms[0] += 100
    assert store.sync().durable_index == 4
    store.append(entries(5, 8))
    assert store.sync().durable_index == 4
    assert harness.crash().last_index() == 4
    harness.close()


def test_none_policy_still_syncs_votes(tmp_path):
    # Goal: under none, entries are not fsynced but a term/vote change is.
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(flush=FlushPolicy(FlushMode.NONE)))
    store = harness.store
    store.append(entries(1, 5))
    store.set_hard_state(HardState(term=Term(3), vote=NodeId(2)))
    assert store.sync().fsync_count == 0
    store = harness.crash()
    assert store.initial_state().hard_state == HardState(term=Term(3), vote=NodeId(2))
    assert store.last_index() == 0
    harness.close()


def _complete(store, pending):
    """What the flusher does: run the fsyncs (on its thread), then record them."""
    for fsync in pending.fsyncs:
        fsync()
    store.finish_sync(pending)


def test_a_sync_started_covers_only_what_was_appended_before_it(tmp_path):
    # Goal: the flusher fsyncs on another thread while the loop appends more; finishing
    # that sync makes durable only the entries appended before it started.
    harness = SegmentHarness(str(tmp_path))
    store = harness.store
    store.append(entries(1, 5))
    pending = store.start_sync()
    assert pending is not None and pending.segments == 1 and pending.bytes > 0
    store.append(entries(5, 9))  # while the fsync runs
    _complete(store, pending)
    assert store.sync().durable_index == 8  # the later entries, by the next sync
    harness.close()


def test_a_truncation_during_a_sync_voids_what_it_would_have_made_durable(tmp_path):
    # Goal: entries cut (a Raft conflict) while their fsync ran are not reported durable
    # when it finishes: the indexes now name other, unsynced entries.
    harness = SegmentHarness(str(tmp_path))
    store = harness.store
    store.append(entries(1, 5))
    store.sync()
    store.append(entries(5, 9))
    pending = store.start_sync()
    store.append(entries(7, 9, term=2))  # replaces 7 and 8
    _complete(store, pending)
    store.set_hard_state(HardState(term=Term(2), commit=Index(8)))
    batch = harness.db.batch()
    store.stage_state(batch)
    harness.db.write(batch, sync=True)
    # The stored commit is clamped to the durable prefix (6): a crash now must not leave
    # a log that ends below its recorded commit, which would read as lost entries.
    assert store.initial_state().hard_state.commit == 8
    reopened = harness.crash()
    # Unclamped, commit 8 would now cover the term-1 entries 7 and 8 still on disk.
    assert reopened.initial_state().hard_state.commit == 4
    assert reopened.repair_reason is None
    harness.close()


def test_a_sync_that_finishes_early_waits_for_the_one_begun_before_it(tmp_path):
    # Goal: a large flush fsyncs on the thread while a small one (say, only the commit
    # index moved) finishes on the loop at once; the small one must not report the
    # large one's entries durable before its fsync ran.
    harness = SegmentHarness(str(tmp_path))
    store = harness.store
    store.append(entries(1, 5))
    large = store.start_sync()
    small = store.start_sync()  # nothing appended since: no fsyncs of its own
    assert small is not None and not small.fsyncs
    store.finish_sync(small)
    assert store.sync().durable_index == 0, "entries 1-4 are still being fsynced"
    _complete(store, large)
    assert store.sync().durable_index == 4
    harness.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_sync_run_on_the_loop_uses_the_open_descriptors(tmp_path):
    # Goal: fsyncs handed out for another thread hold a duplicate descriptor each (the
    # segment may be closed before they run); fsyncs that run at once on the store's own
    # thread (the flusher's small flushes, one per write) make none, and are as durable.
    harness = SegmentHarness(str(tmp_path))
    store = harness.store
    store.append(entries(1, 5))
    before = _open_descriptors()
    detached = store.start_sync()
    assert detached is not None and _open_descriptors() == before + 1
    _complete(store, detached)
    assert _open_descriptors() == before
    store.append(entries(5, 9))
    inline = store.start_sync(detached=False)
    assert inline is not None and inline.segments == 1 and _open_descriptors() == before
    _complete(store, inline)
    assert store.sync().durable_index == 8
    assert harness.crash().last_index() == 8
    harness.close()
