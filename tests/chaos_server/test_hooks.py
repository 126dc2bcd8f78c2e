"""Goal: the chaos hooks (multiraft/node/unsafe.py) are read from the environment only as
documented, refuse what they do not know, and each storage- or table-level unsafe
switch really changes behaviour when set and changes nothing when unset."""

from __future__ import annotations

import pytest

from multiraft.metadata.features import SUPPORTED_LEVEL
from multiraft.node.config import ConfigError
from multiraft.node.faults import (
    Faults,
    ProducerTableWithoutDedup,
    SegmentStoreForgettingVotes,
    framing_only,
)
from multiraft.node.machines import PartitionMachine
from multiraft.node.unsafe import NO_HOOKS, UNSAFE_SWITCHES, ChaosHooks
from multiraft.state.partition import PartitionState
from multiraft.state.producers import (
    Accept,
    Duplicate,
    DuplicatePending,
    ProducerBatch,
    ProducerTable,
)
from raftlog.messages import Entry, EntryKind, HardState
from raftlog.types import Index, NodeId, Term
from storage.batch import Record, encode_batch
from storage.config import StoreConfig
from storage.errors import CorruptionError
from storage.frames import crc_matches
from storage.segments import SegmentStore
from tests.storage.helpers import GROUP, SegmentHarness, data_entry

# ---- parsing ---------------------------------------------------------------------------


def test_no_variables_mean_no_hooks():
    # Goal: an environment without the variables (or with them empty) changes nothing.
    assert ChaosHooks.from_environment({}) == NO_HOOKS
    blank = {"RAFTLOG_CHAOS_FILES": "", "RAFTLOG_CHAOS_DEBUG": "0", "RAFTLOG_UNSAFE": " , "}
    assert ChaosHooks.from_environment(blank) == NO_HOOKS
    assert NO_HOOKS.unsafe == ()


def test_every_variable_is_read():
    # Goal: each documented value turns on exactly its field; names are listed sorted.
    hooks = ChaosHooks.from_environment({
        "RAFTLOG_CHAOS_FILES": "write-behind", "RAFTLOG_CHAOS_DEBUG": "1",
        "RAFTLOG_UNSAFE": "skip-crc, no-dedup",
    })
    assert hooks.write_behind_files and hooks.debug_endpoints
    assert hooks.skip_crc and hooks.no_dedup
    assert not (hooks.ack_before_fsync or hooks.read_uncommitted or hooks.vote_without_persist)
    assert hooks.unsafe == ("no-dedup", "skip-crc")
    every = ChaosHooks.from_environment({"RAFTLOG_UNSAFE": ",".join(UNSAFE_SWITCHES)})
    assert every.unsafe == tuple(sorted(UNSAFE_SWITCHES))


@pytest.mark.parametrize("environ", [
    {"RAFTLOG_UNSAFE": "no-dedup,ack-before-sync"},
    {"RAFTLOG_UNSAFE": "NO-DEDUP"},
    {"RAFTLOG_CHAOS_FILES": "lazyfs"},
    {"RAFTLOG_CHAOS_DEBUG": "yes"},
    {"RAFTLOG_CHAOS_FEATURE_LEVEL": str(SUPPORTED_LEVEL + 1)},  # above what this build supports
    {"RAFTLOG_CHAOS_FEATURE_LEVEL": "-1"},
    {"RAFTLOG_CHAOS_FEATURE_LEVEL": "one"},
])
def test_unknown_values_refuse_to_start(environ):
    # Goal: a typo never silently runs a safe (or a different unsafe) node.
    with pytest.raises(ConfigError):
        ChaosHooks.from_environment(environ)


def test_the_feature_level_knob_makes_a_node_support_less_than_its_build():
    # Goal: RAFTLOG_CHAOS_FEATURE_LEVEL=N makes the node say it supports level N (a node of an
    # older build, for tests/integration/test_features_processes.py); unset, its build's level.
    assert NO_HOOKS.feature_level is None and NO_HOOKS.supported_level == SUPPORTED_LEVEL
    hooks = ChaosHooks.from_environment({"RAFTLOG_CHAOS_FEATURE_LEVEL": "0"})
    assert (hooks.feature_level, hooks.supported_level, hooks.unsafe) == (0, 0, ())
    assert ChaosHooks.from_environment({"RAFTLOG_CHAOS_FEATURE_LEVEL": " "}) == NO_HOOKS


# ---- no-dedup ------------------------------------------------------------------------------

PID = 5


def _batch(seq: int, count: int = 1) -> bytes:
    records = [Record(b"k", b"v%d" % i) for i in range(count)]
    return encode_batch(records, first_timestamp_ms=1, producer_id=PID, producer_epoch=0, base_sequence=seq)


