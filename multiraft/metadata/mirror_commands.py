"""Mirror links and mirror topics in the sink's catalog (issue 24, docs/mirror.md).

A *link* names a source cluster (its HTTP addresses, whether it speaks HTTPS and the
CA certificates trusted for it, an optional bearer token), a topic pattern, a
priority, and what a mirror partition does when the source's retention deleted
offsets it had not copied (`on_source_truncated`); it is running or paused. A
*mirror topic* is a topic of the sink created for a source topic the link's pattern
matched: same partition count and config, each partition starting at the source's log
start offset as it was when the mirror was made (`start_offsets`), read-only until
promoted.

Shape checks live here, as the other commands' do (commands.py): whatever builds a
command gets them. The token is kept as given (the sink must present it to the
source); it is never shown back nor logged: `MirrorLink.__repr__` hides it.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from dataclasses import dataclass, field, replace

from multiraft.errors import InvalidPartitions, InvalidReplicaAssignment, InvalidRequest
from multiraft.metadata.checks import (
    PARTITIONS_MAX,
    REPLICATION_FACTOR_MAX,
    ConfigValue,
    check_config,
    check_node_id,
    check_topic_name,
    is_int,
)
from multiraft.metadata.pem_bundle import PemBundleError, describe_bundle, parse_certificates
from multiraft.metadata.record_filter import (
    RecordFilterSpec,
    check_record_filter,
    describe_record_filter,
    spec_from_json,
)
from raftlog.types import NodeId

LINK_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,64}")
# A topic pattern: topic characters plus the glob's `*` (any run) and `?` (one).
TOPIC_PATTERN_PATTERN = re.compile(r"[a-zA-Z0-9._*?-]{1,249}")
SOURCE_PATTERN = re.compile(r"(?P<host>[a-zA-Z0-9.-]{1,253}|\[[0-9a-fA-F:.]{2,45}\]):(?P<port>[0-9]{1,5})")
SOURCES_MAX = 16
TOKEN_PATTERN = re.compile(r"[\x21-\x7e]{1,512}")  # printable ASCII, no spaces (a bearer token)
MIRROR_LINKS_MAX = 64
OFFSET_MAX = 2**63 - 1
VERIFY_INTERVAL_MIN_S = 10  # a scheduled full sync reads each mirror partition on both sides: not more often
VERIFY_INTERVAL_MAX_S = 30 * 24 * 3600


class Priority(enum.StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Lower is served first."""
        return {"high": 0, "normal": 1, "low": 2}[self.value]


class LinkState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"


class OnSourceTruncated(enum.StrEnum):
    """What a mirror partition does when the source's retention deleted offsets it had not
    copied (docs/mirror.md "The source truncated past a mirror"): `stop` waits, keeping all it has (an operator raises the
    source's retention or changes this); `resync` replaces the partition by a new incarnation
    starting at the source's log start, discarding the mirror's copy (Kafka MirrorMaker 2's
    `auto.offset.reset=earliest`, in spirit: multiraft/node/mirror_truncated.py)."""

    STOP = "stop"
    RESYNC = "resync"


def check_link_name(name: object) -> None:
    if not isinstance(name, str) or not LINK_NAME_PATTERN.fullmatch(name):
        raise InvalidRequest(f"mirror link name must match {LINK_NAME_PATTERN.pattern}")


def check_sources(sources: object) -> tuple[str, ...]:
    if not isinstance(sources, tuple | list) or not 1 <= len(sources) <= SOURCES_MAX:
        raise InvalidRequest(f"sources are 1..{SOURCES_MAX} HOST:PORT addresses")
    for source in sources:
        match = SOURCE_PATTERN.fullmatch(source) if isinstance(source, str) else None
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise InvalidRequest(f"source {source!r} is not HOST:PORT (port 1..65535)")
    if len(set(sources)) != len(sources):
        raise InvalidRequest("a source address is listed twice")
    return tuple(sources)


def check_topic_pattern(pattern: object) -> None:
    if not isinstance(pattern, str) or not TOPIC_PATTERN_PATTERN.fullmatch(pattern):
        raise InvalidRequest(f"topic pattern must match {TOPIC_PATTERN_PATTERN.pattern} (* and ? are globs)")


def check_verify_interval(value: object) -> None:
    if value is not None and (not is_int(value) or not VERIFY_INTERVAL_MIN_S <= value <= VERIFY_INTERVAL_MAX_S):
        raise InvalidRequest(f"verify_interval_s is {VERIFY_INTERVAL_MIN_S}..{VERIFY_INTERVAL_MAX_S} seconds "
                             "(absent: no scheduled full sync)")


