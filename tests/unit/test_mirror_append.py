"""Goal: a mirror chunk is appended only where the sink's log ends at the chunk's first
offset (multiraft/node/mirror_append.py), so a pipelined pull can never leave a chunk
after a hole: a proposal whose expected start does not match is refused before the
append, nothing enters the log, and the decision is the same from any replica's log.

Real Raft cores (three, delivered synchronously by tests/unit/test_core_api.py's
`Cluster`); the partition's applied state is a `LogPoint` at the leader's applied index
(a mirror starting at offset 100).
"""

from __future__ import annotations

import pytest

from multiraft.node.mirror_append import (
    LogPoint,
    LogTail,
    MirrorAppend,
    log_end_offset,
    offset_after,
)
from multiraft.state.consumer_offsets import OffsetCommit, encode_meta
from raftlog.errors import ProposalDropped
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Term
from storage.batch import Record, encode_batch
from tests.unit.test_core_api import Cluster

START = 100


def _batch(records: int) -> bytes:
    return encode_batch([Record(b"k", b"v%d" % i) for i in range(records)], first_timestamp_ms=1)


def _cluster() -> tuple[Cluster, LogPoint]:
    cluster = Cluster()
    leader = cluster.elect(1)
    return cluster, LogPoint(int(leader.applied_index), -1, START)


def _append(cluster: Cluster, applied: LogPoint, tail: LogTail, first: int, records: int) -> None:
    """What the group's task does with a guarded proposal: check, append, tell the guard."""
    leader = cluster.cores[1]
    guard = MirrorAppend(lambda: applied, tail, leader.term, first, records)
    guard.check(leader)
    leader.propose([_batch(records)])
    guard.appended(leader)


def test_offset_after_counts_only_data_entries() -> None:
    # Goal: META and NOOP entries take no offsets; DATA entries take their batch's records.
    entries = [Entry(Index(6), Term(2), EntryKind.DATA, _batch(3)), Entry(Index(7), Term(2), EntryKind.META, b"{}"),
               Entry(Index(8), Term(3), EntryKind.NOOP, b""), Entry(Index(9), Term(3), EntryKind.DATA, _batch(4))]
    assert offset_after(LogPoint(5, 2, 40), entries) == 47
    assert offset_after(LogPoint(5, 2, 40), []) == 40


def test_chunks_append_back_to_back_while_unapplied() -> None:
    # Goal: with nothing applied yet, each chunk that starts where the previous ends is
    # appended (the pipeline); the log's end is counted from the unapplied entries alike
    # with the pull's tail (no scan) and without it (a scan of the unstable log).
    cluster, applied = _cluster()
    tail = LogTail()
    leader = cluster.cores[1]
    for first in (100, 105, 110):
        _append(cluster, applied, tail, first, 5)
    assert leader.log.last_index() == applied.index + 3
    assert log_end_offset(leader, applied, tail.known) == 115
    assert log_end_offset(leader, applied, None) == 115  # counted from the entries themselves


@pytest.mark.parametrize("first", [100, 110, 114, 116])
def test_a_chunk_not_starting_at_the_log_end_is_refused_and_nothing_is_appended(first: int) -> None:
    # Goal: the refusal (proposal k+1 after k was dropped, or a stale chunk) appends nothing.
    cluster, applied = _cluster()
    tail = LogTail()
    _append(cluster, applied, tail, 100, 5)
    _append(cluster, applied, tail, 105, 10)
    leader = cluster.cores[1]
    last = leader.log.last_index()
    with pytest.raises(ProposalDropped, match="ends at offset 115"):
        _append(cluster, applied, tail, first, 5)
    assert leader.log.last_index() == last
    assert tail.known == LogPoint(int(last), int(leader.term), 115)