def _apply_all(state: PartitionState, payloads: list[bytes]) -> list:
    results = []
    for payload in payloads:
        index = Index(state.applied_index + 1)
        results.append(state.apply(Entry(index, Term(1), EntryKind.DATA, payload)))
    return results


TABLES = [ProducerTable, ProducerTableWithoutDedup]


@pytest.mark.parametrize("table_class", TABLES)
def test_no_dedup_appends_retries_again(table_class):
    # Goal: with no-dedup's table a retry applies as new records (fresh offsets, not a
    # duplicate) and the producer's next sequence is still accepted; with the production
    # table the retry is the usual duplicate.
    dedup = table_class is ProducerTable
    state = PartitionState(topic="t", partition=0, new_producers=table_class)
    first, retry, second = _apply_all(state, [_batch(0, 2), _batch(0, 2), _batch(2)])
    assert (first.base_offset, first.duplicate) == (0, False)
    if dedup:
        assert (retry.base_offset, retry.duplicate) == (0, True)
        assert state.skipped_ranges == [(2, 2)]
    else:
        assert (retry.base_offset, retry.duplicate) == (2, False), "appended again"
        assert state.skipped_ranges == []
    assert second.ok and second.base_offset == 4 and not second.duplicate


@pytest.mark.parametrize("table_class", TABLES)
def test_no_dedup_leader_check_never_answers_duplicate(table_class):
    # Goal: the leader's pre-proposal check stops deduplicating too, for in-flight and applied
    # originals, and a re-proposed retry does not disturb the sequence of later batches.
    dedup = table_class is ProducerTable
    table = table_class()
    batch = ProducerBatch(producer_id=PID, epoch=0, base_sequence=0, record_count=1)
    following = ProducerBatch(producer_id=PID, epoch=0, base_sequence=1, record_count=1)
    assert table.check(batch) == Accept()
    table.record_proposal(batch)
    assert table.check(batch) == (DuplicatePending(0, 1) if dedup else Accept()), "retry in flight"
    if not dedup:
        table.record_proposal(batch)  # proposed a second time
        assert table.check(following) == Accept()
    assert table.apply(batch, 0) == Accept()
    if not dedup:
        assert table.apply(batch, 1) == Accept(), "the second copy applies as new records"
    assert table.check(batch) == (Duplicate(0, 1) if dedup else Accept()), "retry after apply"
    assert table.check(following) == Accept(), "sequences go on from the original"


@pytest.mark.parametrize("no_dedup", [False, True])
def test_no_dedup_table_is_chosen_once_and_survives_a_restore(no_dedup):
    # Goal: the switch picks the partition machines' producer table once (faults.py), and a
    # machine restored from a snapshot (segment transfer, reopen) keeps that table.
    expected = ProducerTableWithoutDedup if no_dedup else ProducerTable
    machine = Faults.of(ChaosHooks(no_dedup=no_dedup)).new_partition_machine("t", 0)
    assert type(machine.state.producers) is expected
    _apply_all(machine.state, [_batch(0, 2)])
    snapshot = machine.snapshot()
    machine.restore(snapshot, Index(1))
    assert type(machine.state.producers) is expected
    assert machine.state.producers.get(PID) is not None, "the restored table holds the producer"
    assert type(PartitionMachine("t", 0).state.producers) is ProducerTable


# ---- skip-crc ------------------------------------------------------------------------------


def _flip_payload_byte_of_last_entry(harness: SegmentHarness) -> None:
    segment = harness.store.segments[-1]
    with open(segment.path, "r+b") as file:
        file.seek(segment.size - 3)  # inside the last frame's payload
        byte = file.read(1)
        file.seek(segment.size - 3)
        file.write(bytes([byte[0] ^ 0x04]))


@pytest.mark.parametrize("skip_crc", [False, True])
def test_skip_crc_chooses_the_frame_check_once(skip_crc):
    # Goal: the switch picks the stores' frame check once (faults.py); without it, the CRC one.
    faults = Faults.of(ChaosHooks(skip_crc=skip_crc))
    assert faults.frame_check is (framing_only if skip_crc else crc_matches)


@pytest.mark.parametrize("verify_crc", [True, False])
def test_skip_crc_keeps_and_serves_a_corrupted_tail(tmp_path, verify_crc):
    # Goal: with `crc_matches`, recovery cuts a bad last frame and reads never serve it; with
    # skip-crc's `framing_only` the damaged frame is kept and served as it is on disk.
    check = crc_matches if verify_crc else framing_only
    harness = SegmentHarness(str(tmp_path), frame_check=check, durable_files=False)
    try:
        written = [data_entry(i, 1) for i in range(1, 6)]
        harness.store.append(written)
        harness.store.set_hard_state(HardState(term=Term(1), commit=Index(4)))
        harness.store.sync()
        _flip_payload_byte_of_last_entry(harness)
        store = harness.crash()
        if verify_crc:
            assert store.last_index() == 4 and store.recovery.truncated_tail_bytes > 0
        else:
            assert store.last_index() == 5 and store.recovery.truncated_tail_bytes == 0
            (served,) = store.entries(Index(5), Index(6), 1 << 20)
            assert served.payload != written[-1].payload, "the corrupted bytes are served"
    finally:
        harness.close()


