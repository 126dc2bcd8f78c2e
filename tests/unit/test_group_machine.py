"""Group 0's machine with consumer groups beside the catalog (multiraft/node/machines.py).

Goal: a group command applies to the groups and not to the catalog (whose applied index
still advances); a committed group entry that does not decode changes nothing; a
snapshot holding groups restores both the catalog and the groups, a snapshot without
groups is the catalog's bytes alone (as before groups existed), and a truncated one is
refused. Plus the coordinator's rebalance timeout: a member that keeps revoked
partitions too long is expired.
"""

from __future__ import annotations

import pytest

from multiraft.consumer_groups import ExpireMembers, Heartbeat, JoinGroup, Sessions, Subscription
from multiraft.consumer_groups import encode_group_command as encode
from multiraft.errors import InvalidRequest, SnapshotFormatError
from multiraft.metadata.commands import CreateTopic, RegisterNode, encode_command
from multiraft.node.catalog_holder import CatalogHolder
from multiraft.node.machines import GROUPS_SNAPSHOT_MAGIC, CatalogMachine
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, NodeId, Term


class Log:
    def __init__(self) -> None:
        self.machine = CatalogMachine(CatalogHolder())
        self.index = 0

    def apply(self, payload: bytes):  # type: ignore[no-untyped-def]
        self.index += 1
        return self.machine.apply(Entry(Index(self.index), Term(1), EntryKind.META, payload))


def _with_topic(partitions: int = 4) -> Log:
    log = Log()
    log.apply(encode_command(RegisterNode(node_id=NodeId(1), raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2")))
    log.apply(encode_command(CreateTopic(name="t", partitions=partitions, replication_factor=1, config={},
                                         assignments=tuple((NodeId(1),) for _ in range(partitions)))))
    return log


def _join(member: str, session_timeout_ms: int | None = None) -> bytes:
    return encode(JoinGroup(group="g", member_id=member, subscription=Subscription(topics=("t",)),
                            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=1000))


def test_group_commands_apply_beside_the_catalog() -> None:
    log = _with_topic()
    catalog_bytes = log.machine.snapshot()
    result = log.apply(_join("a"))
    assert result.error is None and len(result.value.assigned) == 4  # resolved against the catalog
    holder = log.machine.holder
    assert holder.catalog.applied_index == log.index  # the catalog still follows the log
    assert holder.groups.has_members("g")
    garbage = log.apply(b"consumer-group:{not json")
    assert isinstance(garbage.error, InvalidRequest)
    assert not catalog_bytes.startswith(GROUPS_SNAPSHOT_MAGIC)


def test_a_snapshot_with_groups_restores_both_and_one_without_stays_the_catalogs() -> None:
    log = _with_topic()
    log.apply(_join("a"))
    log.apply(_join("b"))
    data = log.machine.snapshot()
    assert data.startswith(GROUPS_SNAPSHOT_MAGIC)
    other = CatalogMachine(CatalogHolder())
    other.restore(data, Index(log.index))
    assert other.snapshot() == data
    assert sorted(other.holder.groups.groups["g"].members) == ["a", "b"]
    assert "t" in other.holder.catalog.topics
    for cut in (len(GROUPS_SNAPSHOT_MAGIC) + 3, len(data) - 5):
        with pytest.raises(SnapshotFormatError):
            CatalogMachine(CatalogHolder()).restore(data[:cut], Index(log.index))
    log.apply(encode(ExpireMembers(group="g", member_ids=("a", "b"))))
    plain = log.machine.snapshot()
    assert not plain.startswith(GROUPS_SNAPSHOT_MAGIC)
    other.restore(plain, Index(log.index))
    assert other.holder.groups.groups == {}


def test_a_member_that_keeps_revoked_partitions_past_its_rebalance_timeout_is_expired() -> None:
    log = _with_topic()
    log.apply(_join("a"))
    log.apply(_join("b"))  # a must give back two partitions
    log.apply(encode(Heartbeat(group="g", member_id="a", member_epoch=1)))  # told, not acknowledged
    state = log.machine.holder.groups
    assert state.groups["g"].members["a"].revoking
    sessions = Sessions()
    sessions.reset(state, 0)
    group = state.groups["g"]
    for now in (400, 800):  # both keep heartbeating
        sessions.note("g", group.members["a"], group.session_timeout_ms, now)
        sessions.note("g", group.members["b"], group.session_timeout_ms, now)
        assert sessions.expired(state, now) == []
    sessions.note("g", group.members["a"], group.session_timeout_ms, 1200)
    sessions.note("g", group.members["b"], group.session_timeout_ms, 1200)
    assert sessions.expired(state, 1200) == [ExpireMembers(group="g", member_ids=("a",), reason="rebalance_timeout")]