def check_on_source_truncated(value: object) -> None:
    if not isinstance(value, str) or value not in OnSourceTruncated.__members__.values():
        raise InvalidRequest("on_source_truncated is stop or resync")


def check_mirror_starts(start_offsets: object, source_groups: object, partitions: int, what: str) -> None:
    """Where a mirror's `partitions` (`CreateMirrorTopic`'s, or `GrowMirrorTopic`'s new ones:
    `what` names them) start: one start offset each, and absent source identities or one
    source group id each."""
    if not isinstance(start_offsets, tuple) or len(start_offsets) != partitions:
        raise InvalidRequest(f"one start offset per {what}")
    if not all(is_int(o) and 0 <= o <= OFFSET_MAX for o in start_offsets):
        raise InvalidRequest("start offsets are 0..2**63-1")
    if source_groups is not None and (
            not isinstance(source_groups, tuple) or len(source_groups) != partitions
            or not all(is_int(g) and 1 <= g <= OFFSET_MAX for g in source_groups)):
        raise InvalidRequest(f"source_groups are one source group id (1..2**63-1) per {what}, or absent")


def check_source_tls(source_tls: object, source_ca: object) -> None:
    """`source_tls` a bool; `source_ca` absent, or a PEM bundle of CA certificates (pem_bundle.py)
    that only an HTTPS link may carry (a CA for a plain HTTP source would be silently unused)."""
    if not isinstance(source_tls, bool):
        raise InvalidRequest("source_tls is true or false")
    if source_ca is None:
        return
    if not isinstance(source_ca, str):
        raise InvalidRequest("source_ca is the PEM text of the CA certificates trusted for the source")
    if not source_tls:
        raise InvalidRequest("source_ca is only for a source that speaks HTTPS: set source_tls too")
    try:
        parse_certificates(source_ca)
    except PemBundleError as error:
        raise InvalidRequest(f"source_ca: {error}") from None


def pattern_matches(pattern: str, topic: str) -> bool:
    """Whether `topic` matches the glob `pattern` (`*` any run, `?` one character; no
    character classes: `[` is no topic character)."""
    return fnmatch.fnmatchcase(topic, pattern)


@dataclass(frozen=True, slots=True)
class MirrorLink:
    """A link as the catalog holds it. `token` is never shown (repr hides it)."""

    name: str
    sources: tuple[str, ...]
    pattern: str
    priority: Priority
    state: LinkState
    token: str | None = field(default=None, repr=False)
    verify_interval_s: int | None = None  # a full sync of each mirror partition this often (None: on demand only)
    source_tls: bool = False  # the source is read over HTTPS, its certificate verified and its name checked
    source_ca: str | None = field(default=None, repr=False)  # PEM CA certificates (None: the system's store)
    on_source_truncated: OnSourceTruncated = OnSourceTruncated.STOP
    # Which records the link copies (record_filter.py; None: all). Fixed at creation.
    record_filter: RecordFilterSpec | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.source_tls else "http"

    def describe(self) -> dict[str, object]:
        """What a client is shown: everything but the token, which is only said to be set, and
        the CA bundle, of which the count and fingerprints of its certificates are shown."""
        return {"name": self.name, "sources": list(self.sources), "topics": self.pattern,
                "priority": self.priority.value, "state": self.state.value,
                "credentials": self.token is not None, "verify_interval_s": self.verify_interval_s,
                "scheme": self.scheme, "source_tls": self.source_tls,
                "source_ca": describe_bundle(self.source_ca) if self.source_ca is not None else None,
                "on_source_truncated": self.on_source_truncated.value,
                "record_filter": describe_record_filter(self.record_filter)}

    def reads_like(self, other: MirrorLink) -> bool:
        """Whether `other` reads the source as this link does (addresses, token, TLS): a
        source client made for one serves the other (its state or policy may differ)."""
        return (self.sources, self.token, self.source_tls, self.source_ca) == (
            other.sources, other.token, other.source_tls, other.source_ca)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateMirrorLink:
    name: str
    sources: tuple[str, ...]
    pattern: str
    priority: str = Priority.NORMAL.value
    token: str | None = field(default=None, repr=False)
    verify_interval_s: int | None = None
    source_tls: bool = False
    source_ca: str | None = field(default=None, repr=False)
    on_source_truncated: str = OnSourceTruncated.STOP.value
    record_filter: RecordFilterSpec | None = None

    def __post_init__(self) -> None:
        check_link_name(self.name)
        check_record_filter(self.record_filter)
        check_verify_interval(self.verify_interval_s)
        check_source_tls(self.source_tls, self.source_ca)
        check_on_source_truncated(self.on_source_truncated)
        if not isinstance(self.sources, tuple):
            raise InvalidRequest("sources are a tuple")
        check_sources(self.sources)
        check_topic_pattern(self.pattern)
        if self.priority not in Priority.__members__.values():
            raise InvalidRequest("priority is high, normal or low")
        if self.token is not None and (not isinstance(self.token, str) or not TOKEN_PATTERN.fullmatch(self.token)):
            raise InvalidRequest("the link's token is 1..512 printable ASCII characters without spaces")

    def link(self) -> MirrorLink:
        return MirrorLink(self.name, self.sources, self.pattern, Priority(self.priority), LinkState.RUNNING,
                          self.token, self.verify_interval_s, self.source_tls, self.source_ca,
                          OnSourceTruncated(self.on_source_truncated), self.record_filter)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetMirrorLinkState:
    """Pause (`paused`) or resume (`running`) a link: a paused link copies nothing and
    creates no mirror topics; its positions stay where they are."""

    name: str
    state: str

    def __post_init__(self) -> None:
        check_link_name(self.name)
        if self.state not in LinkState.__members__.values():
            raise InvalidRequest("a link's state is running or paused")

    def applied_to(self, link: MirrorLink) -> MirrorLink:
        return replace(link, state=LinkState(self.state))


