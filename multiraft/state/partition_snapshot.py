"""Snapshot encoding of `PartitionState`: shipped with segment transfers.

A mirror partition (multiraft/state/mirror_meta.py) adds a `mirror` key (its pending
skipped ranges); the key is absent for every other partition, so their snapshots are
unchanged, and older snapshots decode as not mirrors.

msgpack (already a dependency, compact for the producer table, exact for
integers), one versioned map. Decoding validates every field's shape and raises
`SnapshotFormatError`: a snapshot arrives from a peer, so bad bytes are an
operating condition, not a crash. The producer table keeps its LRU order, since
that order decides future evictions and must match on every replica.

Versions: v2 adds each consumer group's commit time (a fifth field of its row,
`committed_at_ms`, which retention reads). v1 snapshots, from before retention,
still decode: their groups get `COMMIT_TIME_UNKNOWN` (multiraft/state/consumer_offsets.py
says how a retention pass treats those).

v3 adds each group's commit stamp (two more fields of its row; consumer_offsets.py,
"Stamps"). It is encoded only when some group has a stamp, so a partition whose
offsets were never stamped still snapshots as v2, byte for byte.

`PartitionState` (multiraft/state/partition.py) encodes and restores itself through
this module, so the codec does not import it: it names the state's shape
(`PartitionFields`) and is handed the class to build.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgpack

from multiraft.errors import SnapshotFormatError
from multiraft.state.consumer_offsets import (
    COMMIT_TIME_UNKNOWN,
    NO_STAMP,
    STAMP_PART_MAX,
    CommittedOffset,
)
from multiraft.state.mirror_meta import SKIPS_PENDING_MAX
from multiraft.state.producers import (
    BATCHES_KEPT,
    EPOCH_MAX,
    SEQUENCE_MAX,
    ProducedBatch,
    ProducerEntry,
    ProducerTable,
)
from raftlog.types import Index, Offset

SNAPSHOT_VERSION = 2  # 3 when a group's offset carries a stamp
SNAPSHOT_VERSIONS_DECODED = (1, 2, 3)


class PartitionFields(Protocol):
    """What the codec reads and fills of a `PartitionState`."""

    topic: str
    partition: int
    applied_index: Index
    next_offset: Offset
    producers: ProducerTable
    consumer_groups_max: int
    consumer_offsets: OrderedDict[str, CommittedOffset]
    skipped_ranges: list[tuple[Offset, int]]
    mirror: bool
    mirror_skips: set[tuple[int, int]]


S = TypeVar("S", bound=PartitionFields)


def encode_snapshot(state: PartitionFields) -> bytes:
    stamped = any(c.stamp != NO_STAMP for c in state.consumer_offsets.values())
    document = {
        "v": 3 if stamped else SNAPSHOT_VERSION,
        "topic": state.topic,
        "partition": state.partition,
        "applied_index": state.applied_index,
        "next_offset": state.next_offset,
        "producers_max": state.producers.producers_max,
        "consumer_groups_max": state.consumer_groups_max,
        "producers": [_producer_row(pid, entry) for pid, entry in state.producers.items()],
        "consumer_offsets": [
            [group, c.offset, c.metadata, c.index, c.committed_at_ms, *((*c.stamp,) if stamped else ())]
            for group, c in state.consumer_offsets.items()
        ],
        "skipped": [[base, count] for base, count in state.skipped_ranges],
    }
    if state.mirror:  # a mirror partition (absent otherwise, so others snapshot as before mirrors)
        document["mirror"] = [[base, count] for base, count in sorted(state.mirror_skips)]
    return msgpack.packb(document, use_bin_type=True)


def _producer_row(producer_id: int, entry: ProducerEntry) -> list[Any]:
    batches = [[b.base_sequence, b.record_count, b.base_offset] for b in entry.batches]
    return [producer_id, entry.epoch, batches]


def decode_snapshot(data: bytes, new_state: Callable[..., S]) -> S:
    """The state `data` holds, built by `new_state` (called with the keyword arguments
    of `PartitionState`) and filled in."""
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as error:
        raise SnapshotFormatError(f"partition snapshot does not decode: {error}") from None
    try:
        return _build(document, new_state)
    except (KeyError, TypeError, ValueError) as error:
        raise SnapshotFormatError(f"partition snapshot is malformed: {error!r}") from None


def _int(value: Any, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {value!r}")
    return value


def _build(document: Any, new_state: Callable[..., S]) -> S:
    version = document.get("v") if isinstance(document, dict) else None
    if type(version) is not int or version not in SNAPSHOT_VERSIONS_DECODED:
        raise ValueError("unknown partition snapshot version")
    if not isinstance(document["topic"], str):
        raise ValueError("topic is not a string")
    state = new_state(
        topic=document["topic"],
        partition=_int(document["partition"]),
        applied_index=Index(_int(document["applied_index"])),
        next_offset=Offset(_int(document["next_offset"])),
        producers_max=_int(document["producers_max"], 1),
        consumer_groups_max=_int(document["consumer_groups_max"], 1),
    )
    producers = [_producer(row) for row in document["producers"]]
    if len(producers) > state.producers.producers_max:
        raise ValueError("more producers than the bound")
    if len({producer_id for producer_id, _ in producers}) != len(producers):
        raise ValueError("a producer id appears twice")
    state.producers.restore(producers)
    row_fields = {1: 4, 2: 5, 3: 7}[version]  # v1 rows have no commit time, v2 no stamp
    for row in document["consumer_offsets"]:
        if not isinstance(row, list) or len(row) != row_fields:
            raise ValueError("consumer offset row is malformed")
        group, offset, metadata, index = row[:4]
        committed_at_ms = _int(row[4]) if row_fields >= 5 else COMMIT_TIME_UNKNOWN
        stamp = (_int(row[5]), _int(row[6])) if row_fields == 7 else NO_STAMP
        if not isinstance(group, str) or not isinstance(metadata, str) or group in state.consumer_offsets:
            raise ValueError("consumer offset row is malformed")
        if _int(offset) > state.next_offset or max(stamp) > STAMP_PART_MAX:
            raise ValueError("committed offset beyond the high watermark, or a stamp out of range")
        state.consumer_offsets[group] = CommittedOffset(offset, metadata, _int(index), committed_at_ms, stamp)
    if len(state.consumer_offsets) > state.consumer_groups_max:
        raise ValueError("more consumer groups than the bound")
    end = 0
    for base, count in document["skipped"]:
        if _int(base) < end or _int(count, 1) + base > state.next_offset:
            raise ValueError("skipped ranges overlap or pass the high watermark")
        state.skipped_ranges.append((Offset(base), count))
        end = base + count
    mirror = document.get("mirror")  # absent: not a mirror (and every snapshot from before mirrors)
    if mirror is not None:
        if not isinstance(mirror, list) or len(mirror) > SKIPS_PENDING_MAX:
            raise ValueError("mirror skips are a bounded list")
        state.mirror = True
        for base, count in mirror:
            if _int(base) < state.next_offset or _int(count, 1) > 2**31:
                raise ValueError("a pending mirror skip lies below the high watermark")
            state.mirror_skips.add((base, count))
    return state


def _producer(row: Any) -> tuple[int, ProducerEntry]:
    producer_id, epoch, batches = row
    produced = tuple(
        ProducedBatch(_int(seq), _int(count, 1), Offset(_int(offset)))
        for seq, count, offset in batches
    )
    if not 1 <= len(produced) <= BATCHES_KEPT:
        raise ValueError("a producer entry keeps 1 to 5 batches")
    if _int(epoch) > EPOCH_MAX or any(b.base_sequence > SEQUENCE_MAX for b in produced):
        raise ValueError("producer epoch or sequence out of range")
    return _int(producer_id), ProducerEntry(epoch=_int(epoch), batches=produced)
