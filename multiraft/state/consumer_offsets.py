"""META entries of a partition group: consumer group offset commits, their expiry and deletion.

A commit is replicated through the partition's own group (not group 0), so it is
ordered with the records it points at: "offset <= high watermark" is checked on
apply against exactly the records committed before it.

Three commands, all applied by `PartitionState` without reading a clock (every
replica must reach the same state), so time travels inside the entries:

- `offset_commit`: a group's position, with `committed_at_ms`, the leader's wall
  clock when it proposed the commit;
- `offsets_expire`: the leader's retention pass (Kafka's offsets.retention.minutes):
  the groups it found idle as of `as_of_ms` under `retention_ms`; apply removes
  those whose last commit is still older than `as_of_ms - retention_ms`;
- `offsets_delete`: one group's offsets go (Kafka's DeleteGroups).

Encoding: compact JSON with a version and a type tag (`{"v":2,"type":...}`),
validated field by field on decode. JSON, not msgpack, because these entries are
small and rare next to DATA entries and a readable payload helps when a log is
inspected by hand. Never pickle: a payload is data from the network.

Versions. v1 (before retention) had only `offset_commit`, without a time; it is
still decoded, with `committed_at_ms` = `COMMIT_TIME_UNKNOWN` (0). A group whose
commit time is unknown is never expired on that basis: the first retention pass
that sees it lists it, and applying that pass gives it the pass's own `as_of_ms`
as its time. So offsets committed before an upgrade get one full retention period
from the first pass after it, never less (treating 0 as "very old" would drop
every pre-upgrade group at the first pass; treating it as the pass's time forever
would keep them forever). Everything is encoded as v2, except a commit that carries a
stamp (below): v3, the v2 fields and `stamp`.

Stamps. A member's commit is checked at the group coordinator and then written
through the partition's group, a hop apart: a commit whose write was delayed on
the way (a forwarded call held by a network fault) could land after newer commits
of the same group and move its offset back (the chaos group workload saw 112 go
back to 54). So the coordinator stamps each commit with (its term as the metadata
leader, a counter of its own), which only grows over the commits it and its
successors issue, and apply refuses a commit whose stamp is below the one that
set the group's current offset (`STALE_OFFSET_COMMIT`). Unstamped commits (an
admin reset, a group without members) apply as before and keep the stamp there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from multiraft.errors import InvalidRequest

META_VERSION = 2  # what is encoded (v3: a stamped commit); v1 is still decoded
# Kafka's offset.metadata.max.bytes default.
COMMIT_METADATA_BYTES_MAX = 4096
# Kafka bounds group ids only by the request size; 249 matches its topic-name limit.
GROUP_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
OFFSET_MAX = 2**63 - 1
TIME_MS_MAX = 2**63 - 1
# The commit time of offsets committed by a version before v2 (see the module docstring).
COMMIT_TIME_UNKNOWN = 0
# No stamp: a commit that did not come through the coordinator (see the module docstring).
NO_STAMP = (0, 0)
STAMP_PART_MAX = 2**63 - 1
# Groups one `offsets_expire` entry names: at most ~125 KiB of names (249 bytes each), well
# inside one append; a partition holding more idle groups sheds them over several passes.
EXPIRE_GROUPS_PER_ENTRY_MAX = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommit:
    """Consumer `group` has processed `topic`/`partition` up to (not including) `offset`.

    `committed_at_ms`: the proposing leader's wall clock (ms since the epoch), or
    `COMMIT_TIME_UNKNOWN` before the leader stamps it (and in v1 payloads).
    """

    group: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    committed_at_ms: int = COMMIT_TIME_UNKNOWN
    stamp: tuple[int, int] = NO_STAMP  # (coordinator term, its counter); see the module docstring

    def __post_init__(self) -> None:
        _check_group(self.group)
        if not (isinstance(self.stamp, tuple) and len(self.stamp) == 2
                and all(_is_int(part) and 0 <= part <= STAMP_PART_MAX for part in self.stamp)):
            raise InvalidRequest("a commit's stamp is two integers (term, counter)")
        if not isinstance(self.topic, str) or not self.topic:
            raise InvalidRequest("an offset commit names its topic")
        if not _is_int(self.partition) or self.partition < 0:
            raise InvalidRequest(f"invalid partition {self.partition!r}")
        if not _is_int(self.offset) or not 0 <= self.offset <= OFFSET_MAX:
            raise InvalidRequest(f"invalid offset {self.offset!r}")
        if not isinstance(self.metadata, str):
            raise InvalidRequest("commit metadata is a string")
        if len(self.metadata.encode()) > COMMIT_METADATA_BYTES_MAX:
            raise InvalidRequest(f"commit metadata exceeds {COMMIT_METADATA_BYTES_MAX} bytes")
        _check_time(self.committed_at_ms, "committed_at_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsExpire:
    """The leader's retention pass: `groups` looked idle as of `as_of_ms` (its wall clock).

    Apply removes each listed group whose commit is older than `as_of_ms -
    retention_ms` (a group that committed since is kept), and stamps a listed group
    whose commit time is unknown with `as_of_ms`. Both numbers travel in the entry, so
    every replica decides alike whatever its own clock and settings.
    """

    as_of_ms: int
    retention_ms: int
    groups: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_time(self.as_of_ms, "as_of_ms")
        if not _is_int(self.retention_ms) or not 1 <= self.retention_ms <= TIME_MS_MAX:
            raise InvalidRequest(f"invalid retention_ms {self.retention_ms!r}")
        if not isinstance(self.groups, tuple) or not 1 <= len(self.groups) <= EXPIRE_GROUPS_PER_ENTRY_MAX:
            raise InvalidRequest(f"an offsets_expire entry names 1..{EXPIRE_GROUPS_PER_ENTRY_MAX} groups")
        for group in self.groups:
            _check_group(group)
        if len(set(self.groups)) != len(self.groups):
            raise InvalidRequest("an offsets_expire entry names each group once")

    @property
    def expire_before_ms(self) -> int:
        """Commits strictly older than this are idle past the retention."""
        return self.as_of_ms - self.retention_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsDelete:
    """Remove `group`'s committed offset in this partition (DELETE /v1/groups/{group})."""

    group: str

    def __post_init__(self) -> None:
        _check_group(self.group)