@dataclass(frozen=True, slots=True, kw_only=True)
class SetMirrorLinkPolicy:
    """Change what a link's mirror partitions do when the source truncated past them
    (`on_source_truncated`); the pulls read it from the catalog when it happens, so the
    change holds for the next truncation found, on a partition already stopped too."""

    name: str
    on_source_truncated: str

    def __post_init__(self) -> None:
        check_link_name(self.name)
        check_on_source_truncated(self.on_source_truncated)

    def applied_to(self, link: MirrorLink) -> MirrorLink:
        return replace(link, on_source_truncated=OnSourceTruncated(self.on_source_truncated))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteMirrorLink:
    name: str

    def __post_init__(self) -> None:
        check_link_name(self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateMirrorTopic:
    """A mirror of source topic `name` over `link`: the source's partition count
    (`len(assignments)`) and config; partition p's log starts at `start_offsets[p]`
    (the source's log start when the mirror was made). Placement as `CreateTopic`.
    `source_groups[p]`: the source partition's group id, its identity at the source (the
    source never reuses one: a topic deleted and made again gets new ones); None: not
    recorded (discovery before this field existed), and then not written at all."""

    name: str
    link: str
    replication_factor: int
    config: dict[str, ConfigValue]
    assignments: tuple[tuple[NodeId, ...], ...]
    start_offsets: tuple[int, ...]
    source_groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        check_link_name(self.link)
        rf = self.replication_factor
        if not is_int(rf) or not 1 <= rf <= REPLICATION_FACTOR_MAX:
            raise InvalidRequest(f"replication factor must be 1..{REPLICATION_FACTOR_MAX}")
        check_config(self.config)
        if not isinstance(self.assignments, tuple) or not 1 <= len(self.assignments) <= PARTITIONS_MAX:
            raise InvalidPartitions(f"partitions must be 1..{PARTITIONS_MAX}")
        for replicas in self.assignments:
            if not isinstance(replicas, tuple) or len(replicas) != rf or len(set(replicas)) != rf:
                raise InvalidRequest(f"each partition has {rf} distinct replicas")
            for node_id in replicas:
                check_node_id(node_id)
        check_mirror_starts(self.start_offsets, self.source_groups, len(self.assignments), "partition")


@dataclass(frozen=True, slots=True, kw_only=True)
class GrowMirrorTopic:
    """Follow a source topic's partition increase: mirror topic `name` of `link` grows to
    `count` partitions. `assignments` lists the new partitions' replicas only (partition
    `count - len(assignments)` first), placed by the metadata leader as a mirror topic's
    are; partition p's log starts at `start_offsets[p - (count - len(assignments))]`, the
    source partition's log start when its growth was seen. The new partitions start in
    mirror mode, as the first ones did, and `mirror_partitions` becomes `count`. The total
    rides along (as `CreatePartitions`'s) so a second proposal of the same growth, racing
    the first across a metadata leader change, is refused on apply instead of growing the
    mirror twice. `source_groups[i]`: the new partition `count - len(assignments) + i`'s
    identity at the source, as `CreateMirrorTopic`'s (None: not recorded, and then not
    written at all, so the command is the one from before the field existed). Checks
    against the catalog: mirror_growth.check_mirror_growth."""

    name: str
    link: str
    count: int
    assignments: tuple[tuple[NodeId, ...], ...]
    start_offsets: tuple[int, ...]
    source_groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        check_link_name(self.link)
        if not is_int(self.count) or not 2 <= self.count <= PARTITIONS_MAX:
            raise InvalidPartitions(f"a grown mirror has 2..{PARTITIONS_MAX} partitions")
        if not isinstance(self.assignments, tuple) or not 1 <= len(self.assignments) < self.count:
            raise InvalidReplicaAssignment("one replica list per new partition, at least one")
        sizes = {len(r) if isinstance(r, tuple) else -1 for r in self.assignments}
        if len(sizes) != 1 or not 1 <= min(sizes) <= REPLICATION_FACTOR_MAX:
            raise InvalidReplicaAssignment(f"every new partition has the same number of replicas, 1..{REPLICATION_FACTOR_MAX}")
        for replicas in self.assignments:
            for node_id in replicas:
                check_node_id(node_id)
            if len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignment("a node holds at most one replica of a partition")
        check_mirror_starts(self.start_offsets, self.source_groups, len(self.assignments), "new partition")


@dataclass(frozen=True, slots=True, kw_only=True)
class PromoteMirrorTopic:
    """Stop mirroring topic `name` and make it writable (its partitions' leaders end
    their mirror mode with a META entry each, multiraft/node/mirror_pull.py)."""

    name: str

    def __post_init__(self) -> None:
        check_topic_name(self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResyncMirrorPartition:
    """Start mirror partition `partition` of topic `name` again: a new Raft group (a new
    incarnation, never a reused id) whose log starts at `start_offset` (the source's log
    start) and which the real-time path refills from the source. The full sync's repair
    of a committed range that differs from the source (docs/mirror.md, "Repair": a Raft
    log cannot take back committed entries, so the copy is replaced, never the source).
    `group_id` is the incarnation the verify found different: a resync of one already
    replaced changes nothing, so two verifies racing replace it once.

    `prefix_index` > 0: keep the identical prefix. The new incarnation's log starts as the
    old one's up to its entry `prefix_index` (of `prefix_term`, after which the next offset
    is `prefix_offset`), which each host builds from its own copy (multiraft/node/
    mirror_prefix.py); its first start point stays the old one's (`start_offset` unused)
    and the real-time path refills from `prefix_offset`. `prefix_voters`: the old group's
    voters as the leader saw them, its membership at the cut; the catalog keeps the prefix
    only if they are still the partition's replicas when the resync applies (a move that
    ended meanwhile would leave the kept log naming other voters), else resyncs whole."""

    name: str
    partition: int
    group_id: int
    start_offset: int
    prefix_index: int = 0
    prefix_term: int = 0
    prefix_offset: int = 0
    prefix_voters: tuple[NodeId, ...] = ()

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if not is_int(self.partition) or not 0 <= self.partition < PARTITIONS_MAX:
            raise InvalidRequest(f"partition is 0..{PARTITIONS_MAX - 1}")
        if not is_int(self.group_id) or self.group_id < 1:
            raise InvalidRequest("group_id is a partition group's id")
        if not is_int(self.start_offset) or not 0 <= self.start_offset <= OFFSET_MAX:
            raise InvalidRequest("start_offset is 0..2**63-1")
        for value in (self.prefix_index, self.prefix_term, self.prefix_offset):
            if not is_int(value) or not 0 <= value <= OFFSET_MAX:
                raise InvalidRequest("prefix_index, prefix_term and prefix_offset are 0..2**63-1")
        if self.prefix_index and not self.prefix_term:
            raise InvalidRequest("a kept prefix names the term of its last entry")
        if not isinstance(self.prefix_voters, tuple) or len(self.prefix_voters) > REPLICATION_FACTOR_MAX or bool(
                self.prefix_index) != bool(self.prefix_voters):
            raise InvalidRequest(f"a kept prefix names its 1..{REPLICATION_FACTOR_MAX} voters (and only a kept prefix)")
        for node_id in self.prefix_voters:
            check_node_id(node_id)


MirrorCommand = (CreateMirrorLink | SetMirrorLinkState | SetMirrorLinkPolicy | DeleteMirrorLink | CreateMirrorTopic
                 | PromoteMirrorTopic | ResyncMirrorPartition | GrowMirrorTopic)

MIRROR_COMMAND_TYPES: dict[str, type] = {
    "create_mirror_link": CreateMirrorLink,
    "set_mirror_link_state": SetMirrorLinkState,
    "set_mirror_link_policy": SetMirrorLinkPolicy,
    "delete_mirror_link": DeleteMirrorLink,
    "create_mirror_topic": CreateMirrorTopic,
    "promote_mirror_topic": PromoteMirrorTopic,
    "resync_mirror_partition": ResyncMirrorPartition,
    "grow_mirror_topic": GrowMirrorTopic,
}


# The fields `ResyncMirrorPartition` gained with the kept prefix, and their values when
# none is kept. A resync keeping none is written without them (`omitted_mirror_fields`),
# byte for byte as before they existed, so an older node still applies it; a command
# without them (one an older node wrote, in group 0's log) decodes as keeping none.
RESYNC_PREFIX_DEFAULTS: dict[str, object] = {"prefix_index": 0, "prefix_term": 0, "prefix_offset": 0,
                                             "prefix_voters": ()}


# The same for the fields `CreateMirrorLink` gained after its first version: TLS to the
# source, and what to do when the source truncated past a mirror. A link with their
# defaults (plain HTTP, `stop`) is written without them, as before they existed; a command
# without them (an older node's) decodes with the defaults.
LINK_FIELD_DEFAULTS: dict[str, object] = {"source_tls": False, "source_ca": None,
                                          "on_source_truncated": OnSourceTruncated.STOP.value,
                                          "record_filter": None}


# And for `CreateMirrorTopic`'s and `GrowMirrorTopic`'s: the source partitions' identities. A
# mirror topic made or grown without them (by an earlier discovery, or while
# `records_source_identity` says no) is written as before they existed, and decodes without them.
MIRROR_TOPIC_FIELD_DEFAULTS: dict[str, object] = {"source_groups": None}


def omitted_mirror_fields(command: object) -> frozenset[str]:
    """The fields `encode_command` leaves out of `command`: a resync's prefix fields when it
    keeps none; a link's later fields at their defaults (its TLS fields when it is plain
    HTTP, its CA when it has none, `on_source_truncated` when `stop`); a mirror topic's or a
    growth's `source_groups` when not recorded."""
    if isinstance(command, ResyncMirrorPartition) and not command.prefix_index:
        return frozenset(RESYNC_PREFIX_DEFAULTS)
    if isinstance(command, CreateMirrorLink):
        return frozenset(k for k, default in LINK_FIELD_DEFAULTS.items() if getattr(command, k) == default)
    if isinstance(command, CreateMirrorTopic | GrowMirrorTopic):
        return frozenset(k for k, default in MIRROR_TOPIC_FIELD_DEFAULTS.items() if getattr(command, k) == default)
    return frozenset()


def decoded_mirror_arguments(cls: type, arguments: dict[str, object]) -> dict[str, object]:
    """JSON lists back into the tuples the commands hold; a resync's absent prefix fields
    (an older node's, or one keeping none) filled with their defaults. Runs before the
    decoder compares the fields with the command's."""
    if cls is ResyncMirrorPartition:
        arguments = {**RESYNC_PREFIX_DEFAULTS, **arguments}
    if cls is CreateMirrorLink:
        arguments = {**LINK_FIELD_DEFAULTS, **arguments}
    if cls is CreateMirrorLink and isinstance(arguments.get("sources"), list):
        arguments["sources"] = tuple(arguments["sources"])  # type: ignore[arg-type]
    if cls is CreateMirrorLink:
        arguments["record_filter"] = spec_from_json(arguments["record_filter"])
    if cls is ResyncMirrorPartition and isinstance(arguments.get("prefix_voters"), list):
        arguments["prefix_voters"] = tuple(arguments["prefix_voters"])  # type: ignore[arg-type]
    if cls in (CreateMirrorTopic, GrowMirrorTopic):
        arguments = {**MIRROR_TOPIC_FIELD_DEFAULTS, **arguments}
        if isinstance(arguments.get("source_groups"), list):
            arguments["source_groups"] = tuple(arguments["source_groups"])  # type: ignore[arg-type]
        if isinstance(arguments.get("assignments"), list):
            arguments["assignments"] = tuple(tuple(r) if isinstance(r, list) else r
                                             for r in arguments["assignments"])  # type: ignore[union-attr]
        if isinstance(arguments.get("start_offsets"), list):
            arguments["start_offsets"] = tuple(arguments["start_offsets"])  # type: ignore[arg-type]
    return arguments