def test_skip_crc_unset_reads_still_refuse_damage(tmp_path):
    # Goal: the read path (not only recovery) follows the frame check: with `crc_matches`, a
    # flipped bit raises.
    for verify_crc in (True, False):
        check = crc_matches if verify_crc else framing_only
        harness = SegmentHarness(str(tmp_path / str(verify_crc)), frame_check=check, durable_files=False)
        try:
            harness.store.append([data_entry(i, 1) for i in range(1, 4)])
            harness.store.sync()
            _flip_payload_byte_of_last_entry(harness)  # under the open store: no recovery runs
            # The store keeps appended entries in memory until released; release them, so
            # entry 3 is read from the file.
            harness.store.release_cached(Index(3))
            if verify_crc:
                with pytest.raises(CorruptionError):
                    harness.store.entries(Index(3), Index(4), 1 << 20)
            else:
                assert len(harness.store.entries(Index(3), Index(4), 1 << 20)) == 1
        finally:
            harness.close()


# ---- vote-without-persist ----------------------------------------------------------------


@pytest.mark.parametrize("vote_without_persist", [False, True])
def test_vote_without_persist_chooses_the_store_once(tmp_path, vote_without_persist):
    # Goal: the switch picks the class of every store the node opens (faults.py), with the
    # frame check chosen beside it; without it, the production `SegmentStore`.
    faults = Faults.of(ChaosHooks(vote_without_persist=vote_without_persist))
    harness = SegmentHarness(str(tmp_path), durable_files=False)
    try:
        store = faults.open_store(GROUP, str(tmp_path / "opened"), harness.db, harness.files, StoreConfig())
        expected = SegmentStoreForgettingVotes if vote_without_persist else SegmentStore
        assert type(store) is expected and store.frame_check is crc_matches
        store.close()
    finally:
        harness.close()


@pytest.mark.parametrize("store_class", [SegmentStore, SegmentStoreForgettingVotes])
def test_vote_without_persist_forgets_term_and_vote(tmp_path, store_class):
    # Goal: with `SegmentStore`, term and vote survive a reopen (and a vote asks for a synced
    # write); with vote-without-persist's store the reopened store has forgotten both (the
    # commit is still kept).
    persist_vote = store_class is SegmentStore
    harness = SegmentHarness(str(tmp_path), store_class=store_class, durable_files=False)
    try:
        harness.store.append([data_entry(1, 1)])
        harness.store.set_hard_state(HardState(term=Term(5), vote=NodeId(2), commit=Index(1)))
        batch = harness.db.batch()
        harness.store.sync_files()
        assert harness.store.stage_state(batch) is persist_vote, "only a real vote asks for a synced write"
        harness.db.write(batch, sync=False)
        hard = harness.crash().initial_state().hard_state
        if persist_vote:
            assert (hard.term, hard.vote, hard.commit) == (5, 2, 1)
        else:
            assert (hard.term, hard.vote, hard.commit) == (0, 0, 1)
    finally:
        harness.close()


# ---- group-early-assign ----------------------------------------------------------------


def _join_second_member(state):  # type: ignore[no-untyped-def]
    """Member a holds both partitions of t; b joins: the target moves one to b."""
    from multiraft.consumer_groups import JoinGroup, StaticTopics, Subscription

    topics = StaticTopics({"t": 2})
    subscription = Subscription(topics=("t",))
    state.apply(1, JoinGroup(group="g", member_id="a", subscription=subscription), topics)
    result = state.apply(2, JoinGroup(group="g", member_id="b", subscription=subscription), topics)
    return state.groups["g"], result.value


@pytest.mark.parametrize("early", [False, True])
def test_group_early_assign_gives_a_held_partition_at_once(early):
    # Goal: with the switch, a joining member is told it owns a partition the other member
    # still holds (no revocation heard yet); without it, the partition is pending.
    from multiraft.consumer_groups import GroupsState
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.faults import GroupsStateGivingEarly

    holder = CatalogHolder(Faults.of(ChaosHooks(group_early_assign=early)).new_groups_state)
    assert type(holder.groups) is (GroupsStateGivingEarly if early else GroupsState)
    group, joined = _join_second_member(holder.groups)
    held_by_a = group.members["a"].assigned
    assert len(held_by_a) == 2  # a has not heartbeated: it still holds both
    assert bool(set(joined.assigned) & held_by_a) is early
    assert bool(joined.pending) is not early
    holder.replace(holder.catalog, GroupsState())  # a restored snapshot keeps the class
    assert type(holder.groups) is (GroupsStateGivingEarly if early else GroupsState)
