"""Consumer offsets with a commit time: retention passes, deletes, and the v1 formats.

Apply reads no clock: a commit carries its leader's time, a retention pass its own
`as_of_ms` and `retention_ms`, so replicas fed the same entries reach the same state
whenever they apply them.
"""

from __future__ import annotations

import json

import msgpack
import pytest

from multiraft.errors import InvalidRequest, SnapshotFormatError, UnknownGroup
from multiraft.state.consumer_offsets import (
    COMMIT_TIME_UNKNOWN,
    EXPIRE_GROUPS_PER_ENTRY_MAX,
    CommittedOffset,
    OffsetCommit,
    OffsetsDelete,
    OffsetsExpire,
    decode_meta,
    encode_meta,
)
from multiraft.state.partition import PartitionState
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Term
from storage.batch import Record, encode_batch

HOUR_MS = 3_600_000
# What the code before retention wrote for a commit (sorted keys, compact): v1, no time.
V1_COMMIT = (b'{"group":"old","metadata":"m","offset":2,"partition":0,"topic":"t",'
             b'"type":"offset_commit","v":1}')


class Replica:
    """One replica's partition state, fed entries with consecutive indexes."""

    def __init__(self, state: PartitionState | None = None) -> None:
        self.state = state or PartitionState(topic="t", partition=0)

    def apply(self, kind: EntryKind, payload: bytes):  # type: ignore[no-untyped-def]
        index = Index(self.state.applied_index + 1)
        return self.state.apply(Entry(index, Term(1), kind, payload))

    def meta(self, payload: bytes):  # type: ignore[no-untyped-def]
        return self.apply(EntryKind.META, payload)

    def groups(self) -> dict[str, int]:
        return {group: c.committed_at_ms for group, c in self.state.consumer_offsets.items()}


def commit(group: str, at_ms: int, offset: int = 1) -> bytes:
    return encode_meta(OffsetCommit(group=group, topic="t", partition=0, offset=offset, committed_at_ms=at_ms))


def expire(as_of_ms: int, retention_ms: int, *groups: str) -> bytes:
    return encode_meta(OffsetsExpire(as_of_ms=as_of_ms, retention_ms=retention_ms, groups=groups))


def records(count: int = 3) -> bytes:
    return encode_batch([Record(None, b"v")] * count, first_timestamp_ms=1)


def test_expiry_removes_exactly_the_groups_idle_as_of_the_entrys_time():
    # Goal: apply decides with the times carried in the entries only: of the listed groups,
    # those whose last commit is older than as_of - retention go, one that committed again
    # after the leader listed it stays, an unlisted idle one stays (the leader chose), and
    # two replicas applying the same entries (at any wall-clock moment) agree.
    entries = [
        (EntryKind.DATA, records()),
        (EntryKind.META, commit("idle", at_ms=1 * HOUR_MS)),
        (EntryKind.META, commit("again", at_ms=1 * HOUR_MS)),
        (EntryKind.META, commit("fresh", at_ms=9 * HOUR_MS)),
        (EntryKind.META, commit("unlisted", at_ms=1 * HOUR_MS)),
        (EntryKind.META, commit("edge", at_ms=2 * HOUR_MS)),  # exactly as old as the retention: stays
        (EntryKind.META, commit("again", at_ms=10 * HOUR_MS)),  # committed after the pass was proposed
        (EntryKind.META, expire(10 * HOUR_MS, 8 * HOUR_MS, "idle", "again", "fresh", "edge", "gone")),
    ]
    first, second = Replica(), Replica()
    results = [first.apply(kind, payload) for kind, payload in entries]
    assert [second.apply(kind, payload) for kind, payload in entries] == results
    assert results[-1].ok and results[-1].count == 1, "one group removed"
    assert first.groups() == {"fresh": 9 * HOUR_MS, "unlisted": 1 * HOUR_MS, "edge": 2 * HOUR_MS,
                              "again": 10 * HOUR_MS}
    assert first.state.snapshot() == second.state.snapshot()
    assert first.state.committed_offset("idle") is None


