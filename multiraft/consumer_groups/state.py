"""The consumer group state machine (KIP-848 semantics), pure and deterministic.

Held beside the catalog in group 0 (docs/node.md, "Consumer groups"): group 0's
machine hands every group command to `GroupsState.apply` with a view of the catalog
as of the same entry, so a subscription resolves alike on every replica.

A group has an epoch that moves on every change of its members, their subscriptions
or the topics they resolve to; each move recomputes the *target assignment*
(assignors.py) and stamps it with that epoch (`assignment_epoch`). Each member has
its own epoch, its *current* assignment (`assigned`, the partitions it may read
and commit) and the partitions it must give back (`revoking`). A member moves
toward its target only when it heartbeats (`_reconcile`):

1. while it holds partitions its target no longer has, they move to `revoking`: it
   must stop reading them (it may still commit them) and say so by a heartbeat whose
   `owned` lists none of them. Its epoch moves to the target's with the revocation
   (KIP-848 keeps it until the partitions are given back): only a heartbeat carrying
   that epoch acknowledges, so one the member sent before it heard of the revocation,
   arriving late with the previous epoch (still accepted), cannot free partitions
   the member is still reading;
2. then it takes the target's epoch and every target partition that no other member
   holds (`assigned` or `revoking`); the rest it gets at a later heartbeat, once
   their old owners gave them back.

Invariant (asserted after every apply, property-tested): no partition is in two
members' `assigned | revoking` at once, so never two owners of one partition in any
group epoch. A member whose epoch is neither its current nor its previous one is
fenced (`FencedMemberEpoch`); an unknown one must join again (`UnknownMemberId`).

Apply never raises for a refused command: it returns the error inside its result,
because a refused command is still a committed entry every replica applies alike
(the catalog does the same). Apply reads no clock: liveness (last seen) lives in the
coordinator's memory (sessions.py) and reaches the log only as `ExpireMembers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from multiraft.consumer_groups.assignors import assign
from multiraft.consumer_groups.commands import (
    ASSIGNOR_DEFAULT,
    GROUP_STATE_PARTITIONS_MAX,
    GROUPS_MAX,
    MEMBERS_PER_GROUP_MAX,
    SESSION_TIMEOUT_MS_DEFAULT,
    CreateInstance,
    ExpireMembers,
    GroupCommand,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    Subscription,
    TopicPartition,
)
from multiraft.consumer_groups.instances import InstancesMixin
from multiraft.consumer_groups.topics import (
    PatternMatches,
    TopicsView,
    subscribed_topics,
    topic_partitions,
)
from multiraft.errors import (
    FencedMemberEpoch,
    GroupMaxSizeReached,
    InconsistentGroupConfig,
    PartitionNotAssigned,
    TooManyConsumerGroups,
    UnknownMemberId,
)
from raftlog.errors import ClientError

NO_PARTITIONS: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    member_id: str
    epoch: int  # the group epoch of the target this member reconciled to last
    previous_epoch: int  # accepted too, so a heartbeat whose answer was lost is not fenced
    subscription: Subscription | None  # None: a consumer instance not subscribed (instances.py)
    rebalance_timeout_ms: int
    assigned: frozenset[TopicPartition]  # owned now: read and commit
    revoking: frozenset[TopicPartition]  # to give back (may still commit); disjoint from assigned
    # A consumer instance's manual assignment (its whole target, outside the assignor);
    # None for every subscribed member. Set only when `subscription` is None.
    manual: frozenset[TopicPartition] | None = None


@dataclass(slots=True, kw_only=True)
class Group:
    name: str
    epoch: int  # moves on every change of members, subscriptions or resolved topics
    assignment_epoch: int  # the epoch `target` was computed at (== epoch after every apply)
    session_timeout_ms: int
    assignor: str
    members: dict[str, Member]
    target: dict[str, frozenset[TopicPartition]]
    counts: dict[str, int]  # the topics (and partition counts) `target` was computed over
    # What the subscriptions resolve to, for (topics version, group epoch): the epoch moves
    # on every change of members or subscriptions, the version on every catalog command.
    # A cache of `_resolve`, in memory only (never in a snapshot, never compared).
    resolved: tuple[int, int, dict[str, int]] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberView:
    """What a member is told after a join, heartbeat or fetch."""

    group: str
    member_id: str
    member_epoch: int
    group_epoch: int
    session_timeout_ms: int
    assigned: tuple[TopicPartition, ...]
    revoking: tuple[TopicPartition, ...]
    pending: tuple[TopicPartition, ...]  # in its target, still held by another member
    state: str  # stable | revoking | assigning

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "member_id": self.member_id, "member_epoch": self.member_epoch,
                "group_epoch": self.group_epoch, "session_timeout_ms": self.session_timeout_ms,
                "state": self.state, "assignment": partitions_json(self.assigned),
                "revoking": partitions_json(self.revoking), "pending": partitions_json(self.pending)}


@dataclass(frozen=True, slots=True)
class GroupResult:
    """What applying one group command gave (the catalog's `CatalogResult` shape)."""

    index: int
    value: Any = None
    error: ClientError | None = None


def partitions_json(partitions: tuple[TopicPartition, ...] | frozenset[TopicPartition]) -> list[dict[str, Any]]:
    """[{"topic", "partitions": [...]}] by topic, sorted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": topic, "partitions": parts} for topic, parts in by_topic.items()]


class GroupsState(InstancesMixin):
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.instances = {}  # Confluent consumer instances, by group then id (instances.py)
        self._matches = PatternMatches()  # a cache: results are the same without it

    # ------------------------------------------------------------------ apply

    def apply(self, index: int, command: GroupCommand, topics: TopicsView) -> GroupResult:
        """Apply one committed command. Deterministic; refusals come back as the result's error."""
        try:
            if isinstance(command, JoinGroup):
                value: Any = self._join(command, topics)
            elif isinstance(command, Heartbeat):
                value = self._heartbeat(command, topics)
            elif isinstance(command, LeaveGroup):
                value = self._remove(command.group, (command.member_id,), command.member_epoch, topics)
            elif not isinstance(command, ExpireMembers):
                value = self._apply_instance(command, topics)
            else:
                assert isinstance(command, ExpireMembers)
                value = self._remove(command.group, command.member_ids, None, topics)
        except ClientError as error:
            return GroupResult(index, error=error)
        group = self.groups.get(command.group)
        if group is not None:
            self._check_owners(group)
        return GroupResult(index, value=value)

    # The two steps the chaos runner's group-early-assign control replaces (multiraft/node/
    # faults.py GroupsStateGivingEarly); production uses these module functions.
    def _reconcile(self, group: Group, member: Member) -> Member:
        return reconcile(group, member)

    def _check_owners(self, group: Group) -> None:
        check_exclusive(group)

    def _join(self, command: JoinGroup, topics: TopicsView) -> MemberView:
        group = self.groups.get(command.group)
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                raise TooManyConsumerGroups(f"the cluster holds its maximum of {GROUPS_MAX} consumer groups")
            group = Group(name=command.group, epoch=0, assignment_epoch=0,
                          session_timeout_ms=command.session_timeout_ms or SESSION_TIMEOUT_MS_DEFAULT,
                          assignor=command.assignor or ASSIGNOR_DEFAULT, members={}, target={}, counts={})
        else:
            _check_settings(group, command)
        if command.member_id in self.instances.get(command.group, {}):
            raise InconsistentGroupConfig(f"{command.member_id!r} is a consumer instance of group "
                                          f"{command.group!r}: use the /consumers routes")
        member = group.members.get(command.member_id)
        if member is None:
            if len(group.members) >= MEMBERS_PER_GROUP_MAX:
                raise GroupMaxSizeReached(f"group {group.name!r} has {MEMBERS_PER_GROUP_MAX} members")
            member = Member(member_id=command.member_id, epoch=0, previous_epoch=0,
                            subscription=command.subscription, rebalance_timeout_ms=command.rebalance_timeout_ms,
                            assigned=NO_PARTITIONS, revoking=NO_PARTITIONS)
        elif member.subscription == command.subscription \
                and member.rebalance_timeout_ms == command.rebalance_timeout_ms:
            return self._touch(group, member, topics)  # a retried join: nothing changes
        else:
            member = replace(member, subscription=command.subscription,
                             rebalance_timeout_ms=command.rebalance_timeout_ms)
        self._check_total(group, member, topics)
        self.groups[group.name] = group
        group.members[member.member_id] = member
        _bump(group, topics, self._matches)
        return self._touch(group, group.members[member.member_id], topics)

    def _check_total(self, group: Group, member: Member, topics: TopicsView) -> None:
        """Refuse a join that would take the partitions all groups resolve to past
        GROUP_STATE_PARTITIONS_MAX (it only grows what it resolves to; topics growing
        under a pattern are not refused, they are the catalog's)."""
        names = {t for m_id, m in group.members.items() if m_id != member.member_id
                 for t in _member_topics(m, topics, self._matches)}
        names.update(_member_topics(member, topics, self._matches))
        after = sum(topic_partitions(names, topics).values())
        before = sum(group.counts.values()) if group.name in self.groups else 0
        if after <= before:
            return
        total = sum(sum(g.counts.values()) for g in self.groups.values())
        if total - before + after > GROUP_STATE_PARTITIONS_MAX:
            raise TooManyConsumerGroups(
                f"consumer groups resolve to {total} partitions in all; this join would take them to "
                f"{total - before + after}, past the cluster's bound of {GROUP_STATE_PARTITIONS_MAX}")

    def _heartbeat(self, command: Heartbeat, topics: TopicsView) -> MemberView:
        group, member = self.member(command.group, command.member_id, command.member_epoch)
        if _acknowledges(command, member):
            member = replace(member, revoking=NO_PARTITIONS)  # given back: free for their new owners
            group.members[member.member_id] = member
        return self._touch(group, member, topics)

    def _touch(self, group: Group, member: Member, topics: TopicsView) -> MemberView:
        if _resolve(group, topics, self._matches) != group.counts:
            _bump(group, topics, self._matches)  # a subscribed topic was created, deleted or grew
        member = self._reconcile(group, group.members[member.member_id])
        group.members[member.member_id] = member
        self._prune_positions(group.name, member)
        return self._view_of(group, member)

    def _add_instance_member(self, command: CreateInstance, topics: TopicsView) -> MemberView:
        """A consumer instance's member: neither subscribed nor assigned yet."""
        group = self.groups.get(command.group)
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                raise TooManyConsumerGroups(f"the cluster holds its maximum of {GROUPS_MAX} consumer groups")
            group = Group(name=command.group, epoch=0, assignment_epoch=0, session_timeout_ms=SESSION_TIMEOUT_MS_DEFAULT,
                          assignor=ASSIGNOR_DEFAULT, members={}, target={}, counts={})
        elif command.member_id in group.members:
            raise InconsistentGroupConfig(f"group {group.name!r} has a member {command.member_id!r} already")
        if len(group.members) >= MEMBERS_PER_GROUP_MAX:
            raise GroupMaxSizeReached(f"group {group.name!r} has {MEMBERS_PER_GROUP_MAX} members")
        member = Member(member_id=command.member_id, epoch=0, previous_epoch=0, subscription=None,
                        rebalance_timeout_ms=command.instance_timeout_ms, assigned=NO_PARTITIONS,
                        revoking=NO_PARTITIONS, manual=NO_PARTITIONS)
        self.groups[group.name] = group
        group.members[member.member_id] = member
        _bump(group, topics, self._matches)
        return self._touch(group, member, topics)

    def _retarget(self, name: str, member_id: str, subscription: Subscription | None,
                  manual: frozenset[TopicPartition] | None, topics: TopicsView) -> MemberView:
        """An instance subscribes, unsubscribes or assigns: at once (instances.py), so what
        it no longer targets is released here, not revoked."""
        group = self.groups[name]
        member = replace(group.members[member_id], subscription=subscription, manual=manual)
        self._check_total(group, member, topics)
        group.members[member_id] = member
        _bump(group, topics, self._matches)
        target = group.target.get(member_id, NO_PARTITIONS)
        group.members[member_id] = replace(member, assigned=member.assigned & target, revoking=NO_PARTITIONS)
        return self._touch(group, group.members[member_id], topics)

    def _view_of(self, group: Group, member: Member) -> MemberView:
        """The member's view with its own session (an instance's is its instance timeout)."""
        return view(group, member, self.session_timeout_ms(group.name, member.member_id))

    def _member_view(self, name: str, member_id: str) -> MemberView:
        group = self.groups[name]
        return self._view_of(group, group.members[member_id])

    def _remove(self, name: str, member_ids: tuple[str, ...], epoch: int | None, topics: TopicsView) -> int:
        """Remove members (a leave checks the one member's epoch; an expiry none). How many went."""
        group = self.groups.get(name)
        if epoch is not None:
            self.member(name, member_ids[0], epoch)
        if group is None:
            return 0
        removed = [m for m in member_ids if group.members.pop(m, None) is not None]
        self._drop_instances(name, removed)  # an instance goes with its member
        if not group.members:
            del self.groups[name]  # an empty group keeps nothing here (its offsets stay in the partitions)
        elif removed:
            _bump(group, topics, self._matches)
            for member_id in removed:
                group.target.pop(member_id, None)
        return len(removed)

    def partitions_added(self, topics: TopicsView) -> list[str]:
        """A topic gained partitions (the catalog's CreatePartitions, or GrowMirrorTopic when a
        mirror follows its source; applied at the same entry on every replica): every group whose subscriptions now resolve to other
        counts moves to a new epoch and target at once, so the new partitions are assigned
        (and a describe shows them) without waiting for a member's heartbeat. Returns the
        groups bumped, sorted."""
        bumped = []
        for name, group in sorted(self.groups.items()):
            if _resolve(group, topics, self._matches) != group.counts:
                _bump(group, topics, self._matches)
                bumped.append(name)
        return bumped

    # ------------------------------------------------------------------ reads (the coordinator's)

    def member(self, name: str, member_id: str, epoch: int) -> tuple[Group, Member]:
        """The group and member a call names, or the typed error that fences it."""
        group = self.groups.get(name)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise UnknownMemberId(f"group {name!r} has no member {member_id!r}; join again")
        if epoch not in (member.epoch, member.previous_epoch):
            raise FencedMemberEpoch(f"member {member_id!r} is at epoch {member.epoch}, not {epoch}; join again")
        return group, member

    def plan_heartbeat(self, command: Heartbeat, topics: TopicsView) -> tuple[bool, MemberView]:
        """Whether the heartbeat changes the state (then it must be proposed), and the
        member's view if it does not. Raises the error that fences the member."""
        group, member = self.member(command.group, command.member_id, command.member_epoch)
        if _acknowledges(command, member):
            return True, self._view_of(group, member)
        if _resolve(group, topics, self._matches) != group.counts:
            return True, self._view_of(group, member)
        if self._reconcile(group, member) != member:
            return True, self._view_of(group, member)
        return False, self._view_of(group, member)

    def check_commit(self, name: str, member_id: str, epoch: int, partitions: list[TopicPartition]) -> None:
        """A member's commit: it must be current and hold every partition (assigned or revoking)."""
        _, member = self.member(name, member_id, epoch)
        for tp in partitions:
            if tp not in member.assigned and tp not in member.revoking:
                raise PartitionNotAssigned(f"member {member_id!r} does not own {tp[0]}/{tp[1]}")

    def has_members(self, name: str) -> bool:
        group = self.groups.get(name)
        return group is not None and bool(group.members)


def _acknowledges(command: Heartbeat, member: Member) -> bool:
    """The heartbeat gives back what the member was revoking: sent after it heard of the
    revocation (the epoch that came with it) and owning none of those partitions."""
    return command.owned is not None and bool(member.revoking) and command.member_epoch == member.epoch \
        and member.revoking.isdisjoint(command.owned)


def _check_settings(group: Group, command: JoinGroup) -> None:
    if command.session_timeout_ms is not None and command.session_timeout_ms != group.session_timeout_ms:
        raise InconsistentGroupConfig(f"group {group.name!r} has session_timeout_ms {group.session_timeout_ms}")
    if command.assignor is not None and command.assignor != group.assignor:
        raise InconsistentGroupConfig(f"group {group.name!r} uses the {group.assignor} assignor")


def _member_topics(member: Member, topics: TopicsView, matches: PatternMatches) -> tuple[str, ...]:
    """The existing topics a member reads: its subscription's, or those it assigned by hand."""
    if member.subscription is not None:
        return subscribed_topics(member.subscription, topics, matches)
    return tuple(sorted({t for t, _ in member.manual or () if topics.partition_count(t) is not None}))


def _subscriptions(group: Group, topics: TopicsView, matches: PatternMatches) -> dict[str, tuple[str, ...]]:
    return {member_id: _member_topics(m, topics, matches) for member_id, m in sorted(group.members.items())}


def _resolve(group: Group, topics: TopicsView, matches: PatternMatches) -> dict[str, int]:
    """The topics (and partition counts) the group's subscriptions resolve to now."""
    key = (topics.version, group.epoch)
    if group.resolved is not None and key[0] is not None and group.resolved[:2] == key:
        return group.resolved[2]
    names = {t for subscribed in _subscriptions(group, topics, matches).values() for t in subscribed}
    counts = topic_partitions(names, topics)
    if key[0] is not None:
        group.resolved = (key[0], key[1], counts)
    return counts


def _bump(group: Group, topics: TopicsView, matches: PatternMatches) -> None:
    """A new group epoch and the target assignment for it."""
    subscriptions = _subscriptions(group, topics, matches)
    counts = topic_partitions({t for s in subscriptions.values() for t in s}, topics)
    # Members assigned by hand (consumer instances, instances.py) target exactly their
    # partitions; the assignor balances the others over the subscribed members.
    manual = {m_id: frozenset(tp for tp in m.manual if tp[1] < counts.get(tp[0], 0))
              for m_id, m in sorted(group.members.items()) if m.manual is not None}
    automatic = {m_id: s for m_id, s in subscriptions.items() if m_id not in manual}
    automatic_counts = {t: counts[t] for t in sorted({t for s in automatic.values() for t in s}) if t in counts}
    reserved = frozenset().union(*manual.values())
    target = assign(group.assignor, automatic, automatic_counts, group.target, reserved)
    target.update(manual)
    group.epoch += 1
    group.target = target
    group.assignment_epoch = group.epoch
    group.counts = counts


def reconcile(group: Group, member: Member) -> Member:
    """The member one step closer to its target (see the module docstring)."""
    target = group.target.get(member.member_id, NO_PARTITIONS)
    if member.revoking:
        return member  # it has not given them back yet: nothing moves until it does
    revoke = member.assigned - target
    if revoke:  # a new epoch with it, so a heartbeat from before cannot acknowledge (module docstring)
        assert member.epoch < group.assignment_epoch, "a target changes only with a new group epoch"
        return replace(member, assigned=member.assigned & target, revoking=revoke,
                       epoch=group.assignment_epoch, previous_epoch=member.epoch)
    held = _held_by_others(group, member.member_id)
    assigned = member.assigned | frozenset(tp for tp in target if tp not in held)
    if member.epoch == group.assignment_epoch:
        return member if assigned == member.assigned else replace(member, assigned=assigned)
    return replace(member, epoch=group.assignment_epoch, previous_epoch=member.epoch, assigned=assigned)


def _held_by_others(group: Group, member_id: str) -> set[TopicPartition]:
    held: set[TopicPartition] = set()
    for other_id, other in group.members.items():
        if other_id != member_id:
            held |= other.assigned
            held |= other.revoking
    return held


def view(group: Group, member: Member, session_timeout_ms: int | None = None) -> MemberView:
    """`session_timeout_ms`: the member's own session when not the group's (an instance's)."""
    target = group.target.get(member.member_id, NO_PARTITIONS)
    pending = target - member.assigned
    state = "revoking" if member.revoking else "assigning" if pending or member.epoch != group.epoch else "stable"
    return MemberView(group=group.name, member_id=member.member_id, member_epoch=member.epoch,
                      group_epoch=group.epoch, session_timeout_ms=session_timeout_ms or group.session_timeout_ms,
                      assigned=tuple(sorted(member.assigned)), revoking=tuple(sorted(member.revoking)),
                      pending=tuple(sorted(pending)), state=state)


def check_exclusive(group: Group) -> None:
    """Never two owners: no partition in two members' `assigned | revoking`."""
    seen: set[TopicPartition] = set()
    count = 0
    for member in group.members.values():
        assert member.assigned.isdisjoint(member.revoking), "a partition is assigned and revoking at once"
        seen |= member.assigned
        seen |= member.revoking
        count += len(member.assigned) + len(member.revoking)
    assert len(seen) == count, f"group {group.name}: a partition has two owners"


def _stable(group: Group, member: Member) -> bool:
    """`view(group, member).state == "stable"`, without building the view."""
    target = group.target.get(member.member_id, NO_PARTITIONS)
    return not member.revoking and member.epoch == group.epoch and target <= member.assigned


def summary(group: Group) -> dict[str, Any]:
    """A group's line in a list: no per-partition lists (describe has them), and what its
    members subscribe to (the edge shows a token only the groups it may describe)."""
    topics = sorted({t for m in group.members.values() for t in _named_topics(m)})
    patterns = sorted({m.subscription.pattern for m in group.members.values()
                       if m.subscription is not None and m.subscription.pattern is not None})
    stable = all(_stable(group, m) for m in group.members.values())
    return {"group": group.name, "group_epoch": group.epoch, "members": len(group.members),
            "assignor": group.assignor, "state": "stable" if stable else "reconciling",
            "topics": topics, "topic_patterns": patterns}


def describe(group: Group) -> dict[str, Any]:
    """The group as JSON-able data (members sorted by id); last-seen is the coordinator's to add."""
    stable = all(view(group, m).state == "stable" for m in group.members.values())
    return {
        "group": group.name, "state": "stable" if stable else "reconciling", "group_epoch": group.epoch,
        "assignment_epoch": group.assignment_epoch, "assignor": group.assignor,
        "session_timeout_ms": group.session_timeout_ms,
        "topics": [{"topic": t, "partitions": n} for t, n in sorted(group.counts.items())],
        "members": [
            {**view(group, m).as_json(), "subscription": {
                "topics": list(_named_topics(m)),
                "topic_pattern": m.subscription.pattern if m.subscription is not None else None},
             "rebalance_timeout_ms": m.rebalance_timeout_ms,
             "target": partitions_json(group.target.get(m.member_id, NO_PARTITIONS))}
            for _, m in sorted(group.members.items())
        ],
    }


def _named_topics(member: Member) -> tuple[str, ...]:
    """The topic names a member reads by name: its subscription's, or its manual assignment's."""
    if member.subscription is not None:
        return member.subscription.topics
    return tuple(sorted({t for t, _ in member.manual or ()}))
