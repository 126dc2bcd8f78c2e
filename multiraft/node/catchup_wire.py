"""Far-horizon catch-up between nodes: the three RPCs and their bodies.

- `catchup.offer` (leader -> follower): the group, the leader's term, the entry the
  install ends at and its term, the leader's start point (storage/node_state.py's
  encoding: the snapshot point, its state and the log start offset), the closed
  segments from the start point to that entry (index range, size, CRC, offsets) and,
  when the leader has it, its state machine at that entry (a checkpoint); with `stream`,
  the files come by a side connection (catchup_stream.py), and a file's CRC may be
  CRC_UNKNOWN in the offer (sent after the file instead).
  Answer: {"accepted": bool, "reason": str}, and with a stream accepted, "stream_port"
  (the follower's side listener); "stream_refused": true when the follower cannot take a
  stream (the leader offers again without one).
- `catchup.chunk` (follower -> leader) {group_id, transfer, first_index, position, size}:
  bytes of one closed segment, at most CHUNK_BYTES_MAX.
- `catchup.done` (follower -> leader) {group_id, transfer, upto, ok, stream_failed}: the
  install ended; `stream_failed` (optional, absent from earlier versions): the stream
  itself broke (only that sends the next offers by chunks).

An offer is a length-prefixed JSON head then the start point's bytes: no pickle, and
everything bounded before it is used (a peer is trusted with the cluster secret, but a
bug on one node must not take another down).
"""

from __future__ import annotations

import itertools
import json
import struct
from dataclasses import dataclass
from typing import Any

from multiraft.errors import InvalidRequest
from raftlog.types import GroupId, Index, Offset, Term
from storage.far_receive import CRC_UNKNOWN
from storage.transfer import SegmentDescriptor

CHUNK_BYTES_MAX = 1024 * 1024  # one RPC answer: well under the frame limit, a short loop slice
SEGMENTS_MAX = 100_000  # an offer's files (64 MiB segments: 6 TiB)
_HEAD = struct.Struct(">I")
_HEAD_BYTES_MAX = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Offer:
    group_id: GroupId
    term: Term
    upto: Index
    upto_term: Term
    start: bytes  # storage.node_state.encode_start
    segments: tuple[SegmentDescriptor, ...]
    # The leader's state machine as of `upto` (a checkpoint, storage/checkpoints.py, the
    # same encoding), when it has one: the follower then replays nothing it installs.
    checkpoint: bytes = b""
    # Names this transfer in its chunks and its done: a late answer of an earlier one
    # (the same group, follower and end) must not end this one.
    transfer: int = 0
    # The files come by a side connection the leader dials (catchup_stream.py), not by
    # catchup.chunk calls.
    stream: bool = False


def encode_offer(offer: Offer) -> bytes:
    head = json.dumps({
        "group_id": offer.group_id, "term": offer.term, "upto": offer.upto, "upto_term": offer.upto_term,
        "segments": [[d.first_index, d.last_index, d.size_bytes, d.crc, d.first_offset, d.next_offset]
                     for d in offer.segments],
        "start_bytes": len(offer.start), "transfer": offer.transfer, "stream": offer.stream,
    }).encode()
    return _HEAD.pack(len(head)) + head + offer.start + offer.checkpoint


def decode_offer(body: bytes) -> Offer:
    if len(body) < _HEAD.size:
        raise InvalidRequest("an offer starts with its head's length")
    (length,) = _HEAD.unpack_from(body)
    if length > min(_HEAD_BYTES_MAX, len(body) - _HEAD.size):
        raise InvalidRequest("an offer's head runs past its body")
    head = request(body[_HEAD.size:_HEAD.size + length])
    rows = head.get("segments")
    if not isinstance(rows, list) or not 0 < len(rows) <= SEGMENTS_MAX:
        raise InvalidRequest(f"segments: 1 to {SEGMENTS_MAX} descriptors")
    segments = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 6 or not all(_natural(v) for v in row):
            raise InvalidRequest("a segment descriptor is six non-negative integers")
        first, last, size, crc, first_offset, next_offset = row
        segments.append(SegmentDescriptor(Index(first), Index(last), size, crc, Offset(first_offset),
                                          Offset(next_offset)))
    for before, after in itertools.pairwise(segments):
        if after.first_index != before.last_index + 1:
            raise InvalidRequest("an offer's segments are contiguous")
    rest = body[_HEAD.size + length:]
    start_bytes = natural(head, "start_bytes")
    if start_bytes > len(rest):
        raise InvalidRequest("an offer's start point runs past its body")
    offer = Offer(GroupId(natural(head, "group_id")), Term(natural(head, "term")), Index(natural(head, "upto")),
                  Term(natural(head, "upto_term")), bytes(rest[:start_bytes]), tuple(segments),
                  bytes(rest[start_bytes:]), natural(head, "transfer"), head.get("stream") is True)
    if segments[-1].last_index != offer.upto:
        raise InvalidRequest("an offer's segments end at its upto")
    if not offer.stream and any(d.crc == CRC_UNKNOWN for d in segments):
        raise InvalidRequest("files fetched by chunks have their CRCs in the offer")
    if any(d.crc > CRC_UNKNOWN for d in segments):
        raise InvalidRequest("a CRC is 32 bits")
    return offer


def request(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequest("a JSON object")
    return value


def natural(fields: dict[str, Any], name: str) -> int:
    value = fields.get(name)
    if not _natural(value):
        raise InvalidRequest(f"{name}: a non-negative integer")
    return value


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
