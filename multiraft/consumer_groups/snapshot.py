"""Snapshots of the consumer group state: versioned JSON, validated on restore.

Version 2 adds Confluent consumer instances (instances.py): a member row may carry an
eighth item, its manual assignment (null for subscribed members; its subscription is
then null), and the document an `instances` list. A state without instances is still
written as version 1, byte for byte as before, and version 1 snapshots restore as
they always did.

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
    INSTANCES_MAX,
    MEMBERS_PER_GROUP_MAX,
    POSITION_OFFSET_MAX,
    CreateInstance,
    TopicPartition,
    check_epoch,
    check_group,
    check_member_id,
    check_partitions,
    decode_subscription,
    is_int,
)
from multiraft.consumer_groups.instances import Instance, InstanceConfig
from multiraft.consumer_groups.state import Group, GroupsState, Member, check_exclusive
from multiraft.errors import SnapshotFormatError
from raftlog.errors import ClientError

GROUPS_SNAPSHOT_VERSION = 1
INSTANCES_SNAPSHOT_VERSION = 2


def _partitions(partitions: frozenset[TopicPartition]) -> list[list[Any]]:
    return [[topic, partition] for topic, partition in sorted(partitions)]


def _subscription(member: Member) -> dict[str, Any] | None:
    if member.subscription is None:
        return None
    return {"topics": list(member.subscription.topics), "pattern": member.subscription.pattern}


def _member_row(member: Member, with_manual: bool) -> list[Any]:
    row = [member.member_id, member.epoch, member.previous_epoch, _subscription(member), member.rebalance_timeout_ms,
           _partitions(member.assigned), _partitions(member.revoking)]
    if with_manual:
        row.append(None if member.manual is None else _partitions(member.manual))
    return row


def encode_groups(state: GroupsState) -> bytes:
    with_instances = bool(state.instances)
    groups = []
    for name, group in sorted(state.groups.items()):
        groups.append({
            "name": name, "epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
            "session_timeout_ms": group.session_timeout_ms, "assignor": group.assignor,
            "counts": [[topic, count] for topic, count in sorted(group.counts.items())],
            "members": [_member_row(m, with_instances) for _, m in sorted(group.members.items())],
            "target": [[member_id, _partitions(tps)] for member_id, tps in sorted(group.target.items())],
        })
    document: dict[str, Any] = {"v": GROUPS_SNAPSHOT_VERSION, "groups": groups}
    if with_instances:
        document["v"] = INSTANCES_SNAPSHOT_VERSION
        document["instances"] = [
            [name, member_id, instance.config.as_json(),
             [[t, p, o] for (t, p), o in sorted(instance.positions.items())]]
            for name, by_id in sorted(state.instances.items()) for member_id, instance in sorted(by_id.items())]
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode_groups(data: bytes) -> GroupsState:
    try:
        document = json.loads(data)
        version = document.get("v") if isinstance(document, dict) else None
        if version not in (GROUPS_SNAPSHOT_VERSION, INSTANCES_SNAPSHOT_VERSION):
            raise SnapshotFormatError("consumer groups snapshot has an unknown version")
        groups = document["groups"]
        if not isinstance(groups, list) or len(groups) > GROUPS_MAX:
            raise SnapshotFormatError(f"a consumer groups snapshot holds at most {GROUPS_MAX} groups")
        state = GroupsState()
        for row in groups:
            group = _group(row, version)
            if group.name in state.groups:
                raise SnapshotFormatError(f"group {group.name!r} twice in a snapshot")
            state.groups[group.name] = group
        if version == INSTANCES_SNAPSHOT_VERSION:
            _instances(state, document["instances"])
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


def _instances(state: GroupsState, rows: Any) -> None:
    """Each instance is checked as its create was, and must be a member of its group."""
    if not isinstance(rows, list) or len(rows) > INSTANCES_MAX:
        raise SnapshotFormatError(f"a snapshot holds at most {INSTANCES_MAX} consumer instances")
    for name, member_id, config, positions in rows:
        slots = set(InstanceConfig.__slots__)  # type: ignore[attr-defined]
        if not isinstance(config, dict) or not slots - {"owner"} <= set(config) <= slots:
            raise SnapshotFormatError("an instance's settings do not validate")
        command = CreateInstance(group=name, member_id=member_id, format=config["format"],
                                 auto_offset_reset=config["auto_offset_reset"], auto_commit=config["auto_commit"],
                                 request_timeout_ms=config["request_timeout_ms"],
                                 instance_timeout_ms=config["instance_timeout_ms"], owner=config.get("owner"))
        group = state.groups.get(name)
        member = group.members.get(member_id) if group is not None else None
        if member is None or member_id in state.instances.get(name, {}):
            raise SnapshotFormatError("an instance is not a member of its group, or is listed twice")
        held = member.assigned | member.revoking
        kept: dict[tuple[str, int], int] = {}
        for topic, partition, offset in positions:
            if (topic, partition) not in held or not is_int(offset) or not 0 <= offset <= POSITION_OFFSET_MAX:
                raise SnapshotFormatError("an instance's position is not for a partition it holds")
            kept[(topic, partition)] = offset
        state.instances.setdefault(name, {})[member_id] = Instance(config=InstanceConfig.of(command), positions=kept)


def _group(row: Any, version: int = GROUPS_SNAPSHOT_VERSION) -> Group:
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
    for member_row in row["members"]:
        if not isinstance(member_row, list) or len(member_row) != (8 if version == INSTANCES_SNAPSHOT_VERSION else 7):
            raise SnapshotFormatError("a member row does not have the fields of its version")
        member_id, epoch, previous, subscription, rebalance_ms, assigned, revoking = member_row[:7]
        manual = member_row[7] if len(member_row) == 8 else None
        if (subscription is None) == (manual is None):
            raise SnapshotFormatError("a member has a subscription or a manual assignment (exactly one)")
        check_member_id(member_id)
        check_epoch(epoch)
        check_epoch(previous)
        if not is_int(rebalance_ms):
            raise SnapshotFormatError("rebalance_timeout_ms is an integer")
        members[member_id] = Member(member_id=member_id, epoch=epoch, previous_epoch=previous,
                                    subscription=None if subscription is None else decode_subscription(subscription),
                                    rebalance_timeout_ms=rebalance_ms, assigned=_tps(assigned, "assigned"),
                                    revoking=_tps(revoking, "revoking"),
                                    manual=None if manual is None else _tps(manual, "manual"))
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
