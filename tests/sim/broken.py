"""Deliberately broken cores: the simulator's negative controls.

A simulator that passes every seed proves little unless it also *fails* when the
core is wrong. Each variant below removes one safety rule of Raft; the tests in
`test_negative_controls.py` demand that the simulator catches each within a
bounded number of seeds. They live in tests, never in the shipped core.
"""

from __future__ import annotations

from raftlog.core.raft import RaftCore
from raftlog.core.ready import Ready
from raftlog.messages import Message, MessageType
from raftlog.types import Index, NodeId


class VoteWithoutPersist(RaftCore):
    """Sends a granted vote before the vote is durable (a crash forgets the promise)."""

    def _grant_vote(self, message: Message) -> None:
        if message.type is MessageType.PRE_VOTE:
            super()._grant_vote(message)
            return
        self.vote = message.source
        self.election_elapsed = 0
        self._send(self._message(MessageType.VOTE_RESPONSE, message.source))


class AckBeforePersist(RaftCore):
    """Acknowledges appended entries before they are durable (the leader counts lost entries)."""

    def _acknowledge_append(self, leader: NodeId, index: Index) -> None:
        self._send(self._message(MessageType.APPEND_RESPONSE, leader, index=index))


class CommitOldTermByCounting(RaftCore):
    """Commits any majority-replicated entry, even of an earlier term (Raft figure 8)."""

    def _maybe_commit(self) -> bool:
        from raftlog.core.quorum import committed_index

        match = {node: progress.match for node, progress in self._progress.items()}
        index = committed_index(self.membership.voters, match)
        if index <= self.log.committed:
            return False
        self.log.commit_to(index)
        self._commit_broadcast_pending = True
        return True


class SkipUpToDateCheck(RaftCore):
    """Grants votes without checking that the candidate's log is at least as complete."""

    def _candidate_up_to_date(self, message: Message) -> bool:
        return True


class CampaignWithUnappliedConfig(RaftCore):
    """Campaigns while committed membership changes are unapplied (etcd's `hup` guard removed)."""

    def _has_unapplied_config(self) -> bool:
        return False


class LeaderCountsUnpersistedWrite(RaftCore):
    """A leader counts its own write toward the quorum before that write is durable."""

    def advance(self, ready: Ready, persisted: bool = True) -> None:
        super().advance(ready, persisted)
        if not persisted and self._progress[self.id].maybe_update(self.log.last_index()):
            self._maybe_commit()


BROKEN_CORES: dict[str, type[RaftCore]] = {
    "vote-without-persist": VoteWithoutPersist,
    "ack-before-persist": AckBeforePersist,
    "commit-old-term-by-counting": CommitOldTermByCounting,
    "skip-up-to-date-check": SkipUpToDateCheck,
    "leader-counts-unpersisted-write": LeaderCountsUnpersistedWrite,
    "campaign-with-unapplied-config": CampaignWithUnappliedConfig,
}
