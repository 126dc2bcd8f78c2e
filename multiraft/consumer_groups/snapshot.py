"""Snapshots of the consumer group state: versioned JSON, validated on restore.

A snapshot travels to lagging and new nodes, so it is checked as any input is:
members go back through the command dataclasses' own checks (`Subscription`), every
partition through `check_partitions`, the limits hold, and the invariant that no
partition has two owners is checked again. Failures raise `SnapshotFormatError`.
"""

from __future__ import annotations

import json
from typing import Any

from multiraft.consumer_groups.commands import (
    ASSIGNORS,
    GROUP_PARTITIONS_MAX,
    GROUPS_MAX,
    MEMBERS_PER_GROUP_MAX,
    TopicPartition,
    check_epoch,
    check_group,
    check_member_id,
    check_partitions,
    decode_subscription,
    is_int,
)
from multiraft.consumer_groups.state import Group, GroupsState, Member, check_exclusive
from multiraft.errors import SnapshotFormatError
from raftlog.errors import ClientError

GROUPS_SNAPSHOT_VERSION = 1


def _partitions(partitions: frozenset[TopicPartition]) -> list[list[Any]]:
    return [[topic, partition] for topic, partition in sorted(partitions)]


def encode_groups(state: GroupsState) -> bytes:
    groups = []
    for name, group in sorted(state.groups.items()):
        groups.append({
            "name": name, "epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
            "session_timeout_ms": group.session_timeout_ms, "assignor": group.assignor,
            "counts": [[topic, count] for topic, count in sorted(group.counts.items())],
            "members": [[m.member_id, m.epoch, m.previous_epoch,
                         {"topics": list(m.subscription.topics), "pattern": m.subscription.pattern},
                         m.rebalance_timeout_ms, _partitions(m.assigned), _partitions(m.revoking)]
                        for _, m in sorted(group.members.items())],
            "target": [[member_id, _partitions(tps)] for member_id, tps in sorted(group.target.items())],
        })
    document = {"v": GROUPS_SNAPSHOT_VERSION, "groups": groups}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode_groups(data: bytes) -> GroupsState:
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("v") != GROUPS_SNAPSHOT_VERSION:
            raise SnapshotFormatError("consumer groups snapshot has an unknown version")
        groups = document["groups"]
        if not isinstance(groups, list) or len(groups) > GROUPS_MAX:
            raise SnapshotFormatError(f"a consumer groups snapshot holds at most {GROUPS_MAX} groups")
        state = GroupsState()
        for row in groups:
            group = _group(row)
            if group.name in state.groups:
                raise SnapshotFormatError(f"group {group.name!r} twice in a snapshot")
            state.groups[group.name] = group
        return state
    except SnapshotFormatError:
        raise
    except (ClientError, ValueError, KeyError, TypeError, AssertionError) as error:
        raise SnapshotFormatError(f"consumer groups snapshot does not decode: {error}") from None


def _tps(value: Any, name: str) -> frozenset[TopicPartition]:
    if not isinstance(value, list):
        raise SnapshotFormatError(f"{name} is a list")
    pairs = tuple(tuple(item) for item in value)
    check_partitions(pairs, name, GROUP_PARTITIONS_MAX)
    return frozenset(pairs)  # type: ignore[arg-type]


def _group(row: Any) -> Group:
    fields = {"name", "epoch", "assignment_epoch", "session_timeout_ms", "assignor", "counts", "members", "target"}
    if not isinstance(row, dict) or set(row) != fields:
        raise SnapshotFormatError(f"a group row has the fields {sorted(fields)}")
    check_group(row["name"])
    for key in ("epoch", "assignment_epoch"):
        check_epoch(row[key])
    if not is_int(row["session_timeout_ms"]) or row["assignor"] not in ASSIGNORS:
        raise SnapshotFormatError("a group row's settings do not validate")
    counts = {str(topic): int(count) for topic, count in row["counts"]}
    if sum(counts.values()) > GROUP_PARTITIONS_MAX or any(c < 0 for c in counts.values()):
        raise SnapshotFormatError("a group row's topics exceed the partition limit")
    members: dict[str, Member] = {}
    if not isinstance(row["members"], list) or not 1 <= len(row["members"]) <= MEMBERS_PER_GROUP_MAX:
        raise SnapshotFormatError(f"a group has 1..{MEMBERS_PER_GROUP_MAX} members")
    for member_id, epoch, previous, subscription, rebalance_ms, assigned, revoking in row["members"]:
        check_member_id(member_id)
        check_epoch(epoch)
        check_epoch(previous)
        if not is_int(rebalance_ms):
            raise SnapshotFormatError("rebalance_timeout_ms is an integer")
        members[member_id] = Member(member_id=member_id, epoch=epoch, previous_epoch=previous,
                                    subscription=decode_subscription(subscription),
                                    rebalance_timeout_ms=rebalance_ms, assigned=_tps(assigned, "assigned"),
                                    revoking=_tps(revoking, "revoking"))
    target = {}
    for member_id, tps in row["target"]:
        if member_id not in members:
            raise SnapshotFormatError("a target names a member the group does not have")
        target[member_id] = _tps(tps, "target")
    group = Group(name=row["name"], epoch=row["epoch"], assignment_epoch=row["assignment_epoch"],
                  session_timeout_ms=row["session_timeout_ms"], assignor=row["assignor"], members=members,
                  target=target, counts=counts)
    check_exclusive(group)
    return group
