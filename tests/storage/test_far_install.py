"""Far-horizon catch-up on disk: received segments are checked, then replace a follower's
log; the reopen trusts what the install catalogued and reads the leader's entries."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from raftlog.messages import HardState
from raftlog.types import Index, NodeId, Offset, Term
from storage import offsets
from storage.config import StoreConfig
from storage.errors import CorruptionError
from storage.far_install import check_staged, is_staged, replace_log, staged_name
from storage.node_state import StartPoint
from storage.transfer import enforce_retention, list_closed_segments
from tests.storage.helpers import GROUP, SegmentHarness, data_entry, entries

CONFIG = StoreConfig(segment_bytes_max=4096)


def _leader(root: str) -> SegmentHarness:
    leader = SegmentHarness(root, config=CONFIG, durable_files=False)
    store = leader.store
    for first in range(1, 121, 6):
        store.append([data_entry(i, 2 if i > 40 else 1, count=3, value_bytes=50) for i in range(first, first + 6)])
        leader.now_ms[0] += 1000
    store.set_hard_state(HardState(term=Term(2), commit=Index(120)))
    store.sync()
    return leader


def _stage(leader: SegmentHarness, follower: SegmentHarness, upto: Index):
    """The leader's closed segments up to `upto`, staged next to the follower's log through
    its `Files` (the write-behind double: as the node does), each checked."""
    files, directory = follower.files, follower.store.directory
    staged = []
    for descriptor in list_closed_segments(leader.store):
        if descriptor.last_index > upto:
            break
        segment = next(s for s in leader.store.segments if s.first_index == descriptor.first_index)
        path = os.path.join(directory, staged_name(descriptor.first_index))
        handle = files.create(path + ".part")
        files.append(handle, [Path(segment.path).read_bytes()])
        files.to_os(handle)
        files.fsync(handle)
        files.close(handle)
        files.rename(path + ".part", path)
        files.sync_dir(directory)
        staged.append(check_staged(path, descriptor))
    return staged


def test_install_replaces_a_short_diverging_log_with_the_leaders(tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    # The leader's retention moved its start: the follower gets that start point too.
    enforce_retention(leader.store, leader.now_ms[0] + 10**9, applied=Index(30))
    start = StartPoint(leader.store.snapshot(), leader.store.offset_after(leader.store.snapshot().meta.index))
    assert start.snapshot.meta.index > 0
    follower = SegmentHarness(str(tmp_path / "follower"), config=CONFIG)  # the write-behind double
    follower.store.append(entries(1, 25, term=1))  # a short log, its tail not the leader's
    follower.store.set_hard_state(HardState(term=Term(3), vote=NodeId(2), commit=Index(10)))
    follower.store.sync()
    staged = _stage(leader, follower, Index(120))
    follower.store.close()
    upto = staged[-1].descriptor.last_index
    assert staged[0].descriptor.first_index == start.snapshot.meta.index + 1 and upto > 60

    hard = replace_log(GROUP, follower.store.directory, follower.db, follower.files, staged, start,
                       Term(2), follower.now_ms[0])
    assert hard == HardState(term=Term(3), vote=NodeId(2), commit=upto)  # its own term was higher
    store = follower.crash()  # a power failure: what replace_log wrote is durable
    assert store.recovery.corruption == () and store.recovery.rescanned_segments == 1  # the last only
    assert not any(is_staged(name) for name in os.listdir(store.directory))
    assert (store.first_index(), store.last_index()) == (leader.store.first_index(), upto)
    lo, hi = store.first_index(), Index(upto + 1)
    assert store.entries(lo, hi, 1 << 30) == leader.store.entries(lo, hi, 1 << 30)
    assert store.term(upto) == leader.store.term(upto) and store.term(Index(35)) == Term(1)
    assert store.log_start_offset == leader.store.log_start_offset
    for offset in (store.log_start_offset, Offset(200), Offset(store.offset_after(upto) - 1)):
        assert offsets.lookup(store, offset) == offsets.lookup(leader.store, offset)
    assert store.initial_state().hard_state.commit == upto
    # It appends after the installed log as after any open.
    store.append([data_entry(upto + 1, 3)])
    assert store.last_index() == upto + 1
    leader.close()
    follower.close()


def test_a_received_segment_that_differs_is_refused(tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    descriptor = list_closed_segments(leader.store)[1]
    segment = next(s for s in leader.store.segments if s.first_index == descriptor.first_index)
    path = str(tmp_path / "received.seg")
    shutil.copyfile(segment.path, path)
    with open(path, "r+b") as damaged:
        damaged.seek(descriptor.size_bytes // 2)
        byte = damaged.read(1)
        damaged.seek(descriptor.size_bytes // 2)
        damaged.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptionError):
        check_staged(path, descriptor)
    with open(path, "r+b") as short:
        short.truncate(descriptor.size_bytes - 10)
    with pytest.raises(CorruptionError):
        check_staged(path, descriptor)
    leader.close()


def test_an_install_below_a_recorded_commit_keeps_the_replica_in_repair(tmp_path) -> None:
    # A replica whose disk lost entries it had acknowledged recorded a commit past the
    # install's end: the install keeps that commit, so the reopen finds the log short of it
    # and keeps the replica in repair (no vote) until its leader gave the rest back.
    leader = _leader(str(tmp_path / "leader"))
    start = StartPoint(leader.store.snapshot(), leader.store.offset_after(leader.store.snapshot().meta.index))
    follower = SegmentHarness(str(tmp_path / "follower"), config=CONFIG)
    staged = _stage(leader, follower, Index(60))
    upto = staged[-1].descriptor.last_index
    follower.store.append(entries(1, 100, term=2))
    follower.store.set_hard_state(HardState(term=Term(2), commit=Index(90)))
    follower.store.sync()  # (the install replaces this log; its recorded commit stays)
    follower.store.close()
    hard = replace_log(GROUP, follower.store.directory, follower.db, follower.files, staged, start, Term(2),
                       follower.now_ms[0])
    assert hard.commit == 90
    store = follower.crash()
    assert store.last_index() == upto < 90
    assert store.repair_reason is not None and store.repair_until == 90
    assert store.initial_state().needs_repair
    leader.close()
    follower.close()