def test_a_dropped_proposal_makes_every_later_one_refused() -> None:
    # Goal: k (at 105) never enters the log, so k+1 (at 110) and k+2 are refused: no hole.
    cluster, applied = _cluster()
    tail = LogTail()
    _append(cluster, applied, tail, 100, 5)
    last = cluster.cores[1].log.last_index()
    for first in (110, 115):
        with pytest.raises(ProposalDropped):
            _append(cluster, applied, tail, first, 5)
    assert cluster.cores[1].log.last_index() == last
    _append(cluster, applied, tail, 105, 5)  # the pull starting again from the log's end


def test_entries_between_chunks_and_committed_ones_are_counted() -> None:
    # Goal: a consumer offset commit (META) between two chunks does not refuse the next
    # one (the tail no longer ends the log: a scan from it); once everything is
    # committed and applied, the guard counts from the applied state alone.
    cluster, applied = _cluster()
    tail = LogTail()
    leader = cluster.cores[1]
    _append(cluster, applied, tail, 100, 5)
    leader.propose([encode_meta(OffsetCommit(group="g", topic="orders", partition=0, offset=3))], EntryKind.META)
    _append(cluster, applied, tail, 105, 5)
    cluster.stabilize()  # replicated and applied everywhere: the log is in storage now
    assert log_end_offset(leader, applied, tail.known) == 110
    everything = LogPoint(int(leader.applied_index), -1, 110)
    _append(cluster, everything, LogTail(), 110, 1)


def test_the_decision_is_the_same_from_every_replica_s_log() -> None:
    # Goal: every replica holding the entries counts the same log end (the offsets of a
    # log position are a function of the entries before it, which Raft makes equal).
    cluster, applied = _cluster()
    tail = LogTail()
    for first in (100, 103, 107):
        _append(cluster, applied, tail, first, {100: 3, 103: 4, 107: 2}[first])
    cluster.stabilize()
    assert {log_end_offset(core, applied, None) for core in cluster.cores.values()} == {109}


def test_a_new_term_refuses_the_old_pull_s_chunks() -> None:
    # Goal: a chunk of a pull begun in an earlier term is refused even where it would fit.
    cluster, applied = _cluster()
    tail = LogTail()
    leader = cluster.cores[1]
    guard = MirrorAppend(lambda: applied, tail, leader.term - 1, START, 5)
    with pytest.raises(ProposalDropped, match="term"):
        guard.check(leader)
    gone = MirrorAppend(lambda: None, tail, leader.term, START, 5)  # promoted meanwhile
    with pytest.raises(ProposalDropped, match="no longer a mirror"):
        gone.check(leader)


def test_a_chunk_whose_skips_entry_was_refused_is_refused_too() -> None:
    # Goal: a chunk with skipped ranges is two proposals (META, then DATA) both starting at
    # the same offset; if the META was refused (say a membership change was applying) and
    # the DATA's turn came after that cleared, the DATA must not enter the log without it:
    # the sink would serve the batches the source skips. Right after its META it goes in.
    cluster, applied = _cluster()
    tail = LogTail()
    leader = cluster.cores[1]
    _append(cluster, applied, tail, 100, 5)
    refused_meta = MirrorAppend(lambda: applied, tail, leader.term, 105, 0)  # never appended
    data = MirrorAppend(lambda: applied, tail, leader.term, 105, 5, after=refused_meta)
    last = leader.log.last_index()
    with pytest.raises(ProposalDropped, match="skipped ranges"):
        data.check(leader)
    assert leader.log.last_index() == last

    meta = MirrorAppend(lambda: applied, tail, leader.term, 105, 0)
    meta.check(leader)
    leader.propose([encode_meta(OffsetCommit(group="g", topic="orders", partition=0, offset=3))],
                   EntryKind.META)  # any META entry stands for the skips entry here
    meta.appended(leader)
    data = MirrorAppend(lambda: applied, tail, leader.term, 105, 5, after=meta)
    data.check(leader)
    leader.propose([_batch(5)])
    data.appended(leader)
    assert log_end_offset(leader, applied, tail.known) == 110

    late = MirrorAppend(lambda: applied, tail, leader.term, 110, 5, after=meta)
    with pytest.raises(ProposalDropped, match="skipped ranges"):
        late.check(leader)  # its META is no longer the log's last entry