def test_the_leader_lists_idle_and_unknown_time_groups_in_commit_order():
    # Goal: the pure selection a retention pass proposes: groups idle past the retention
    # or of unknown time (v1), in commit order, at most `limit`, stopping at the first
    # group inside the retention (bounded work); none when nothing is idle; a stamped
    # group moves to the end of the order as a commit would.
    replica = Replica()
    replica.apply(EntryKind.DATA, records())
    replica.meta(V1_COMMIT)
    replica.meta(commit("a", at_ms=5 * HOUR_MS))
    replica.meta(commit("b", at_ms=1 * HOUR_MS))
    replica.meta(commit("c", at_ms=9 * HOUR_MS))
    replica.meta(commit("d", at_ms=2 * HOUR_MS))  # after c in order (a slower leader's clock)
    replica.meta(commit("a", at_ms=3 * HOUR_MS))  # a's last commit moves it to the end
    state = replica.state
    assert list(state.consumer_offsets) == ["old", "b", "c", "d", "a"]
    assert state.idle_groups(10 * HOUR_MS, 4 * HOUR_MS, limit=10) == ("old", "b"), "stops at c"
    assert state.idle_groups(10 * HOUR_MS, 4 * HOUR_MS, limit=1) == ("old",)
    assert state.idle_groups(10 * HOUR_MS, 9 * HOUR_MS, limit=10) == ("old",), "only the unknown time"
    replica.meta(expire(10 * HOUR_MS, 9 * HOUR_MS, "old"))
    assert list(state.consumer_offsets) == ["b", "c", "d", "a", "old"], "stamped: last in order"
    assert state.idle_groups(10 * HOUR_MS, 9 * HOUR_MS, limit=10) == (), "nothing left to propose"
    assert state.idle_groups(100 * HOUR_MS, HOUR_MS, limit=10) == ("b", "c", "d", "a", "old")


def test_a_v1_commit_decodes_with_an_unknown_time_and_expires_one_retention_after_the_first_pass():
    # Goal: a META payload written before retention (v1, no time) still applies; the first
    # pass stamps the group with its as_of time instead of dropping it, and a later pass
    # removes it only once a whole retention has passed since that stamp.
    assert decode_meta(V1_COMMIT) == OffsetCommit(group="old", topic="t", partition=0, offset=2, metadata="m")
    replica = Replica()
    replica.apply(EntryKind.DATA, records())
    assert replica.meta(V1_COMMIT).base_offset == 2
    assert replica.groups() == {"old": COMMIT_TIME_UNKNOWN}
    assert replica.meta(expire(100 * HOUR_MS, HOUR_MS, "old")).count == 0
    assert replica.groups() == {"old": 100 * HOUR_MS}, "stamped, kept"
    assert replica.meta(expire(101 * HOUR_MS, HOUR_MS, "old")).count == 0, "exactly one retention: kept"
    assert replica.meta(expire(101 * HOUR_MS + 1, HOUR_MS, "old")).count == 1
    assert replica.groups() == {}


def test_delete_removes_one_group_and_a_second_delete_is_unknown_group():
    # Goal: offsets_delete removes the group's offset here and nothing else; deleting a
    # group the partition does not hold is refused with UNKNOWN_GROUP and changes nothing.
    replica = Replica()
    replica.apply(EntryKind.DATA, records())
    replica.meta(commit("a", at_ms=HOUR_MS))
    replica.meta(commit("b", at_ms=HOUR_MS))
    assert replica.meta(encode_meta(OffsetsDelete(group="a"))).count == 1
    assert list(replica.groups()) == ["b"]
    again = replica.meta(encode_meta(OffsetsDelete(group="a")))
    assert isinstance(again.error, UnknownGroup) and again.error.http_status == 404
    assert list(replica.groups()) == ["b"]
    assert replica.meta(commit("a", at_ms=2 * HOUR_MS)).ok, "a group may commit again after a delete"


def test_v2_payloads_round_trip():
    # Goal: every command encodes as v2 and decodes to itself.
    for command in (OffsetCommit(group="g", topic="t", partition=3, offset=7, metadata="x", committed_at_ms=12),
                    OffsetsExpire(as_of_ms=5, retention_ms=1, groups=("a", "b")),
                    OffsetsDelete(group="g")):
        payload = encode_meta(command)
        assert payload.startswith(b'{') and b'"v":2' in payload
        assert decode_meta(payload) == command


