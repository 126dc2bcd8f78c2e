"""The META entries of a mirror partition (docs/mirror.md, "The real-time path").

A mirror partition is in *mirror mode* from its first entry (its initial state says
so, multiraft/node/mirror_bootstrap.py) until a `MirrorPromote` entry: in that mode
its DATA entries are the source's batches, appended byte for byte, and apply without
the producer table (the source decided them already; the sink's own table could
decide otherwise, having started at the source's log start). `MirrorSkips` names
batches the source stored but leaves out of every read (a duplicate that raced its
original across a leadership change): proposed before the batches they name, kept
pending until those batches apply, so the mirror leaves out exactly what the source
does.

Encoded as a prefix no offset commit has (those are JSON objects) and a small JSON
body; decoding refuses anything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from multiraft.errors import InvalidRequest

MIRROR_META_PREFIX = b"\x00mirror\n"
SKIPS_PER_ENTRY_MAX = 1024
SKIPS_PENDING_MAX = 4096
OFFSET_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class MirrorPromote:
    """End mirror mode: from here on the partition takes producers' batches."""


@dataclass(frozen=True, slots=True)
class MirrorSkips:
    """(base offset, record count) of source batches a read leaves out."""

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.ranges) <= SKIPS_PER_ENTRY_MAX:
            raise InvalidRequest(f"a mirror skips entry names 1..{SKIPS_PER_ENTRY_MAX} ranges")
        for pair in self.ranges:
            if (not isinstance(pair, tuple) or len(pair) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
                    or not 0 <= pair[0] <= OFFSET_MAX or not 1 <= pair[1] <= 2**31):
                raise InvalidRequest("a skipped range is (base offset, record count)")


MirrorMeta = MirrorPromote | MirrorSkips


def is_mirror_meta(payload: bytes) -> bool:
    return payload.startswith(MIRROR_META_PREFIX)


def encode_mirror_meta(command: MirrorMeta) -> bytes:
    if isinstance(command, MirrorPromote):
        body: dict[str, object] = {"type": "promote"}
    else:
        body = {"type": "skips", "ranges": [list(r) for r in command.ranges]}
    return MIRROR_META_PREFIX + json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_mirror_meta(payload: bytes) -> MirrorMeta:
    if not is_mirror_meta(payload):
        raise InvalidRequest("not a mirror META entry")
    try:
        body = json.loads(payload[len(MIRROR_META_PREFIX):])
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("a mirror META entry is not JSON") from None
    if body == {"type": "promote"}:
        return MirrorPromote()
    if not isinstance(body, dict) or set(body) != {"type", "ranges"} or body["type"] != "skips":
        raise InvalidRequest("unknown mirror META entry")
    ranges = body["ranges"]
    if not isinstance(ranges, list) or not all(isinstance(r, list) for r in ranges):
        raise InvalidRequest("a mirror skips entry holds a list of [base, count]")
    return MirrorSkips(tuple(tuple(r) for r in ranges))  # type: ignore[misc]
