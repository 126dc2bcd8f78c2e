"""META entries of a partition group: consumer group offset commits.

A commit is replicated through the partition's own group (not group 0), so it is
ordered with the records it points at: "offset <= high watermark" is checked on
apply against exactly the records committed before it.

Encoding: compact JSON with a version and a type tag (`{"v":1,"type":"offset_commit",
...}`), validated field by field on decode. JSON, not msgpack, because commits are
small and rare next to DATA entries and a readable payload helps when a log is
inspected by hand. Never pickle: a payload is data from the network.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from multiraft.errors import InvalidRequest

META_VERSION = 1
# Kafka's offset.metadata.max.bytes default.
COMMIT_METADATA_BYTES_MAX = 4096
# Kafka bounds group ids only by the request size; 249 matches its topic-name limit.
GROUP_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
OFFSET_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommit:
    """Consumer `group` has processed `topic`/`partition` up to (not including) `offset`."""

    group: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not GROUP_NAME_PATTERN.fullmatch(self.group):
            raise InvalidRequest(f"invalid consumer group name {self.group!r}")
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed position in this partition, and the entry that set it."""

    offset: int
    metadata: str
    index: int


def encode_meta(commit: OffsetCommit) -> bytes:
    return json.dumps(
        {
            "v": META_VERSION,
            "type": "offset_commit",
            "group": commit.group,
            "topic": commit.topic,
            "partition": commit.partition,
            "offset": commit.offset,
            "metadata": commit.metadata,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


_FIELDS = {"v", "type", "group", "topic", "partition", "offset", "metadata"}


def decode_meta(payload: bytes) -> OffsetCommit:
    """Decode and validate a META payload. Raises `InvalidRequest` on anything unexpected."""
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidRequest(f"META payload is not JSON: {error}") from None
    if not isinstance(document, dict) or set(document) != _FIELDS:
        raise InvalidRequest("META payload does not have the offset_commit fields")
    if document["v"] != META_VERSION or document["type"] != "offset_commit":
        raise InvalidRequest(f"unknown META payload {document['type']!r} v{document['v']!r}")
    return OffsetCommit(
        group=document["group"],
        topic=document["topic"],
        partition=document["partition"],
        offset=document["offset"],
        metadata=document["metadata"],
    )
