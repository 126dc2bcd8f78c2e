"""Confluent REST v2 consumer instances, as members of their group (pure, deterministic).

Confluent's REST Proxy keeps an instance (a Kafka consumer) in the memory of the one
proxy process that created it, so behind a load balancer a client meets `40403
Consumer instance not found` (confluentinc/kafka-rest #201, #1245). Here an instance
lives in group 0 beside the groups (docs/node.md, "Confluent consumer instances"), so
every node serves every instance and it outlives the node that created it:

- it is a **member** of its group from its creation (member id = instance id), so
  liveness, assignment, fencing and the commit checks are the group machinery's;
- plus what the proxy keeps in memory: its settings (`InstanceConfig`) and where it
  reads next per partition (`positions`).

Its member has one of three shapes:
- neither subscribed nor assigned (`subscription` None, `manual` empty): reads nothing;
- subscribed (`subscription`): the group's assignor gives it partitions, as any member;
- manually assigned (Kafka's assign(): `manual` holds the partitions): its target is
  exactly them, outside the assignor, which balances the other partitions over the
  subscribed members (state.py `_bump`). It still takes a partition only once no other
  member holds it, so never two owners. Two instances may not assign themselves the
  same partition (`ConsumerIllegalState`): Kafka would let both read it, unfenced.

Subscribe, unsubscribe and assign take effect at once, as Kafka's consumer leaves or
rejoins its group at once: what the member no longer targets is released in the same
apply, with no revoking round (a revoking round waits for the member's next call, and
an unsubscribed instance may never call again). A rebalance caused by another member
still revokes as for any member; the instance's next records GET gives them back.

The member's session is the instance's `consumer.instance.timeout.ms` (Confluent's
proxy keeps its consumer in the group from a background thread while the instance
lives), and so is its rebalance timeout. When the member goes (deleted, expired),
the instance goes with it.

Positions are kept only for partitions the member holds (assigned or revoking): a
partition that comes back later starts from the group's committed offset, as a Kafka
consumer's would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups.commands import (
    INSTANCES_MAX,
    INSTANCES_PER_OWNER_MAX,
    AssignInstance,
    CreateInstance,
    DeleteInstance,
    InstanceCommand,
    InstancePositions,
    SubscribeInstance,
    Subscription,
    TopicPartition,
)
from multiraft.errors import ConsumerIllegalState, ConsumerInstanceExists, UnknownConsumerInstance

if TYPE_CHECKING:
    from multiraft.consumer_groups.topics import TopicsView


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceConfig:
    format: str  # json | binary: the embedded format of its records GETs
    auto_offset_reset: str  # earliest | latest: where a partition without a committed offset starts
    auto_commit: bool  # commit its positions as it reads (Kafka's enable.auto.commit)
    request_timeout_ms: int  # how long a records GET waits for data
    instance_timeout_ms: int  # idle this long, it is removed (its member's session)
    owner: str | None = None  # the token name that created it: only it (or an admin) drives it

    @classmethod
    def of(cls, command: CreateInstance) -> InstanceConfig:
        return cls(format=command.format, auto_offset_reset=command.auto_offset_reset,
                   auto_commit=command.auto_commit, request_timeout_ms=command.request_timeout_ms,
                   instance_timeout_ms=command.instance_timeout_ms, owner=command.owner)

    def as_json(self) -> dict[str, Any]:
        """Its settings; `owner` only when there is one (a snapshot without owners keeps its bytes)."""
        found = {"format": self.format, "auto_offset_reset": self.auto_offset_reset, "auto_commit": self.auto_commit,
                 "request_timeout_ms": self.request_timeout_ms, "instance_timeout_ms": self.instance_timeout_ms}
        if self.owner is not None:
            found["owner"] = self.owner
        return found


@dataclass(slots=True, kw_only=True)
class Instance:
    config: InstanceConfig
    positions: dict[TopicPartition, int]  # next offset to read; keys within its member's holdings


def positions_json(positions: dict[TopicPartition, int]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(positions.items())]


class InstancesMixin:
    """The instance half of `GroupsState` (state.py). It reaches the member half only
    through `GroupsState`'s own methods (`_add_instance_member`, `_retarget`, `_remove`,
    `_member_or_none`), so this module does not import state.py."""

    groups: dict[str, Any]
    instances: dict[str, dict[str, Instance]]

    def instance(self, name: str, member_id: str) -> Instance:
        """The instance, or `UnknownConsumerInstance` (Confluent's 40403)."""
        found = self.instances.get(name, {}).get(member_id)
        if found is None:
            raise UnknownConsumerInstance(f"consumer instance {member_id!r} not found in group {name!r}")
        return found

    def instance_count(self) -> int:
        return sum(len(by_id) for by_id in self.instances.values())

    def _owned_by(self, owner: str) -> int:
        return sum(1 for by_id in self.instances.values() for i in by_id.values() if i.config.owner == owner)

    def instance_view(self, name: str, member_id: str) -> dict[str, Any]:
        """What a node needs to serve a call on the instance: settings, member, positions."""
        instance = self.instance(name, member_id)
        member = self._member_view(name, member_id)  # type: ignore[attr-defined]
        return {"group": name, "instance_id": member_id, "config": instance.config.as_json(),
                "member": member.as_json(), "mode": self._mode(name, member_id),
                "subscription": self._subscription_json(name, member_id),
                "manual": [[t, p] for t, p in sorted(self._manual_of(name, member_id))],
                "positions": positions_json(instance.positions)}

    def _apply_instance(self, command: InstanceCommand, topics: TopicsView) -> Any:
        if isinstance(command, CreateInstance):
            if command.member_id in self.instances.get(command.group, {}):
                raise ConsumerInstanceExists(f"consumer instance {command.member_id!r} already exists "
                                             f"in group {command.group!r}")
            if self.instance_count() >= INSTANCES_MAX:
                raise ConsumerIllegalState(f"the cluster holds its maximum of {INSTANCES_MAX} consumer instances")
            if command.owner is not None and self._owned_by(command.owner) >= INSTANCES_PER_OWNER_MAX:
                raise ConsumerIllegalState(f"{command.owner!r} holds its maximum of {INSTANCES_PER_OWNER_MAX} "
                                           "consumer instances")
            self._add_instance_member(command, topics)  # type: ignore[attr-defined]
            self.instances.setdefault(command.group, {})[command.member_id] = Instance(
                config=InstanceConfig.of(command), positions={})
            return self._member_view(command.group, command.member_id)  # type: ignore[attr-defined]
        instance = self.instance(command.group, command.member_id)
        if isinstance(command, DeleteInstance):
            return self._remove(command.group, (command.member_id,), None, topics)  # type: ignore[attr-defined]
        if isinstance(command, SubscribeInstance):
            # Unsubscribing also ends a manual assignment (Kafka's unsubscribe() clears assign()).
            if command.subscription is not None and self._manual_of(command.group, command.member_id):
                raise ConsumerIllegalState("subscription to topics, partitions and pattern are mutually exclusive: "
                                           "this instance is assigned partitions by hand")
            return self._retarget(command.group, command.member_id, command.subscription,  # type: ignore[attr-defined]
                                  None if command.subscription is not None else frozenset(), topics)
        if isinstance(command, AssignInstance):
            return self._assign(command, topics)
        assert isinstance(command, InstancePositions)
        return self._positions(command, instance)

    def _assign(self, command: AssignInstance, topics: TopicsView) -> Any:
        group = self.groups[command.group]
        if group.members[command.member_id].subscription is not None:
            raise ConsumerIllegalState("subscription to topics, partitions and pattern are mutually exclusive: "
                                       "this instance is subscribed")
        wanted = frozenset(command.partitions)
        for other_id, other in sorted(group.members.items()):
            if other_id != command.member_id and other.manual and not wanted.isdisjoint(other.manual):
                topic, partition = sorted(wanted & other.manual)[0]
                raise ConsumerIllegalState(f"{topic}/{partition} is assigned by hand to another instance "
                                           "of this group")
        return self._retarget(command.group, command.member_id, None, wanted, topics)  # type: ignore[attr-defined]

    def _positions(self, command: InstancePositions, instance: Instance) -> dict[str, Any]:
        member = self.groups[command.group].members[command.member_id]
        held = member.assigned | member.revoking
        if command.seek:  # all or nothing: check every partition before moving any
            for topic, partition, _ in command.positions:
                if (topic, partition) not in held:
                    raise ConsumerIllegalState(f"no current assignment for partition {topic}/{partition}")
        for topic, partition, offset in command.positions:
            if (topic, partition) in held:
                instance.positions[(topic, partition)] = offset
        return {"positions": positions_json(instance.positions)}

    # ------------------------------------------------------------------ helpers over the member half

    def _prune_positions(self, name: str, member: Any) -> None:
        """Positions only for what the member holds (called whenever its holdings may move)."""
        instance = self.instances.get(name, {}).get(member.member_id)
        if instance is None or not instance.positions:
            return
        held = member.assigned | member.revoking
        for tp in [tp for tp in instance.positions if tp not in held]:
            del instance.positions[tp]

    def _drop_instances(self, name: str, member_ids: list[str]) -> None:
        by_id = self.instances.get(name)
        if by_id is None:
            return
        for member_id in member_ids:
            by_id.pop(member_id, None)
        if not by_id:
            del self.instances[name]

    def _manual_of(self, name: str, member_id: str) -> frozenset[TopicPartition]:
        group = self.groups.get(name)
        member = group.members.get(member_id) if group is not None else None
        if member is None or member.manual is None:
            return frozenset()
        return member.manual  # type: ignore[no-any-return]

    def _mode(self, name: str, member_id: str) -> str:
        member = self.groups[name].members[member_id]
        return "subscribed" if member.subscription is not None else "assigned" if member.manual else "none"

    def _subscription_json(self, name: str, member_id: str) -> dict[str, Any] | None:
        subscription: Subscription | None = self.groups[name].members[member_id].subscription
        if subscription is None:
            return None
        return {"topics": list(subscription.topics), "topic_pattern": subscription.pattern}

    def session_timeout_ms(self, name: str, member_id: str) -> int:
        """The member's session: its instance's timeout, else its group's."""
        instance = self.instances.get(name, {}).get(member_id)
        if instance is not None:
            return instance.config.instance_timeout_ms
        return int(self.groups[name].session_timeout_ms)

    def held(self, name: str, member_id: str) -> tuple[TopicPartition, ...]:
        """What the member holds now (assigned or revoking): what an instance call may release."""
        group = self.groups.get(name)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            return ()
        return tuple(sorted(member.assigned | member.revoking))
