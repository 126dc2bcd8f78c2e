"""A group's waiters: the futures its callers hold, and when each resolves.

A proposal resolves when its entry is applied; if another entry lands at its index
it fails with `ProposalDropped` (it definitely did not apply); if this node stops
leading first, it fails with `OutcomeUnknown` (it may still commit), never
silently. A read resolves once the state machine applied its read index; an
acks=leader write once the leader's own copy is durable; an acks=all write once
every in-sync replica holds it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftlog.errors import ClientError, ProposalDropped
from raftlog.messages import Entry, ReadState, Role
from raftlog.types import Index, Term

if TYPE_CHECKING:
    from raftlog.core.raft import RaftCore


@dataclass(slots=True)
class Proposal:
    term: Term
    future: asyncio.Future[Any]
    began: float = 0.0  # time.perf_counter() when proposed


class Waiters:
    def __init__(self) -> None:
        self.proposals: dict[Index, Proposal] = {}
        self.reads: dict[bytes, asyncio.Future[Index]] = {}  # by read context, until the core answers
        self.ready_reads: list[tuple[Index, asyncio.Future[Index]]] = []  # until applied reaches the index
        # acks=leader writes: (last index, waiter, (first index, term) to answer with).
        self.persisted: list[tuple[Index, asyncio.Future[tuple[Index, Term]], tuple[Index, Term]]] = []
        self.in_sync: list[tuple[Index, asyncio.Future[None]]] = []  # acks=all writes

    def proposed(
        self, term: Term, first: Index, futures: list[asyncio.Future[Any]],
        persisted: asyncio.Future[tuple[Index, Term]], began: float,
    ) -> None:
        """The core took a proposal of len(futures) entries from `first`, in `term`."""
        for offset, future in enumerate(futures):
            self.proposals[Index(first + offset)] = Proposal(term, future, began)
        self.persisted.append((Index(first + len(futures) - 1), persisted, (first, term)))

    @staticmethod
    def refuse(futures: list[asyncio.Future[Any]], error: ClientError) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def resolve(self, entry: Entry, result: Any) -> Proposal | None:
        """`entry` was applied with `result`: its proposal's outcome (the proposal, if it
        was this node's and resolved with the result)."""
        proposal = self.proposals.pop(entry.index, None)
        if proposal is None or proposal.future.done():
            return None
        if proposal.term == entry.term:
            proposal.future.set_result(result)
            return proposal
        proposal.future.set_exception(ProposalDropped("another entry took this proposal's place"))
        return None

    def read_ready(self, read_state: ReadState) -> None:
        future = self.reads.pop(read_state.context, None)
        if future is not None and not future.done():
            self.ready_reads.append((read_state.index, future))

    def release_persisted(self, stable_index: Index) -> None:
        waiting = []
        for index, future, answer in self.persisted:
            if future.done():
                continue
            if index <= stable_index:
                future.set_result(answer)
            else:
                waiting.append((index, future, answer))
        self.persisted = waiting

    def release_in_sync(self, held: Index) -> None:
        """acks=all: release writes every in-sync replica holds (through `held`)."""
        waiting = []
        for index, future in self.in_sync:
            if future.done():
                continue
            if index <= held:
                future.set_result(None)
            else:
                waiting.append((index, future))
        self.in_sync = waiting

    def serve_reads(self, applied: Index) -> None:
        waiting = []
        for index, future in self.ready_reads:
            if future.done():
                continue
            if index <= applied:
                future.set_result(index)
            else:
                waiting.append((index, future))
        self.ready_reads = waiting

    def fail_reads(self, error: ClientError) -> None:
        """Reads the core has not answered yet (this replica stopped leading)."""
        for future in self.reads.values():
            if not future.done():
                future.set_exception(error)
        self.reads.clear()

    def fail_all(self, error: ClientError) -> None:
        for proposal in self.proposals.values():
            if not proposal.future.done():
                proposal.future.set_exception(error)
        self.proposals.clear()
        self.fail_reads(error)
        for future in [
            *(f for _, f in self.ready_reads),
            *(f for _, f, _ in self.persisted),
            *(f for _, f in self.in_sync),
        ]:
            if not future.done():
                future.set_exception(error)
        self.ready_reads.clear()
        self.persisted.clear()
        self.in_sync.clear()


def release_in_sync_writes(core: RaftCore, waiters: Waiters) -> None:
    """acks=all: release the writes every in-sync replica has acknowledged (a leader's)."""
    if core.role is not Role.LEADER:
        return
    holders = [core.progress(node) for node in core.in_sync_replicas()]
    waiters.release_in_sync(min((p.match for p in holders if p is not None), default=Index(0)))
