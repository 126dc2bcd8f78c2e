"""The partition state machine: what one partition group's committed entries mean.

Pure logic: the group runtime feeds committed entries to `apply` in log order and
resolves its waiters with the `ApplyResult`s; the leader calls `check_produce`
before proposing. No I/O, no clock.

Offsets. Every committed DATA entry occupies `record_count` logical offsets
starting at `next_offset`: the same rule storage uses when it frames the entry
(`storage/frames.py`), so the high watermark here always equals the offset the
storage index gives the next DATA entry. That includes a batch refused on apply
(a duplicate proposed twice, an out-of-order or fenced batch that slipped past
the leader's check during a leadership change): its bytes are in the log, so its
offsets are taken, but the result says `duplicate` (with the original offsets)
or carries the error, and its range is recorded in `skipped_ranges` so the read
path can leave those records out. The leader's pre-proposal check, which also
counts its own in-flight proposals, keeps such entries rare.

Consumer offsets (META entries, multiraft/state/consumer_offsets.py): commits, the
leader's retention passes (`offsets_expire`) and deletions (`offsets_delete`).
Time enters only inside those entries (a commit's `committed_at_ms`, a pass's
`as_of_ms`), so expiry is decided alike on every replica.

Invariants: entries apply in index order without gaps; `high_watermark` never
decreases; committed consumer offsets never exceed the high watermark at the
time of their commit.
"""

from __future__ import annotations

import bisect
import functools
from collections import OrderedDict
from dataclasses import dataclass, replace

from multiraft.errors import (
    CommitOffsetOutOfRange,
    InvalidRequest,
    NotAMirror,
    StaleOffsetCommit,
    TooManyConsumerGroups,
    UnknownGroup,
)
from multiraft.state.consumer_offsets import (
    COMMIT_TIME_UNKNOWN,
    NO_STAMP,
    CommittedOffset,
    OffsetCommit,
    OffsetsDelete,
    OffsetsExpire,
    decode_meta,
)
from multiraft.state.mirror_meta import (
    SKIPS_PENDING_MAX,
    MirrorPromote,
    decode_mirror_meta,
    is_mirror_meta,
)
from multiraft.state.partition_snapshot import decode_snapshot, encode_snapshot
from multiraft.state.producers import (
    PRODUCERS_MAX_DEFAULT,
    Accept,
    Decision,
    Duplicate,
    NewProducerTable,
    ProducerBatch,
    ProducerTable,
)
from raftlog.errors import ClientError
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset
from storage.batch import BatchHeader, read_header
from storage.errors import InvalidBatchError

# Consumer groups with offsets in one partition. Kafka has no count bound (it
# expires offsets after offsets.retention.minutes); a bound keeps a snapshot small.
CONSUMER_GROUPS_MAX_DEFAULT = 10_000
START_INDEX = Index(0)
START_OFFSET = Offset(0)


