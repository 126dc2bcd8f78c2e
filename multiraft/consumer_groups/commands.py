"""Commands of the consumer group state machine, their limits and their encoding.

Each command is a frozen dataclass that checks its own shape on construction, so the
HTTP edge, the coordinator and the decoder of a committed entry share one rule set.
Checks against the group's state (is the member known, is its epoch current) live in
`GroupsState.apply` (multiraft/consumer_groups/state.py), which every replica runs
alike: no clock and no randomness enter apply. A member id is drawn by the node that
serves the join (or given by the client, as KIP-848's client-generated ids) and
travels in the entry; a session expiry is decided by the coordinator's clock and
travels as the list of members it expires.

Encoding: the prefix `consumer-group:` then one JSON object with a version `v`, a
`type` tag and exactly the command's fields. The prefix tells group 0's machine that
an entry is a group command and not a catalog command (multiraft/node/machines.py)
without parsing it twice. Decoding refuses unknown versions, types, missing or extra
fields and wrong types. Never pickle: a payload is data from the network.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from multiraft.errors import InvalidRequest

COMMAND_PREFIX = b"consumer-group:"
COMMAND_VERSION = 1

# Names: the group name rule of committed offsets (multiraft/state/consumer_offsets.py).
GROUP_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
TOPIC_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# A glob over topic names: `*` any run, `?` one character (see topics.py for why not a regex).
TOPIC_PATTERN_PATTERN = re.compile(r"[a-zA-Z0-9._*?-]{1,249}")
# Kafka's client-generated member ids are 22-character base64 UUIDs; 64 leaves room for hex.
MEMBER_ID_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")

# Limits: every input and every piece of state is bounded (STYLE.md section 10).
# Groups with members held in group 0 (Kafka bounds groups by broker memory only; 1,000
# live groups of 100 members is far beyond what one raftlog cluster serves today).
GROUPS_MAX = 1_000
# Members of one group (Kafka's group.consumer.max.size is unbounded by default; a
# consumer beyond the partition count would get nothing anyway).
MEMBERS_PER_GROUP_MAX = 100
# Topics one member subscribes to by name.
SUBSCRIBED_TOPICS_MAX = 100
# Partitions one group's subscriptions may resolve to (one topic holds at most 10,000):
# a pattern matching more is cut at this many, in topic-name order.
GROUP_PARTITIONS_MAX = 10_000
# Partitions all groups' subscriptions resolve to, in all: a join past it is refused
# (TOO_MANY_CONSUMER_GROUPS). The state holds each twice (target and current), so this
# bounds group 0's group state near 2 million partitions, a snapshot of tens of MB,
# where the per-group limits alone would allow 10 million (1,000 x 10,000). Kafka has
# no such bound; it keeps groups in the memory of many brokers, we in one group.
GROUP_STATE_PARTITIONS_MAX = 1_000_000
# Partitions a member may list as owned in one heartbeat.
OWNED_PARTITIONS_MAX = GROUP_PARTITIONS_MAX
# Members one expiry entry removes (the coordinator sends the rest in later entries).
EXPIRE_MEMBERS_PER_ENTRY_MAX = MEMBERS_PER_GROUP_MAX
PARTITION_MAX = 9_999  # partitions of a topic are 0..9,999 (metadata/commands.py PARTITIONS_MAX)
EPOCH_MAX = 2**31 - 1

# Session timeout: Kafka's group.consumer.session.timeout.ms defaults to 45 s (allowed
# 45-60 s by default); tests need shorter ones, so any group may choose 0.5 s to 30 min.
SESSION_TIMEOUT_MS_DEFAULT = 45_000
SESSION_TIMEOUT_MS_MIN = 500
SESSION_TIMEOUT_MS_MAX = 1_800_000
# Rebalance timeout: how long a member may take to give back revoked partitions before
# the coordinator removes it (Kafka: the member's max.poll.interval.ms, 5 minutes).
REBALANCE_TIMEOUT_MS_DEFAULT = 300_000
REBALANCE_TIMEOUT_MS_MIN = 500
REBALANCE_TIMEOUT_MS_MAX = 1_800_000
ASSIGNORS = ("uniform", "range")  # KIP-848's two server-side assignors; uniform is the default
ASSIGNOR_DEFAULT = "uniform"

TopicPartition = tuple[str, int]


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_group(group: object) -> None:
    if not isinstance(group, str) or not GROUP_NAME_PATTERN.fullmatch(group):
        raise InvalidRequest(f"consumer group name must match {GROUP_NAME_PATTERN.pattern}")


def check_member_id(member_id: object) -> None:
    if not isinstance(member_id, str) or not MEMBER_ID_PATTERN.fullmatch(member_id):
        raise InvalidRequest(f"member_id must match {MEMBER_ID_PATTERN.pattern}")


def check_epoch(epoch: object) -> None:
    if not is_int(epoch) or not 0 <= epoch <= EPOCH_MAX:  # type: ignore[operator]
        raise InvalidRequest(f"member_epoch must be 0..{EPOCH_MAX}")


def _check_range(value: object, name: str, low: int, high: int) -> None:
    if not is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise InvalidRequest(f"{name} must be an integer in [{low}, {high}]")


def check_partitions(partitions: object, name: str, count_max: int) -> None:
    """A tuple of distinct (topic, partition) pairs, at most `count_max`."""
    if not isinstance(partitions, tuple) or len(partitions) > count_max:
        raise InvalidRequest(f"{name} lists at most {count_max} partitions")
    for item in partitions:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidRequest(f"{name} holds (topic, partition) pairs")
        topic, partition = item
        if not isinstance(topic, str) or not TOPIC_NAME_PATTERN.fullmatch(topic):
            raise InvalidRequest(f"{name}: invalid topic name {str(topic)[:60]!r}")
        _check_range(partition, f"{name}: partition", 0, PARTITION_MAX)
    if len(set(partitions)) != len(partitions):
        raise InvalidRequest(f"{name} lists each partition once")


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """Topics by name, or a glob over topic names (`pattern`); exactly one of the two."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topics, tuple) or len(self.topics) > SUBSCRIBED_TOPICS_MAX:
            raise InvalidRequest(f"a subscription names at most {SUBSCRIBED_TOPICS_MAX} topics")
        for topic in self.topics:
            if not isinstance(topic, str) or not TOPIC_NAME_PATTERN.fullmatch(topic):
                raise InvalidRequest(f"subscribed topic names must match {TOPIC_NAME_PATTERN.pattern}")
        if list(self.topics) != sorted(set(self.topics)):
            raise InvalidRequest("subscribed topics are sorted and distinct")
        if self.pattern is not None and (
                not isinstance(self.pattern, str) or not TOPIC_PATTERN_PATTERN.fullmatch(self.pattern)):
            raise InvalidRequest(f"topic_pattern must match {TOPIC_PATTERN_PATTERN.pattern} (a glob)")
        if (self.pattern is None) == (not self.topics):
            raise InvalidRequest("a subscription names topics or a topic_pattern (exactly one)")


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroup:
    """A member joins `group` (creating it when absent), or a known member id joins again
    with its subscription (an idempotent retry, or a changed subscription).

    `session_timeout_ms` and `assignor` are the group's settings: taken when the join
    creates the group, refused when they differ from a group that has members; None
    means "whatever the group has" (the defaults for a new group)."""

    group: str
    member_id: str
    subscription: Subscription
    rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS_DEFAULT
    session_timeout_ms: int | None = None
    assignor: str | None = None

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        if not isinstance(self.subscription, Subscription):
            raise InvalidRequest("a join carries a subscription")
        _check_range(self.rebalance_timeout_ms, "rebalance_timeout_ms", REBALANCE_TIMEOUT_MS_MIN,
                     REBALANCE_TIMEOUT_MS_MAX)
        if self.session_timeout_ms is not None:
            _check_range(self.session_timeout_ms, "session_timeout_ms", SESSION_TIMEOUT_MS_MIN,
                         SESSION_TIMEOUT_MS_MAX)
        if self.assignor is not None and self.assignor not in ASSIGNORS:
            raise InvalidRequest(f"assignor must be one of {', '.join(ASSIGNORS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """A member reports what it owns; apply reconciles it toward its target assignment.

    `owned` None: the member did not say (a fetch keeps it alive without acknowledging
    anything). Only heartbeats that change something are proposed: the coordinator
    answers the others from its applied state (multiraft/node/group_coordinator.py)."""

    group: str
    member_id: str
    member_epoch: int
    owned: tuple[TopicPartition, ...] | None = None

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        check_epoch(self.member_epoch)
        if self.owned is not None:
            check_partitions(self.owned, "owned", OWNED_PARTITIONS_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroup:
    """A member leaves: its partitions are free for the others at once."""

    group: str
    member_id: str
    member_epoch: int

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        check_epoch(self.member_epoch)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireMembers:
    """The coordinator found these members silent past the group's session timeout (or
    holding revoked partitions past their rebalance timeout), by its own clock; apply
    removes those still present. `reason` is kept for the log line only."""

    group: str
    member_ids: tuple[str, ...]
    reason: str = "session_timeout"

    def __post_init__(self) -> None:
        check_group(self.group)
        if not isinstance(self.member_ids, tuple) or not 1 <= len(self.member_ids) <= EXPIRE_MEMBERS_PER_ENTRY_MAX:
            raise InvalidRequest(f"an expiry names 1..{EXPIRE_MEMBERS_PER_ENTRY_MAX} members")
        for member_id in self.member_ids:
            check_member_id(member_id)
        if len(set(self.member_ids)) != len(self.member_ids):
            raise InvalidRequest("an expiry names each member once")
        if self.reason not in ("session_timeout", "rebalance_timeout"):
            raise InvalidRequest("an expiry's reason is session_timeout or rebalance_timeout")


# Confluent REST v2 consumer instances (multiraft/consumer_groups/instances.py): each is a
# member of its group (member id = instance id) with settings and fetch positions.
INSTANCE_FORMATS = ("json", "binary")
INSTANCE_RESETS = ("earliest", "latest")
# consumer.instance.timeout.ms: Confluent's default is 5 minutes; the bounds are the
# session timeout's, since it is the member's session.
INSTANCE_TIMEOUT_MS_DEFAULT = 300_000
# consumer.request.timeout.ms: how long a records GET waits for data (Confluent: 1 s);
# at most the long-poll bound of every read (partition_ops.WAIT_MS_MAX).
REQUEST_TIMEOUT_MS_DEFAULT = 1_000
REQUEST_TIMEOUT_MS_MAX = 30_000
# Instances in the cluster: each holds up to a group's partitions of positions, so
# the bound keeps group 0's snapshot in the tens of MB (Confluent bounds them by the
# proxy's memory only).
INSTANCES_MAX = 10_000
# Instances one principal (token name) may hold: a twentieth of the cluster's bound, and
# half its groups, so one token cannot take all of either (Confluent has no such bound;
# its proxy's memory is its only one).
INSTANCES_PER_OWNER_MAX = 500
# Who created an instance, with tokens on: a token's name (metadata/patterns.py's rule,
# restated here: this package imports nothing of metadata/).
OWNER_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,64}")
POSITION_OFFSET_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateInstance:
    """A consumer instance joins `group` as a member that reads nothing yet."""

    group: str
    member_id: str  # the instance id: the name the client gave, or one drawn by the node
    format: str = "binary"
    auto_offset_reset: str = "latest"
    auto_commit: bool = True
    request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT
    instance_timeout_ms: int = INSTANCE_TIMEOUT_MS_DEFAULT
    # The principal that created it (None with tokens off, or made before owners were
    # kept): only it, or an admin, may drive it. Left out of the entry when None, so
    # entries and snapshots without owners keep their bytes.
    owner: str | None = None

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        if self.owner is not None and (not isinstance(self.owner, str) or not OWNER_PATTERN.fullmatch(self.owner)):
            raise InvalidRequest(f"an instance's owner must match {OWNER_PATTERN.pattern}")
        if self.format not in INSTANCE_FORMATS:
            raise InvalidRequest(f"format must be one of {', '.join(INSTANCE_FORMATS)}")
        if self.auto_offset_reset not in INSTANCE_RESETS:
            raise InvalidRequest(f"auto.offset.reset must be one of {', '.join(INSTANCE_RESETS)}")
        if not isinstance(self.auto_commit, bool):
            raise InvalidRequest("auto.commit.enable is true or false")
        _check_range(self.request_timeout_ms, "consumer.request.timeout.ms", 0, REQUEST_TIMEOUT_MS_MAX)
        _check_range(self.instance_timeout_ms, "consumer.instance.timeout.ms", SESSION_TIMEOUT_MS_MIN,
                     SESSION_TIMEOUT_MS_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteInstance:
    """The instance goes, and its member with it: its partitions are free at once."""

    group: str
    member_id: str

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeInstance:
    """Subscribe (replacing any subscription), or unsubscribe with `subscription` None.
    Takes effect at once: what the instance no longer reads is free for the others."""

    group: str
    member_id: str
    subscription: Subscription | None

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        if self.subscription is not None and not isinstance(self.subscription, Subscription):
            raise InvalidRequest("a subscribe carries a subscription")


@dataclass(frozen=True, slots=True, kw_only=True)
class AssignInstance:
    """Manual assignment (Kafka's assign()): these partitions, outside the assignor."""

    group: str
    member_id: str
    partitions: tuple[TopicPartition, ...]

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        check_partitions(self.partitions, "partitions", GROUP_PARTITIONS_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class InstancePositions:
    """Where the instance reads next, per partition. `seek`: the client's own seek, refused
    for a partition it does not hold; else the positions a records GET moved to, kept
    only for the partitions it still holds."""

    group: str
    member_id: str
    positions: tuple[tuple[str, int, int], ...]
    seek: bool = False

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member_id(self.member_id)
        if not isinstance(self.positions, tuple) or not isinstance(self.seek, bool):
            raise InvalidRequest("positions is a list of (topic, partition, offset)")
        for item in self.positions:
            if not isinstance(item, tuple) or len(item) != 3:
                raise InvalidRequest("positions is a list of (topic, partition, offset)")
            _check_range(item[2], "offset", 0, POSITION_OFFSET_MAX)
        check_partitions(tuple((t, p) for t, p, _ in self.positions), "positions", GROUP_PARTITIONS_MAX)


InstanceCommand = CreateInstance | DeleteInstance | SubscribeInstance | AssignInstance | InstancePositions
# Instance commands that free partitions at once (the coordinator fences their commits first).
INSTANCE_RELEASING = (DeleteInstance, SubscribeInstance, AssignInstance)

GroupCommand = JoinGroup | Heartbeat | LeaveGroup | ExpireMembers | InstanceCommand

_TYPES: dict[str, type] = {"join": JoinGroup, "heartbeat": Heartbeat, "leave": LeaveGroup, "expire": ExpireMembers,
                           "instance_create": CreateInstance, "instance_delete": DeleteInstance,
                           "instance_subscribe": SubscribeInstance, "instance_assign": AssignInstance,
                           "instance_positions": InstancePositions}
_TAGS = {cls: tag for tag, cls in _TYPES.items()}
# Fields an entry may leave out (added later; None when absent).
_OPTIONAL: dict[type, frozenset[str]] = {CreateInstance: frozenset({"owner"})}


def is_group_command(payload: bytes) -> bool:
    return payload.startswith(COMMAND_PREFIX)


def encode_group_command(command: GroupCommand) -> bytes:
    document: dict[str, Any] = {"v": COMMAND_VERSION, "type": _TAGS[type(command)]}
    for field in fields(command):
        value = getattr(command, field.name)
        if field.name in _OPTIONAL.get(type(command), ()) and value is None:
            continue  # as entries written before the field existed
        if isinstance(value, Subscription):
            value = {"topics": list(value.topics), "pattern": value.pattern}
        elif field.name in ("owned", "partitions", "positions") and value is not None:
            value = [list(item) for item in value]
        elif isinstance(value, tuple):
            value = list(value)
        document[field.name] = value
    return COMMAND_PREFIX + json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode_group_command(payload: bytes) -> GroupCommand:
    """Decode and validate one group command. Raises `InvalidRequest` on anything unexpected."""
    if not is_group_command(payload):
        raise InvalidRequest("not a consumer group command")
    try:
        document = json.loads(payload[len(COMMAND_PREFIX):])
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidRequest(f"consumer group command is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("v") != COMMAND_VERSION:
        raise InvalidRequest("consumer group command has an unknown version")
    tag = document.get("type")
    cls = _TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise InvalidRequest(f"unknown consumer group command {str(tag)[:40]!r}")
    arguments = {key: value for key, value in document.items() if key not in ("v", "type")}
    names = {field.name for field in fields(cls)}
    if not names - _OPTIONAL.get(cls, frozenset()) <= set(arguments) <= names:
        raise InvalidRequest(f"consumer group command {tag} has fields {sorted(names)}")
    if cls is JoinGroup or (cls is SubscribeInstance and arguments["subscription"] is not None):
        arguments["subscription"] = decode_subscription(arguments["subscription"])
    if cls is AssignInstance:
        arguments["partitions"] = decode_partitions(arguments["partitions"], "partitions")
    if cls is InstancePositions and isinstance(arguments["positions"], list):
        arguments["positions"] = tuple(tuple(i) if isinstance(i, list) else i for i in arguments["positions"])
    if cls is Heartbeat and arguments["owned"] is not None:
        arguments["owned"] = decode_partitions(arguments["owned"], "owned")
    if cls is ExpireMembers and isinstance(arguments["member_ids"], list):
        arguments["member_ids"] = tuple(arguments["member_ids"])
    return cls(**arguments)  # type: ignore[no-any-return]


def decode_subscription(value: object) -> Subscription:
    if not isinstance(value, dict) or set(value) != {"topics", "pattern"} or not isinstance(value["topics"], list):
        raise InvalidRequest("a subscription is {\"topics\": [...], \"pattern\": null or a glob}")
    return Subscription(topics=tuple(value["topics"]), pattern=value["pattern"])


def decode_partitions(value: object, name: str) -> tuple[TopicPartition, ...]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{name} is a list of [topic, partition] pairs")
    pairs = tuple(tuple(item) if isinstance(item, list) else item for item in value)
    check_partitions(pairs, name, OWNED_PARTITIONS_MAX)
    return pairs  # type: ignore[return-value]
