"""The coordinator's fence between member commits and the partitions they release.

A member's offset commit is checked at the coordinator (the member is current and
owns the partition) and then written through the partition's own group, two steps
apart. Without a fence a commit that passed the check could land after the
partition went to another member. So the coordinator counts the commits it has in
flight per (group, partition), and before it proposes anything that releases
partitions (a heartbeat acknowledging a revocation, a leave, an expiry) it marks
them *releasing*: new commits for them are refused (`PARTITION_NOT_ASSIGNED`, the
member is giving them back), and it waits until the ones in flight have ended, at
most `RELEASE_WAIT_S`. A well-behaved member commits, waits for the answer, then
acknowledges, and never meets the fence.

Both sides are bounded, so the bound holds: a commit's writes run at most
`COMMIT_WRITE_S` (past it the commit answers `TIMEOUT`: it may still land), less
than a release waits, so a release finds them ended; should one still run (the
event loop stalled), the release is refused (`PROPOSAL_DROPPED`, retriable: nothing
was proposed) rather than going on past a commit in flight.

What the fence cannot see: commits in flight from a previous coordinator (the
state lives in this process's memory). A new coordinator gives every member a full
session timeout, so only a member that acknowledges a revocation to the new
coordinator while its own commit through the old one is still in flight can race.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

from multiraft.errors import PartitionNotAssigned, Timeout
from raftlog.errors import ProposalDropped

TopicPartition = tuple[str, int]
Key = tuple[str, str, int]  # (group, topic, partition)
# How long a commit's writes may run (one forwarded write's RPC bound, less a margin)...
COMMIT_WRITE_S = 4.0
# ...and how long a release waits for them: longer, so it finds them ended.
RELEASE_WAIT_S = COMMIT_WRITE_S + 1.0


class CommitFence:
    def __init__(self, commit_write_s: float = COMMIT_WRITE_S, release_wait_s: float = RELEASE_WAIT_S) -> None:
        assert 0 < commit_write_s < release_wait_s, "a release must outwait every commit"
        self._commit_write_s = commit_write_s
        self._release_wait_s = release_wait_s
        self._in_flight: dict[Key, int] = {}
        self._releasing: dict[Key, int] = {}
        self._changed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def committing(self, group: str, partitions: Iterable[TopicPartition]) -> AsyncIterator[None]:
        """Hold these partitions as committed-to while the block writes; refused while any is
        releasing. The block runs at most `commit_write_s` (then `Timeout`: the outcome of
        its writes is unknown)."""
        keys = [(group, topic, partition) for topic, partition in partitions]
        for key in keys:
            if key in self._releasing:
                raise PartitionNotAssigned(f"{key[1]}/{key[2]} is being given back by its member: "
                                           "commit before acknowledging the revocation")
        for key in keys:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            async with asyncio.timeout(self._commit_write_s):
                yield
        except TimeoutError:
            raise Timeout(f"the commit's writes took over {self._commit_write_s} s; they may still land") from None
        finally:
            for key in keys:
                left = self._in_flight[key] - 1
                if left:
                    self._in_flight[key] = left
                else:
                    del self._in_flight[key]
            self._wake()

    @contextlib.asynccontextmanager
    async def releasing(self, group: str, partitions: Iterable[TopicPartition]) -> AsyncIterator[None]:
        """Refuse new commits for these partitions and wait for those in flight (bounded);
        `ProposalDropped` (retriable) when some did not end in time: the release must
        not be proposed."""
        keys = [(group, topic, partition) for topic, partition in partitions]
        for key in keys:
            self._releasing[key] = self._releasing.get(key, 0) + 1
        try:
            try:
                async with asyncio.timeout(self._release_wait_s):
                    while any(key in self._in_flight for key in keys):
                        await self._wait()
            except TimeoutError:
                raise ProposalDropped("commits of the partitions given back are still in flight; retry") from None
            yield
        finally:
            for key in keys:
                left = self._releasing[key] - 1
                if left:
                    self._releasing[key] = left
                else:
                    del self._releasing[key]

    def in_flight(self) -> int:
        return sum(self._in_flight.values())

    async def _wait(self) -> None:
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
