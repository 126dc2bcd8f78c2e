"""Safety invariants of Raft, checked by the simulator as it runs.

Each check raises `InvariantViolation` naming the property, so a failing seed
says *what* broke, not only that something did. The checker sees the cluster
only through what a driver sees (Readys, messages, applied entries) plus a
read-only look at each node's log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, NodeId, Term


class InvariantViolation(AssertionError):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant


@dataclass(slots=True)
class SafetyChecker:
    # Election safety: term -> the one node that led it.
    leaders: dict[Term, NodeId] = field(default_factory=dict)
    # Single vote: (voter, term) -> the candidate it granted its vote to.
    votes: dict[tuple[NodeId, Term], NodeId] = field(default_factory=dict)
    # Log matching (per entry): (index, term) -> (kind, payload) ever written anywhere.
    entries: dict[tuple[Index, Term], tuple[EntryKind, bytes]] = field(default_factory=dict)
    # State machine safety: index -> (term, kind, payload) applied by any node.
    applied: dict[Index, tuple[Term, EntryKind, bytes]] = field(default_factory=dict)
    # Leader completeness: index -> (term in which a leader first committed it, entry term).
    committed: dict[Index, tuple[Term, Term]] = field(default_factory=dict)

    def on_leader(self, node: NodeId, term: Term) -> None:
        holder = self.leaders.setdefault(term, node)
        if holder != node:
            raise InvariantViolation("election-safety", f"nodes {holder} and {node} both led term {term}")

    def on_vote_sent(self, voter: NodeId, term: Term, candidate: NodeId) -> None:
        holder = self.votes.setdefault((voter, term), candidate)
        if holder != candidate:
            raise InvariantViolation(
                "single-vote", f"node {voter} voted for {holder} and {candidate} in term {term}"
            )

    def on_entries_written(self, node: NodeId, entries: tuple[Entry, ...]) -> None:
        for entry in entries:
            key = (entry.index, entry.term)
            value = (entry.kind, entry.payload)
            seen = self.entries.setdefault(key, value)
            if seen != value:
                raise InvariantViolation(
                    "log-matching",
                    f"node {node} wrote {value} at index {entry.index} term {entry.term}; another log has {seen}",
                )

    def on_applied(self, node: NodeId, entry: Entry) -> None:
        value = (entry.term, entry.kind, entry.payload)
        seen = self.applied.setdefault(entry.index, value)
        if seen != value:
            raise InvariantViolation(
                "state-machine-safety",
                f"node {node} applied {value} at index {entry.index}; another node applied {seen}",
            )

    def on_leader_commit(self, term: Term, entries: dict[Index, Term]) -> None:
        """A leader of `term` advanced its commit index over `entries` (index -> entry term)."""
        for index, entry_term in entries.items():
            seen = self.committed.setdefault(index, (term, entry_term))
            if seen[1] != entry_term:
                raise InvariantViolation(
                    "commit-safety", f"index {index} committed with terms {seen[1]} and {entry_term}"
                )

    def check_leader_completeness(
        self, node: NodeId, term: Term, term_at: dict[Index, Term | None], first: Index
    ) -> None:
        """A leader of `term` holds every entry committed in an earlier term (Raft 5.4)."""
        for index, (commit_term, entry_term) in self.committed.items():
            if commit_term >= term or index < first:
                continue  # later commits bind only later leaders; a snapshot holds committed state
            if term_at.get(index) != entry_term:
                raise InvariantViolation(
                    "leader-completeness",
                    f"node {node} leads term {term} without entry {index} (term {entry_term}) "
                    f"committed in term {commit_term}",
                )

    @staticmethod
    def check_log_matching(logs: dict[NodeId, dict[Index, tuple[Term, bytes]]]) -> None:
        """If two logs agree on an entry's term, they agree on every entry before it."""
        nodes = sorted(logs)
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                log_a, log_b = logs[a], logs[b]
                common = [ix for ix in log_a if ix in log_b and log_a[ix][0] == log_b[ix][0]]
                if not common:
                    continue
                top = max(common)
                for ix in range(top, 0, -1):
                    if ix not in log_a or ix not in log_b:
                        break  # below one node's snapshot
                    if log_a[ix] != log_b[ix]:
                        raise InvariantViolation(
                            "log-matching",
                            f"nodes {a} and {b} agree at index {top} but differ at {ix}",
                        )