@pytest.mark.parametrize("payload", [
    b'{"v":1,"type":"offsets_expire","as_of_ms":1,"retention_ms":1,"groups":["a"]}',  # no v1 expiry
    b'{"v":3,"type":"offsets_delete","group":"a"}',
    b'{"v":true,"type":"offsets_delete","group":"a"}',
    b'{"v":2,"type":"offsets_delete","group":"a b"}',
    b'{"v":2,"type":"offsets_delete","group":"a","extra":1}',
    b'{"v":2,"type":"offset_commit","group":"g","topic":"t","partition":0,"offset":0,"metadata":""}',
    b'{"v":2,"type":"offset_commit","group":"g","topic":"t","partition":0,"offset":0,"metadata":"",'
    b'"committed_at_ms":-1}',
    b'{"v":1,"type":"offset_commit","group":"g","topic":"t","partition":0,"offset":0,"metadata":"",'
    b'"committed_at_ms":1}',
    b'{"v":2,"type":"offsets_expire","as_of_ms":1,"retention_ms":0,"groups":["a"]}',
    b'{"v":2,"type":"offsets_expire","as_of_ms":1,"retention_ms":1,"groups":[]}',
    b'{"v":2,"type":"offsets_expire","as_of_ms":1,"retention_ms":1,"groups":["a","a"]}',
    b'{"v":2,"type":"offsets_expire","as_of_ms":1,"retention_ms":1,"groups":"a"}',
    b'{"v":2,"type":"offsets_expire","as_of_ms":1.5,"retention_ms":1,"groups":["a"]}',
    json.dumps({"v": 2, "type": "offsets_expire", "as_of_ms": 1, "retention_ms": 1,
                "groups": [f"g{i}" for i in range(EXPIRE_GROUPS_PER_ENTRY_MAX + 1)]}).encode(),
])
def test_malformed_payloads_are_refused(payload):
    # Goal: each version takes exactly its own fields, each checked; apply refuses them alike.
    with pytest.raises(InvalidRequest):
        decode_meta(payload)
    replica = Replica()
    assert isinstance(replica.meta(payload).error, InvalidRequest)


def _v1_snapshot(groups: list[list[object]]) -> bytes:
    """A snapshot as the code before retention encoded it (v1: 4-field group rows)."""
    return msgpack.packb({
        "v": 1, "topic": "t", "partition": 0, "applied_index": 9, "next_offset": 5,
        "producers_max": 10, "consumer_groups_max": 10, "producers": [[4, 0, [[0, 5, 0]]]],
        "consumer_offsets": groups, "skipped": [],
    }, use_bin_type=True)


def test_a_v1_snapshot_restores_with_unknown_commit_times_and_re_encodes_as_v2():
    # Goal: start points written before retention (v1) restore: the groups keep offset,
    # metadata and index, their time is unknown; the state goes on as v2.
    state = PartitionState.restore(_v1_snapshot([["a", 3, "m", 7], ["b", 5, "", 8]]))
    assert dict(state.consumer_offsets) == {"a": CommittedOffset(3, "m", 7, COMMIT_TIME_UNKNOWN),
                                            "b": CommittedOffset(5, "", 8, COMMIT_TIME_UNKNOWN)}
    assert state.producers.get(4) is not None and state.applied_index == 9
    again = PartitionState.restore(state.snapshot())
    assert msgpack.unpackb(state.snapshot())["v"] == 2
    assert dict(again.consumer_offsets) == dict(state.consumer_offsets)


def test_a_v2_snapshot_keeps_commit_times():
    # Goal: retention reads commit times after a restart or a snapshot install too.
    replica = Replica()
    replica.apply(EntryKind.DATA, records())
    replica.meta(commit("a", at_ms=HOUR_MS))
    restored = PartitionState.restore(replica.state.snapshot())
    assert restored.consumer_offsets["a"].committed_at_ms == HOUR_MS
    assert restored.snapshot() == replica.state.snapshot()


@pytest.mark.parametrize("rows", [
    [["a", 3, "m", 7, 1]],  # a v2 row in a v1 snapshot
    [["a", 3, "m"]],
    [["a", 3, "m", 7], ["a", 4, "m", 8]],  # a group twice
])
def test_malformed_v1_group_rows_are_refused(rows):
    # Goal: a v1 snapshot is held to its own row shape.
    with pytest.raises(SnapshotFormatError):
        PartitionState.restore(_v1_snapshot(rows))
