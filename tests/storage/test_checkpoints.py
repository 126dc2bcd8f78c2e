"""Checkpoints (storage/checkpoints.py): a state at a recent segment end, used by an open
only while it still describes the log."""

from __future__ import annotations

from raftlog.messages import HardState, Membership, Snapshot, SnapshotMeta
from raftlog.types import Index, NodeId, Term
from storage import checkpoints
from storage.config import StoreConfig
from tests.storage.helpers import SegmentHarness, data_entry

MEMBERS = Membership(voters=frozenset({NodeId(1), NodeId(2), NodeId(3)}))


def _filled(root: str, commit: int = 60) -> SegmentHarness:
    harness = SegmentHarness(root, config=StoreConfig(segment_bytes_max=4096))
    harness.store.append([data_entry(i, 1, count=2, value_bytes=60) for i in range(1, 61)])
    harness.store.set_hard_state(HardState(term=Term(1), commit=Index(commit)))
    harness.store.sync()
    return harness


def test_a_checkpoint_survives_a_reopen_and_sets_the_first_membership(tmp_path) -> None:
    harness = _filled(str(tmp_path))
    store = harness.store
    point = checkpoints.at(store, Index(40), b"state-at-40", MEMBERS)
    assert point.snapshot.meta.term == 1 and point.next_offset == store.offset_after(Index(40))
    checkpoints.save(store, point)
    store = harness.crash()  # unsynced, but a later synced write (the crash's own) keeps it: RocksDB's order
    found = checkpoints.start_from(store)
    assert found is not None and found.snapshot.meta.index == 40 and found.snapshot.data == b"state-at-40"
    assert store.initial_state().membership == MEMBERS
    harness.close()


def test_a_checkpoint_the_log_no_longer_holds_is_not_used(tmp_path) -> None:
    harness = _filled(str(tmp_path), commit=40)
    store = harness.store
    beyond = checkpoints.at(store, Index(50), b"x", MEMBERS)
    store.truncate_from(Index(45))  # (a test's cut: a real log never loses what it applied)
    assert not checkpoints.usable(store, beyond)  # past the log's end
    wrong_term = checkpoints.at(store, Index(30), b"x", MEMBERS)
    wrong_term = type(wrong_term)(Snapshot(SnapshotMeta(Index(30), Term(7), MEMBERS), b"x"), wrong_term.next_offset)
    assert not checkpoints.usable(store, wrong_term)
    assert checkpoints.usable(store, checkpoints.at(store, Index(30), b"x", MEMBERS))
    assert not checkpoints.usable(store, checkpoints.at(store, Index(30), None, MEMBERS))  # type: ignore[arg-type]
    # A snapshot install replaces the log: the checkpoint goes with it.
    checkpoints.save(store, checkpoints.at(store, Index(30), b"x", MEMBERS))
    store.apply_snapshot(Snapshot(SnapshotMeta(Index(100), Term(2), MEMBERS), b"snap"))
    assert checkpoints.load(store) is None and checkpoints.start_from(store) is None
    assert store.starts_from is None
    harness.close()
