"""A mirror partition's first state: its log starts at the source's log start offset.

A plain partition's replica starts with the bootstrap entries (one CONFIG entry per
initial voter, raftlog/bootstrap.py) and offset 0. A mirror partition must keep its
source's offsets, and the source may have deleted its first records (retention), so
its replicas start from a start point instead, as a compacted log does: a snapshot
at the bootstrap entries' last index and term, naming the same voters, whose state
is an empty partition in mirror mode with its next offset at `start_offset`. Every
initial voter writes the same start point, so their logs agree from the first entry
on, and a replica added later learns it from the leader as any compacted log's.

The start point's term is always BOOTSTRAP_TERM; the replica's own term (its hard state)
may start higher. A resync that keeps the identical prefix (mirror_prefix.py) gives the
replicas that kept it the old group's entries up to a cut of term T, with term T; one that
kept nothing starts here, and must start at term T too. The core tells entries apart by
(index, term) only: at a lower term it could win an election at a term <= T and append
entries at the kept ones' indexes with their terms, which a replica that kept them would
take for its own (two committed logs), or be elected at a term below T and commit entries
the kept replica, winning later with its higher last term, never had. From term T on
every election of the new group is at a term > T, so a new leader's entries conflict with
any kept one at their index and replace it.
"""

from __future__ import annotations

from collections.abc import Sequence

from multiraft.metadata.catalog import TopicInfo
from multiraft.state.partition import PartitionState
from raftlog.bootstrap import BOOTSTRAP_TERM
from raftlog.messages import HardState, Membership, Snapshot, SnapshotMeta
from raftlog.types import Index, NodeId, Offset, Term


def first_start(voters: Sequence[NodeId]) -> tuple[Index, Term]:
    """Index and term of a mirror replica's start point: where the bootstrap entries would have ended."""
    return Index(len(set(voters))), BOOTSTRAP_TERM


def bootstrap_mirror(store: object, voters: list[NodeId], topic: str, partition: int, start_offset: int,
                     term: int = BOOTSTRAP_TERM) -> None:
    """Write a new mirror replica's start point into its empty `store` (a SegmentStore), its
    hard state at `term` (a kept prefix's term, else BOOTSTRAP_TERM: the module's docstring)."""
    assert voters and start_offset >= 0 and term >= BOOTSTRAP_TERM
    index, _ = first_start(voters)
    state = PartitionState(topic=topic, partition=partition, applied_index=index,
                           next_offset=Offset(start_offset), mirror=True)
    meta = SnapshotMeta(index=index, term=BOOTSTRAP_TERM, membership=Membership(voters=frozenset(voters)))
    store.apply_snapshot(Snapshot(meta=meta, data=state.snapshot()), Offset(start_offset))  # type: ignore[attr-defined]
    store.set_hard_state(HardState(term=Term(term), commit=index))  # type: ignore[attr-defined]


def mirror_start(topic: TopicInfo | None, partition: int) -> tuple[str, int, int, int] | None:
    """(topic, partition, start offset, first term) when the partition began as a mirror,
    else None: one the mirror was made or grown with (GrowMirrorTopic), promoted since or not
    (a replica created late must start as the others did); never one added after the
    promotion (a plain partition). Mirror partitions are a prefix of the topic's: a mirror
    grows only before its promotion, plain partitions only after.
    The first term: the kept prefix's term when the incarnation keeps one, else BOOTSTRAP_TERM."""
    if topic is None or topic.mirror_link is None or partition >= topic.mirror_partitions:
        return None
    info = topic.partitions[partition]
    return topic.name, partition, info.start_offset, max(BOOTSTRAP_TERM, info.prefix[2] if info.prefix else 0)
