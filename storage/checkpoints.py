"""Checkpoints: a group's state machine at a recent segment end, so an open replays only
the entries after it.

Without one, a replica that opens (a restart, a reopen after a failure, a far-horizon
install) restores its state machine from the log's start point and applies every
retained entry again: a partition that keeps a gigabyte replays a gigabyte before it
serves. Kafka keeps producer-state snapshots at segment rolls for the same reason.
Here the state at each closed segment's end is captured anyway (multiraft/node/
compaction.py, for retention); the newest capture is also written as the group's
checkpoint, one key in the node's database, replaced at each segment end.

The checkpoint has the start point's shape (storage/node_state.py `StartPoint`: index,
term, membership in force there, the state machine's bytes, the offset after it) but
moves no log start: the entries before it stay, for reads and for followers.

It is written without a sync: a lost checkpoint only means more to replay. It is used
only if it still describes this log (`usable`): past the start point, within the log,
and the entry at its index of its term (a log cut by damage, or replaced by a snapshot
or an install, no longer holds it; `apply_snapshot` and `replace_log` also delete it).
An entry the state machine applied was committed, so the core takes the checkpoint's
index as committed too (RaftCore: commit = max(stored commit, applied)).
"""

from __future__ import annotations

from raftlog.storage import CompactedError, UnavailableError
from raftlog.types import Index
from storage.node_state import StartPoint, decode_start, encode_start
from storage.segments import SegmentStore
from storage.state_db import CHECKPOINT, group_key


def save(store: SegmentStore, point: StartPoint) -> None:
    """Replace the group's checkpoint by `point` (unsynced: see the module docstring)."""
    batch = store.db.batch()
    batch.put(group_key(CHECKPOINT, store.group), encode_start(point))
    store.db.write(batch, sync=False)


def load(store: SegmentStore) -> StartPoint | None:
    raw = store.db.get(group_key(CHECKPOINT, store.group))
    return None if raw is None else decode_start(raw)


def usable(store: SegmentStore, point: StartPoint | None) -> bool:
    """Whether `point` describes a state of this log past its start point."""
    if point is None or not isinstance(point.snapshot.data, bytes):
        return False
    meta = point.snapshot.meta
    if not store.snapshot().meta.index < meta.index <= store.last_index():
        return False
    try:
        return store.term(meta.index) == meta.term and store.offset_after(meta.index) == point.next_offset
    except (CompactedError, UnavailableError):
        return False


def start_from(store: SegmentStore) -> StartPoint | None:
    """The checkpoint an open starts the state machine from, or None (the start point).
    Tells the store, so the core's first membership is the one in force there."""
    point = load(store)
    if not usable(store, point):
        return None
    store.starts_from = point
    return point


def at(store: SegmentStore, index: Index, data: bytes, membership) -> StartPoint:  # type: ignore[no-untyped-def]
    """The checkpoint for `data`, the state machine's state as of entry `index`."""
    snapshot = store.snapshot()
    meta = type(snapshot.meta)(index=index, term=store.term(index), membership=membership)
    return StartPoint(type(snapshot)(meta=meta, data=data), store.offset_after(index))