def producer_batch(header: BatchHeader) -> ProducerBatch:
    return ProducerBatch(
        producer_id=header.producer_id,
        epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        record_count=header.record_count,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    """The outcome of one committed entry, handed to whoever waits for it.

    DATA: `base_offset`/`count` are what the producer is told (for a duplicate,
    the original batch's); `stored_base_offset` is where this entry's records sit
    in the log (equal to `base_offset` unless duplicate or refused). META: for a
    commit `base_offset` is the committed consumer offset; for an expiry or a
    delete `count` is the number of groups removed. `error` set means refused:
    the entry changed nothing but the high watermark (DATA) or nothing (META).
    """

    index: Index
    kind: EntryKind
    base_offset: Offset | None = None
    count: int = 0
    duplicate: bool = False
    stored_base_offset: Offset | None = None
    error: ClientError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class PartitionState:
    """Applied state of one partition: offsets, producers, consumer offsets.

    `applied_index` and `next_offset` are the raft index <-> offset mapping of
    the last applied entry: after applying index i, records below `next_offset`
    are all in entries <= i. `high_watermark` is `next_offset` (reads see only
    committed records by default).
    """

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        applied_index: Index = START_INDEX,
        next_offset: Offset = START_OFFSET,
        producers_max: int = PRODUCERS_MAX_DEFAULT,
        consumer_groups_max: int = CONSUMER_GROUPS_MAX_DEFAULT,
        new_producers: NewProducerTable = ProducerTable,
        mirror: bool = False,
    ) -> None:
        assert partition >= 0 and applied_index >= 0 and next_offset >= 0
        assert consumer_groups_max >= 1
        self.topic = topic
        self.partition = partition
        self.applied_index = applied_index
        self.next_offset = next_offset
        self.producers = new_producers(producers_max)
        self.consumer_groups_max = consumer_groups_max
        self.consumer_offsets: OrderedDict[str, CommittedOffset] = OrderedDict()
        # (stored base offset, count) of committed DATA entries whose records are
        # not part of the partition (duplicates, refused batches), in offset order.
        self.skipped_ranges: list[tuple[Offset, int]] = []
        # Mirror mode (multiraft/state/mirror_meta.py): DATA entries are a source's batches,
        # applied without the producer table, until a promote entry; and the source's
        # skipped batches still to come, as (base offset, count).
        self.mirror = mirror
        self.mirror_skips: set[tuple[int, int]] = set()

    @property
    def high_watermark(self) -> Offset:
        return self.next_offset

    # ---- leader side, before proposing -------------------------------------

    def check_produce(self, header: BatchHeader) -> Decision:
        """Decide a validated batch before it is proposed (leader only).

        Returns `Accept` (propose it, then call `record_proposal`), `Duplicate`
        (answer the original offsets, propose nothing) or `DuplicatePending`
        (wait for the original proposal). Raises `InvalidProducerEpoch`,
        `OutOfOrderSequence` or `InvalidRequest`.
        """
        return self.producers.check(producer_batch(header))

    def record_proposal(self, header: BatchHeader) -> None:
        """Count an accepted batch as in flight, so later batches are checked after it."""
        self.producers.record_proposal(producer_batch(header))

    def drop_proposals(self) -> None:
        """Call on losing leadership or when proposals were dropped."""
        self.producers.drop_proposals()

    # ---- apply ---------------------------------------------------------------

    def apply(self, entry: Entry) -> ApplyResult:
        """Apply the next committed entry. Deterministic: every replica gets the same."""
        assert entry.index == self.applied_index + 1, "entries apply in order, without gaps"
        high_watermark_before = self.high_watermark
        if entry.kind is EntryKind.DATA:
            result = self._apply_data(entry)
        elif entry.kind is EntryKind.META:
            result = self._apply_meta(entry)
        else:
            result = ApplyResult(index=entry.index, kind=entry.kind)
        self.applied_index = entry.index
        assert self.high_watermark >= high_watermark_before
        return result

    def _apply_data(self, entry: Entry) -> ApplyResult:
        # The batch was validated (CRC, lengths) by the leader before proposing and
        # by storage on every replica before it was stored; only the header is read.
        try:
            header = read_header(entry.payload)
        except InvalidBatchError:
            raise AssertionError("a committed DATA entry holds a validated batch") from None
        stored = self.next_offset
        count = header.record_count
        assert count >= 1
        self.next_offset = Offset(stored + count)
        if self.mirror:
            return self._apply_mirrored(entry, stored, count)
        try:
            decision = self.producers.apply(producer_batch(header), stored)
        except ClientError as error:
            self._skip(stored, count)
            return ApplyResult(index=entry.index, kind=EntryKind.DATA, count=count,
                               stored_base_offset=stored, error=error)  # fmt: skip
        if isinstance(decision, Duplicate):
            assert decision.record_count == count
            assert decision.base_offset < stored
            self._skip(stored, count)
            return ApplyResult(index=entry.index, kind=EntryKind.DATA, count=count,
                               stored_base_offset=stored, base_offset=decision.base_offset,
                               duplicate=True)  # fmt: skip
        assert isinstance(decision, Accept)
        return ApplyResult(index=entry.index, kind=EntryKind.DATA, count=count,
                           stored_base_offset=stored, base_offset=stored)  # fmt: skip

    def _apply_mirrored(self, entry: Entry, stored: Offset, count: int) -> ApplyResult:
        """A source's batch, at the offsets it has there: the source already decided it (its
        producer table is not this one), and leaves it out of reads if it was skipped there."""
        if self.mirror_skips:
            if (stored, count) in self.mirror_skips:
                self._skip(stored, count)
            self.mirror_skips = {s for s in self.mirror_skips if s[0] >= self.next_offset}
        return ApplyResult(index=entry.index, kind=EntryKind.DATA, count=count,
                           stored_base_offset=stored, base_offset=stored)  # fmt: skip

    def _apply_mirror_meta(self, entry: Entry) -> ApplyResult:
        base = ApplyResult(index=entry.index, kind=EntryKind.META)
        try:
            command = decode_mirror_meta(entry.payload)
        except ClientError as error:
            return replace(base, error=error)
        if not self.mirror:
            return replace(base, error=NotAMirror(f"{self.topic}/{self.partition} is not in mirror mode"))
        if isinstance(command, MirrorPromote):
            self.mirror = False
            self.mirror_skips = set()
            return base
        fresh = {r for r in command.ranges if r[0] >= self.next_offset}
        if len(self.mirror_skips | fresh) > SKIPS_PENDING_MAX:
            return replace(base, error=InvalidRequest(f"more than {SKIPS_PENDING_MAX} skipped ranges pending"))
        self.mirror_skips |= fresh
        return replace(base, count=len(fresh))

    def _skip(self, stored: Offset, count: int) -> None:
        if self.skipped_ranges:
            last_base, last_count = self.skipped_ranges[-1]
            assert last_base + last_count <= stored
        self.skipped_ranges.append((stored, count))

    def _apply_meta(self, entry: Entry) -> ApplyResult:
        if is_mirror_meta(entry.payload):
            return self._apply_mirror_meta(entry)
        base = ApplyResult(index=entry.index, kind=EntryKind.META)
        try:
            command = decode_meta(entry.payload)
            if isinstance(command, OffsetsExpire):
                return replace(base, count=self._expire(command))
            if isinstance(command, OffsetsDelete):
                self._delete(command.group)
                return replace(base, count=1)
            self._check_commit(command)
        except ClientError as error:
            return replace(base, error=error)
        before = self.consumer_offsets.pop(command.group, None)
        stamp = command.stamp if command.stamp != NO_STAMP or before is None else before.stamp
        self.consumer_offsets[command.group] = CommittedOffset(
            command.offset, command.metadata, entry.index, command.committed_at_ms, stamp
        )
        return replace(base, base_offset=Offset(command.offset))

    def _expire(self, command: OffsetsExpire) -> int:
        """Remove the listed groups still idle past the retention as of the entry's time
        (one that committed since stays); stamp those of unknown commit time with it, and
        move them to the end of the commit order, as if they had committed then."""
        removed = 0
        for group in command.groups:
            committed = self.consumer_offsets.get(group)
            if committed is None:
                continue
            if committed.committed_at_ms == COMMIT_TIME_UNKNOWN:
                del self.consumer_offsets[group]
                self.consumer_offsets[group] = replace(committed, committed_at_ms=command.as_of_ms)
            elif committed.committed_at_ms < command.expire_before_ms:
                del self.consumer_offsets[group]
                removed += 1
        return removed

    def _delete(self, group: str) -> None:
        if group not in self.consumer_offsets:
            raise UnknownGroup(f"consumer group {group!r} has no offsets in {self.topic}/{self.partition}")
        del self.consumer_offsets[group]

    def check_commit(self, commit: OffsetCommit) -> None:
        """Pre-proposal check of an offset commit (apply checks again, deterministically)."""
        self._check_commit(commit)

    def _check_commit(self, commit: OffsetCommit) -> None:
        if (commit.topic, commit.partition) != (self.topic, self.partition):
            raise InvalidRequest(
                f"commit for {commit.topic}/{commit.partition} sent to "
                f"{self.topic}/{self.partition}"
            )
        if commit.offset > self.high_watermark:
            raise CommitOffsetOutOfRange(commit.offset, self.high_watermark)
        current = self.consumer_offsets.get(commit.group)
        if commit.stamp != NO_STAMP and current is not None and commit.stamp < current.stamp:
            raise StaleOffsetCommit(
                f"a newer commit of group {commit.group!r} set {self.topic}/{self.partition} to "
                f"{current.offset} before this one (to {commit.offset}) arrived; the newer stands"
            )
        known = current is not None
        if not known and len(self.consumer_offsets) >= self.consumer_groups_max:
            raise TooManyConsumerGroups(
                f"partition keeps offsets for at most {self.consumer_groups_max} groups"
            )

    # ---- queries ---------------------------------------------------------------

    def committed_offset(self, group: str) -> CommittedOffset | None:
        return self.consumer_offsets.get(group)

    def idle_groups(self, as_of_ms: int, retention_ms: int, limit: int) -> tuple[str, ...]:
        """What a retention pass as of `as_of_ms` lists (at most `limit`): groups whose
        last commit is older than `as_of_ms - retention_ms`, and groups whose commit time
        is unknown (committed before v2), which the pass stamps instead.

        Bounded work: `consumer_offsets` is in commit (apply) order, which is commit-time
        order up to the clock difference between successive leaders, so the scan stops at
        the first group still inside the retention. A group committed just after a leader
        change to a slower clock waits behind it for at most that difference.
        """
        assert limit >= 1 and retention_ms >= 1
        expire_before_ms = as_of_ms - retention_ms
        found: list[str] = []
        for group, committed in self.consumer_offsets.items():
            unknown = committed.committed_at_ms == COMMIT_TIME_UNKNOWN
            if not unknown and committed.committed_at_ms >= expire_before_ms:
                break
            found.append(group)
            if len(found) == limit:
                break
        return tuple(found)

    def skipped_between(self, start: Offset, end: Offset) -> list[tuple[Offset, int]]:
        """Skipped ranges overlapping [start, end): the read path leaves them out. The ranges
        are in offset order and disjoint (`_skip`), so their ends are in order too: two
        bisections find the span, whatever the number of ranges before or after it."""
        ranges = self.skipped_ranges
        first = bisect.bisect_right(ranges, start, key=lambda r: r[0] + r[1])
        last = bisect.bisect_left(ranges, end, lo=first, key=lambda r: r[0])
        return ranges[first:last]

    def trim_skipped(self, log_start_offset: Offset) -> None:
        """Forget skipped ranges wholly below the log start (retention removed them)."""
        self.skipped_ranges = [(b, n) for b, n in self.skipped_ranges if b + n > log_start_offset]

    # ---- snapshot ----------------------------------------------------------------

    def snapshot(self) -> bytes:
        return encode_snapshot(self)

    @classmethod
    def restore(cls, data: bytes, new_producers: NewProducerTable = ProducerTable) -> PartitionState:
        """The state `data` holds, its producer table built by `new_producers` (as `__init__`)."""
        return decode_snapshot(data, functools.partial(cls, new_producers=new_producers))
