"""The partition state machine: offsets, idempotent producers, consumer offsets, snapshots."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multiraft.errors import (
    CommitOffsetOutOfRange,
    InvalidProducerEpoch,
    InvalidRequest,
    OutOfOrderSequence,
    SnapshotFormatError,
    StaleOffsetCommit,
    TooManyConsumerGroups,
    error_table,
)
from multiraft.state.consumer_offsets import OffsetCommit, decode_meta, encode_meta
from multiraft.state.partition import ApplyResult, PartitionState
from multiraft.state.producers import (
    SEQUENCE_MAX,
    Accept,
    Duplicate,
    DuplicatePending,
    next_sequence,
)
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Term
from storage.batch import Record, encode_batch, read_header


def batch(count: int = 1, pid: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    records = [Record(b"k", b"v%d" % i) for i in range(count)]
    return encode_batch(records, first_timestamp_ms=1000, producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)  # fmt: skip


class Driver:
    """Feeds entries with consecutive indexes, as the group runtime would."""

    def __init__(self, state: PartitionState | None = None) -> None:
        self.state = state or PartitionState(topic="t", partition=0)

    def data(self, payload: bytes) -> ApplyResult:
        return self.entry(EntryKind.DATA, payload)

    def entry(self, kind: EntryKind, payload: bytes = b"") -> ApplyResult:
        index = Index(self.state.applied_index + 1)
        return self.state.apply(Entry(index, Term(1), kind, payload))

    def commit(self, group: str, offset: int, topic: str = "t", partition: int = 0,
               stamp: tuple[int, int] = (0, 0)) -> ApplyResult:
        payload = encode_meta(OffsetCommit(group=group, topic=topic, partition=partition,
                                           offset=offset, metadata="m", stamp=stamp))  # fmt: skip
        return self.entry(EntryKind.META, payload)


def test_offsets_follow_record_counts_and_noops():
    # Goal: base offsets are consecutive by record count; non-DATA entries take none.
    driver = Driver()
    assert driver.data(batch(3)).base_offset == 0
    assert driver.entry(EntryKind.NOOP).base_offset is None
    second = driver.data(batch(2))
    assert (second.base_offset, second.count, second.duplicate) == (3, 2, False)
    assert driver.state.high_watermark == 5
    assert (driver.state.applied_index, driver.state.next_offset) == (3, 5)


def test_apply_asserts_gapless_indexes():
    # Goal: applying out of order is a programmer error, not a condition.
    state = PartitionState(topic="t", partition=0)
    with pytest.raises(AssertionError):
        state.apply(Entry(Index(2), Term(1), EntryKind.NOOP))


PID = 7


def state_with(*batches: tuple[int, int, int]) -> PartitionState:
    """A state that applied batches of producer PID given as (epoch, seq, count)."""
    driver = Driver()
    for epoch, seq, count in batches:
        assert driver.data(batch(count, PID, epoch, seq)).ok
    return driver.state


# (applied batches as (epoch, seq, count), new batch (epoch, seq, count), expected)
PRODUCE_RULES = [
    ("new producer, any first sequence", [], (0, 0, 1), Accept()),
    ("new producer after eviction", [], (3, 42, 1), Accept()),
    ("next sequence", [(0, 0, 2)], (0, 2, 1), Accept()),
    ("gap", [(0, 0, 2)], (0, 3, 1), OutOfOrderSequence),
    ("reorder", [(0, 0, 2), (0, 2, 2)], (0, 1, 1), OutOfOrderSequence),
    ("retry of last", [(0, 0, 2), (0, 2, 3)], (0, 2, 3), Duplicate(2, 3)),
    ("retry of first of five", [(0, i, 1) for i in range(5)], (0, 0, 1), Duplicate(0, 1)),
    ("retry older than five", [(0, i, 1) for i in range(6)], (0, 0, 1), OutOfOrderSequence),
    ("same sequence, other count", [(0, 0, 2)], (0, 0, 1), OutOfOrderSequence),
    ("older epoch fenced", [(2, 0, 1)], (1, 1, 1), InvalidProducerEpoch),
    ("older epoch fenced even as a retry", [(2, 0, 1)], (1, 0, 1), InvalidProducerEpoch),
    ("newer epoch restarts at 0", [(0, 0, 5)], (1, 0, 1), Accept()),
    ("newer epoch not at 0", [(0, 0, 5)], (1, 5, 1), OutOfOrderSequence),
    ("sequence wraps", [(0, SEQUENCE_MAX - 1, 2)], (0, 0, 1), Accept()),
    ("no wrap skipping", [(0, SEQUENCE_MAX - 1, 2)], (0, 1, 1), OutOfOrderSequence),
]


@pytest.mark.parametrize(("name", "applied", "new", "expected"), PRODUCE_RULES,
                         ids=[r[0] for r in PRODUCE_RULES])  # fmt: skip
def test_produce_rules_before_propose_and_on_apply(name, applied, new, expected):
    # Goal: Kafka's idempotence rules, identical on the leader's check and on apply.
    epoch, seq, count = new
    payload = batch(count, PID, epoch, seq)
    state = state_with(*applied)
    hw = state.high_watermark
    if isinstance(expected, type):
        with pytest.raises(expected):
            state.check_produce(read_header(payload))
        result = Driver(state).data(payload)
        assert isinstance(result.error, expected)
        assert state.skipped_ranges == [(hw, count)]
    else:
        assert state.check_produce(read_header(payload)) == expected
        result = Driver(state).data(payload)
        assert result.ok
        if isinstance(expected, Duplicate):
            assert (result.base_offset, result.duplicate) == (expected.base_offset, True)
        else:
            assert (result.base_offset, result.duplicate) == (hw, False)
    # Whatever the verdict, the entry's records took storage's offsets.
    assert state.high_watermark == hw + count


@pytest.mark.parametrize(("pid", "epoch", "seq"), [(-2, 0, 0), (1, -1, 0), (1, 0, -5)])
def test_malformed_producer_fields_are_invalid_requests(pid, epoch, seq):
    # Goal: header values no producer sends are refused as bad input.
    state = PartitionState(topic="t", partition=0)
    with pytest.raises(InvalidRequest):
        state.check_produce(read_header(batch(1, pid, epoch, seq)))


def test_non_idempotent_batches_are_never_checked():
    # Goal: producer id -1 means no dedup: the same bytes twice get two offset ranges.
    driver = Driver()
    assert driver.data(batch(2)).base_offset == 0
    assert driver.data(batch(2)).base_offset == 2
    assert len(driver.state.producers) == 0


def test_pipelined_proposals_are_checked_after_each_other():
    # Goal: the leader checks a batch against its own in-flight proposals.
    state = PartitionState(topic="t", partition=0)
    first, second = batch(2, PID, 0, 0), batch(3, PID, 0, 2)
    assert state.check_produce(read_header(first)) == Accept()
    state.record_proposal(read_header(first))
    assert state.check_produce(read_header(second)) == Accept()
    state.record_proposal(read_header(second))
    assert state.check_produce(read_header(first)) == DuplicatePending(0, 2)
    with pytest.raises(OutOfOrderSequence):
        state.check_produce(read_header(batch(1, PID, 0, 9)))
    driver = Driver(state)
    assert driver.data(first).base_offset == 0
    assert state.check_produce(read_header(first)) == Duplicate(0, 2)
    assert state.check_produce(read_header(second)) == DuplicatePending(2, 3)
    assert driver.data(second).base_offset == 2
    assert state.producers._pending == {}


def test_dropped_proposals_are_forgotten():
    # Goal: after a step-down the next check sees only applied state.
    state = PartitionState(topic="t", partition=0)
    state.record_proposal(read_header(batch(1, PID, 0, 0)))
    state.drop_proposals()
    assert state.check_produce(read_header(batch(1, PID, 0, 0))) == Accept()


def test_retry_proposed_twice_gets_original_offsets_on_apply():
    # Goal: a batch committed twice (retry raced its original) is reported as a
    # duplicate with the original offsets, and its second copy is marked skipped.
    driver = Driver()
    driver.data(batch(1))
    payload = batch(4, PID, 0, 0)
    original = driver.data(payload)
    retried = driver.data(payload)
    assert (original.base_offset, original.duplicate) == (1, False)
    assert (retried.base_offset, retried.count, retried.duplicate) == (1, 4, True)
    assert retried.stored_base_offset == 5
    assert driver.state.skipped_ranges == [(5, 4)]
    assert driver.state.skipped_between(0, 6) == [(5, 4)]
    assert driver.state.skipped_between(0, 5) == []
    driver.state.trim_skipped(9)
    assert driver.state.skipped_ranges == []


def test_producer_table_is_bounded_least_recently_used_first():
    # Goal: at most producers_max ids; the least recently used one goes.
    driver = Driver(PartitionState(topic="t", partition=0, producers_max=2))
    for pid in (1, 2):
        driver.data(batch(1, pid, 0, 0))
    driver.data(batch(1, 1, 0, 1))  # producer 1 used again: 2 is now the oldest
    driver.data(batch(1, 3, 0, 0))
    assert [pid for pid, _ in driver.state.producers.items()] == [1, 3]
    # An evicted producer is accepted at any sequence (Kafka's rule after expiry).
    assert driver.data(batch(1, 2, 0, 17)).ok


def test_offset_commits():
    # Goal: commits up to the high watermark are kept per group; beyond it refused.
    driver = Driver()
    driver.data(batch(3))
    assert driver.commit("g1", 3).base_offset == 3
    assert driver.commit("g1", 1).ok  # moving back is allowed, as in Kafka
    refused = driver.commit("g2", 4)
    assert isinstance(refused.error, CommitOffsetOutOfRange)
    assert refused.error.high_watermark == 3
    assert isinstance(driver.commit("g2", 0, topic="other").error, InvalidRequest)
    assert isinstance(driver.entry(EntryKind.META, b"\x80junk").error, InvalidRequest)
    assert driver.state.committed_offset("g1").offset == 1
    assert driver.state.committed_offset("g2") is None


def test_a_stamped_commit_older_than_the_groups_offset_is_refused():
    # Goal: a member's commit delayed on its way (stamped earlier by the coordinator)
    # never moves the group's offset back over a newer one; the coordinator's next term
    # outranks every stamp of the last; unstamped commits (admin resets, groups without
    # members) apply as before and keep the stamp, so a late stamped one still cannot
    # land after them.
    driver = Driver()
    driver.data(batch(200))
    assert driver.commit("g", 112, stamp=(3, 9)).ok
    stale = driver.commit("g", 54, stamp=(3, 5))
    assert isinstance(stale.error, StaleOffsetCommit) and stale.error.code == "STALE_OFFSET_COMMIT"
    assert driver.state.committed_offset("g").offset == 112
    assert driver.commit("g", 112, stamp=(3, 9)).ok, "the same commit again (a retried write) applies"
    assert driver.commit("g", 60, stamp=(4, 1)).ok, "a later coordinator's term outranks"
    assert driver.commit("g", 10).ok and driver.state.committed_offset("g").stamp == (4, 1)
    assert isinstance(driver.commit("g", 150, stamp=(3, 99)).error, StaleOffsetCommit)
    assert driver.commit("other", 5, stamp=(1, 1)).ok, "stamps compare within a group only"
    restored = PartitionState.restore(driver.state.snapshot())
    assert restored.committed_offset("g") == driver.state.committed_offset("g")
    assert restored.snapshot() == driver.state.snapshot()


def test_unstamped_offsets_encode_as_before():
    # Goal: a commit without a stamp is the v2 META payload, and a partition whose offsets
    # were never stamped snapshots as v2, so nodes of the version before decode both.
    payload = encode_meta(OffsetCommit(group="g", topic="t", partition=0, offset=1, committed_at_ms=7))
    assert b'"v":2' in payload and b"stamp" not in payload
    stamped = encode_meta(OffsetCommit(group="g", topic="t", partition=0, offset=1, stamp=(2, 3)))
    assert b'"v":3' in stamped and decode_meta(stamped).stamp == (2, 3)
    driver = Driver()
    driver.data(batch(3))
    driver.commit("g", 2)
    assert msgpack.unpackb(driver.state.snapshot())["v"] == 2
    driver.commit("g", 3, stamp=(1, 1))
    assert msgpack.unpackb(driver.state.snapshot())["v"] == 3


def test_consumer_groups_are_bounded():
    # Goal: a new group beyond the bound is refused; known groups still commit.
    driver = Driver(PartitionState(topic="t", partition=0, consumer_groups_max=1))
    assert driver.commit("a", 0).ok
    assert isinstance(driver.commit("b", 0).error, TooManyConsumerGroups)
    assert driver.commit("a", 0).ok


@pytest.mark.parametrize(
    "payload",
    [b"{}", b'{"v":2,"type":"offset_commit"}', b"[1]",
     b'{"v":1,"type":"offset_commit","group":"g","topic":"t","partition":0,'
     b'"offset":true,"metadata":""}',
     b'{"v":3,"type":"offset_commit","group":"g","topic":"t","partition":0,'
     b'"offset":1,"metadata":"","committed_at_ms":0,"stamp":[1]}',
     b'{"v":3,"type":"offset_commit","group":"g","topic":"t","partition":0,'
     b'"offset":1,"metadata":"","committed_at_ms":0,"stamp":[1,-2]}'],
)  # fmt: skip
def test_meta_decode_refuses_malformed_payloads(payload):
    # Goal: META payloads are validated field by field.
    with pytest.raises(InvalidRequest):
        decode_meta(payload)


def test_snapshot_round_trip_continues_identically():
    # Goal: a restored state answers every later entry exactly as the original.
    driver = Driver(PartitionState(topic="t", partition=3, producers_max=3))
    for pid in range(4):
        driver.data(batch(2, pid, 0, 0))
    driver.data(batch(2, 1, 0, 0))  # duplicate: a skipped range
    driver.commit("g", 4, partition=3)
    restored = Driver(PartitionState.restore(driver.state.snapshot()))
    assert restored.state.snapshot() == driver.state.snapshot()
    for payload in (batch(1, 2, 0, 2), batch(1, 0, 0, 5), batch(2, 1, 0, 0), batch(1)):
        assert restored.data(payload) == driver.data(payload)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x80", b"\x81\xa1v\x02"])
def test_restore_refuses_malformed_snapshots(data):
    # Goal: snapshot bytes from a peer are validated, never trusted.
    with pytest.raises(SnapshotFormatError):
        PartitionState.restore(data)


def test_error_codes_form_one_table():
    # Goal: every client error code is defined once.
    table = error_table()
    assert table["OUT_OF_ORDER_SEQUENCE"] == (409, False)
    assert table["NOT_LEADER"][0] == 421
    assert table["LEADER_NOT_AVAILABLE"] == (503, True)


def test_a_refusal_naming_no_leader_is_answered_leader_not_available():
    # Goal: the core's plain "not the leader" without a hint leaves a node as 503
    # LEADER_NOT_AVAILABLE, over HTTP and between nodes alike, and comes back from a
    # peer as a NotLeader (what forwarding code catches); one naming a leader stays 421.
    import json

    from multiraft.errors import answered, error_body
    from multiraft.transport.remote_errors import error_from_body
    from raftlog.errors import LeaderNotAvailable, NotLeader

    assert error_body(NotLeader()) == {"error_code": "LEADER_NOT_AVAILABLE",
                                       "message": "not the leader (leader hint: unknown)"}
    assert answered(NotLeader()).http_status == 503
    back = error_from_body(json.dumps(error_body(NotLeader())).encode())
    assert isinstance(back, LeaderNotAvailable) and isinstance(back, NotLeader) and back.retriable
    named = NotLeader(2)
    assert answered(named) is named and error_body(named) == {
        "error_code": "NOT_LEADER", "message": "not the leader (leader hint: 2)", "leader_hint": 2}
    assert error_from_body(json.dumps(error_body(named)).encode()).leader_hint == 2


# ---- property: random produce / retry schedules against a reference model ----

operations = st.lists(
    st.tuples(
        st.sampled_from(["new", "retry", "double", "noise"]),
        st.integers(0, 2),  # producer
        st.integers(1, 4),  # record count / retry depth
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_random_produce_and_retries_match_the_model(ops):
    # Goal: whatever the interleaving of new batches, retries and double proposals,
    # accepted batches get gapless storage offsets, every retry within the last five
    # returns the original offsets, and visible (non-skipped) ranges never overlap.
    driver = Driver()
    sent: dict[int, list[tuple[bytes, int]]] = {p: [] for p in range(3)}  # (bytes, base)
    next_seq = dict.fromkeys(range(3), 0)
    visible: list[tuple[int, int]] = []
    for kind, producer, amount in ops:
        hw = driver.state.high_watermark
        if kind == "noise":
            result = driver.data(batch(amount))
            assert result.base_offset == hw
            visible.append((hw, amount))
        elif kind in ("new", "double"):
            payload = batch(amount, producer, 0, next_seq[producer])
            next_seq[producer] = next_sequence(next_seq[producer], amount)
            first = driver.data(payload)
            assert (first.base_offset, first.duplicate) == (hw, False)
            sent[producer].append((payload, hw))
            visible.append((hw, amount))
            if kind == "double":
                again = driver.data(payload)
                assert (again.base_offset, again.duplicate) == (hw, True)
        elif sent[producer]:
            payload, base = sent[producer][-min(amount, len(sent[producer]))]
            assert driver.state.check_produce(read_header(payload)) == Duplicate(
                base, read_header(payload).record_count
            )
            assert driver.data(payload).base_offset == base
    skipped = driver.state.skipped_ranges
    covered = sorted(visible + skipped)
    position = 0
    for base, count in covered:
        assert base == position, "every offset is either visible or skipped, once"
        position += count
    assert position == driver.state.high_watermark
