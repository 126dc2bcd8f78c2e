"""What the chaos switches (multiraft/node/unsafe.py) put in a node: collaborators, chosen once.

The node reads its `ChaosHooks` when it is built and turns each switch into the
piece that behaves that way, so no hot path asks `if hooks.x`: the read path is
handed the end its reads stop at (`committed_end`, or `log_end` for the
read-uncommitted control); the replicas the partition machine factory, whose
producer table a restore keeps (`ProducerTableWithoutDedup` for `no-dedup`), the
store opener (`open_store`: the store class, `SegmentStoreForgettingVotes` for
`vote-without-persist`, and the frame check, `framing_only` for `skip-crc`), the
persistence strategy (`ack-before-fsync`) and the file layer (`write-behind`).
The faulty pieces live here, so `state/` and `storage/` know no switch. With no
switch on, every piece is the production one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from multiraft.consumer_groups import GroupsState
from multiraft.consumer_groups.state import NO_PARTITIONS, Group, Member
from multiraft.node.machines import PartitionMachine
from multiraft.state.producers import (
    Accept,
    Decision,
    Duplicate,
    DuplicatePending,
    ProducerBatch,
    ProducerTable,
)
from raftlog.messages import HardState
from raftlog.types import GroupId, Offset
from storage.config import StoreConfig
from storage.entry_cache import EntryCacheBudget
from storage.files import Files, OsFiles
from storage.frames import FrameCheck, crc_matches
from storage.segments import SegmentStore, wall_clock_ms
from storage.state_db import StateDatabase
from storage.write_behind import WriteBehindFiles

if TYPE_CHECKING:
    from multiraft.node.unsafe import ChaosHooks

# The offset a read of a partition replica stops before, by its isolation ("committed"
# or "uncommitted").
ReadEnd = Callable[[PartitionMachine, SegmentStore, str], int]


def committed_end(machine: PartitionMachine, store: SegmentStore, isolation: str) -> int:
    """Committed reads stop at the high watermark; uncommitted ones at the log end."""
    if isolation == "uncommitted":
        return int(store.log_end_offset)
    return int(machine.state.high_watermark)


def log_end(machine: PartitionMachine, store: SegmentStore, isolation: str) -> int:
    """The read-uncommitted control: every read goes to the log end, past the high watermark."""
    return int(store.log_end_offset)


class ProducerTableWithoutDedup(ProducerTable):
    """The no-dedup control: a retried idempotent batch is never a duplicate, neither in
    the leader's check nor on apply; it is appended again at new offsets, and the table
    goes on from the original, as if the retry had not been (so later sequences still fit)."""

    def check(self, batch: ProducerBatch) -> Decision:
        decision = super().check(batch)
        return Accept() if isinstance(decision, Duplicate | DuplicatePending) else decision

    def record_proposal(self, batch: ProducerBatch) -> None:
        if batch.idempotent and isinstance(super().check(batch), Duplicate | DuplicatePending):
            return  # a re-proposed retry does not move the sequence
        super().record_proposal(batch)

    def apply(self, batch: ProducerBatch, base_offset: Offset | None) -> Decision:
        decision = super().apply(batch, base_offset)  # a duplicate leaves the table as it was
        return Accept() if isinstance(decision, Duplicate) else decision


def framing_only(body: memoryview, crc: int) -> bool:
    """The skip-crc control's frame check: every CRC matches, so reads and recovery check
    only framing (length, kind, index order) and keep and serve a flipped bit."""
    return True


class SegmentStoreForgettingVotes(SegmentStore):
    """The vote-without-persist control: term and vote never reach the database; it keeps
    the ones it held when the store opened (the commit index is still written), so a
    vote never asks for a synced write and a restarted node votes and leads again in
    terms it already saw."""

    def __init__(self, group: GroupId, directory: str, db: StateDatabase, files: Files,
                 config: StoreConfig | None = None, clock_ms: Callable[[], int] = wall_clock_ms,
                 *, frame_check: FrameCheck = crc_matches,
                 on_segments_changed: Callable[[SegmentStore], None] | None = None,
                 cache_budget: EntryCacheBudget | None = None) -> None:
        super().__init__(group, directory, db, files, config, clock_ms, frame_check=frame_check,
                         on_segments_changed=on_segments_changed, cache_budget=cache_budget)
        self._opened_hard_state = self.initial_state().hard_state  # its term and vote are kept

    def hard_state_to_store(self) -> HardState:
        opened = self._opened_hard_state
        return HardState(term=opened.term, vote=opened.vote, commit=super().hard_state_to_store().commit)


class GroupsStateGivingEarly(GroupsState):
    """The group-early-assign control: a member that heartbeats takes every partition of
    its target at once, though another member still holds it (assigned, or revoking and
    not yet given back), and apply no longer asserts one owner per partition. Revocation
    goes on as before, so the old owner still reads until it hears. The chaos checker's
    `group-two-owners` must see it. The catalog holder keeps this class across snapshot
    restores, but a group 0 snapshot taken while a partition has two owners does not
    decode (decoding re-checks one owner per partition)."""

    def _reconcile(self, group: Group, member: Member) -> Member:
        target = group.target.get(member.member_id, NO_PARTITIONS)
        revoke = member.assigned - target
        if revoke and not member.revoking:
            return replace(member, assigned=member.assigned & target, revoking=revoke,
                           epoch=group.assignment_epoch, previous_epoch=member.epoch)
        assigned = (member.assigned & target) | (target - member.revoking)
        if member.epoch == group.assignment_epoch:
            return member if assigned == member.assigned else replace(member, assigned=assigned)
        return replace(member, epoch=group.assignment_epoch, previous_epoch=member.epoch, assigned=assigned)

    def _check_owners(self, group: Group) -> None:
        return


def drop_first_batch(payloads: list[bytes]) -> list[bytes]:
    """The mirror-skip-batch control: a mirror chunk of two or more batches goes to the
    sink's Raft group without its first (chaos/mirror_checks.py must see it)."""
    return payloads[1:] if len(payloads) >= 2 else payloads


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    read_end: ReadEnd = committed_end
    new_partition_machine: Callable[[str, int], PartitionMachine] = PartitionMachine
    frame_check: FrameCheck = crc_matches
    store_class: type[SegmentStore] = SegmentStore
    ack_before_fsync: bool = False
    write_behind_files: bool = False
    new_groups_state: Callable[[], GroupsState] = GroupsState
    mirror_chunk: Callable[[list[bytes]], list[bytes]] | None = None  # None: copied as read

    @classmethod
    def of(cls, hooks: ChaosHooks) -> Faults:
        machine = (functools.partial(PartitionMachine, new_producers=ProducerTableWithoutDedup)
                   if hooks.no_dedup else PartitionMachine)
        return cls(
            read_end=log_end if hooks.read_uncommitted else committed_end,
            new_partition_machine=machine,
            frame_check=framing_only if hooks.skip_crc else crc_matches,
            store_class=SegmentStoreForgettingVotes if hooks.vote_without_persist else SegmentStore,
            ack_before_fsync=hooks.ack_before_fsync,
            write_behind_files=hooks.write_behind_files,
            new_groups_state=GroupsStateGivingEarly if hooks.group_early_assign else GroupsState,
            mirror_chunk=drop_first_batch if hooks.mirror_skip_batch else None,
        )

    def open_store(self, group: GroupId, directory: str, db: StateDatabase, files: Files, config: StoreConfig,
                   on_segments_changed: Callable[[SegmentStore], None] | None = None,
                   cache_budget: EntryCacheBudget | None = None) -> SegmentStore:
        """Open a group's segment store: the class and frame check chosen here."""
        return self.store_class(group, directory, db, files, config, frame_check=self.frame_check,
                                on_segments_changed=on_segments_changed, cache_budget=cache_budget)

    def files(self, groups_directory: str) -> Files:
        """Segment files: the OS's, or the write-behind layer that loses unsynced data on kill -9."""
        return WriteBehindFiles(groups_directory) if self.write_behind_files else OsFiles()