MetaCommand = OffsetCommit | OffsetsExpire | OffsetsDelete


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_group(group: object) -> None:
    if not isinstance(group, str) or not GROUP_NAME_PATTERN.fullmatch(group):
        raise InvalidRequest(f"invalid consumer group name {group!r}")


def _check_time(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= TIME_MS_MAX:
        raise InvalidRequest(f"invalid {name} {value!r}")


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed position in this partition, the entry that set it, and when
    (`committed_at_ms`, the proposing leader's clock; `COMMIT_TIME_UNKNOWN` for v1)."""

    offset: int
    metadata: str
    index: int
    committed_at_ms: int = COMMIT_TIME_UNKNOWN
    stamp: tuple[int, int] = NO_STAMP  # of the newest stamped commit that set it


def encode_meta(command: MetaCommand) -> bytes:
    document: dict[str, Any] = {"v": META_VERSION}
    if isinstance(command, OffsetCommit):
        document |= {"type": "offset_commit", "group": command.group, "topic": command.topic,
                     "partition": command.partition, "offset": command.offset,
                     "metadata": command.metadata, "committed_at_ms": command.committed_at_ms}
        if command.stamp != NO_STAMP:
            document |= {"v": 3, "stamp": list(command.stamp)}
    elif isinstance(command, OffsetsExpire):
        document |= {"type": "offsets_expire", "as_of_ms": command.as_of_ms,
                     "retention_ms": command.retention_ms, "groups": list(command.groups)}
    else:
        assert isinstance(command, OffsetsDelete)
        document |= {"type": "offsets_delete", "group": command.group}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


_COMMIT_FIELDS_V1 = {"v", "type", "group", "topic", "partition", "offset", "metadata"}
# Fields per (version, type): exactly these, no more, no fewer.
_FIELDS = {
    (1, "offset_commit"): _COMMIT_FIELDS_V1,
    (2, "offset_commit"): _COMMIT_FIELDS_V1 | {"committed_at_ms"},
    (3, "offset_commit"): _COMMIT_FIELDS_V1 | {"committed_at_ms", "stamp"},
    (2, "offsets_expire"): {"v", "type", "as_of_ms", "retention_ms", "groups"},
    (2, "offsets_delete"): {"v", "type", "group"},
}


def decode_meta(payload: bytes) -> MetaCommand:
    """Decode and validate a META payload (v1-v3). Raises `InvalidRequest` on anything unexpected."""
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidRequest(f"META payload is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidRequest("META payload is not a JSON object")
    version, kind = document.get("v"), document.get("type")
    fields = _FIELDS.get((version, kind)) if _is_int(version) and isinstance(kind, str) else None
    if fields is None:
        raise InvalidRequest(f"unknown META payload {kind!r} v{version!r}")
    if set(document) != fields:
        raise InvalidRequest(f"META payload does not have the {kind} v{version} fields")
    if kind == "offsets_expire":
        groups = document["groups"]
        if not isinstance(groups, list):
            raise InvalidRequest("offsets_expire groups is a list")
        return OffsetsExpire(as_of_ms=document["as_of_ms"], retention_ms=document["retention_ms"],
                             groups=tuple(groups))
    if kind == "offsets_delete":
        return OffsetsDelete(group=document["group"])
    stamp = document.get("stamp", list(NO_STAMP))
    if not isinstance(stamp, list):
        raise InvalidRequest("an offset commit's stamp is a list")
    return OffsetCommit(
        stamp=tuple(stamp),
        group=document["group"],
        topic=document["topic"],
        partition=document["partition"],
        offset=document["offset"],
        metadata=document["metadata"],
        committed_at_ms=document.get("committed_at_ms", COMMIT_TIME_UNKNOWN),
    )
