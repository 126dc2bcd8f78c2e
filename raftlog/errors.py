"""Errors a caller of the core (and later, a client) can see, each with a code.

Operating conditions are exceptions; broken invariants are assertions and never
appear here. "Definitely not applied" (`ProposalDropped`, `NotLeader`) is kept
apart from "outcome unknown" (`OutcomeUnknown`): a client may blindly retry the
first kind, but must deduplicate (idempotent producer) to retry the second.
The HTTP layer maps `code` and `http_status` to its one error shape.
"""

from __future__ import annotations

from raftlog.types import NO_NODE, NodeId


class ClientError(Exception):
    code = "INTERNAL"
    http_status = 500
    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotLeader(ClientError):
    code = "NOT_LEADER"
    http_status = 421
    retriable = True

    def __init__(self, leader_hint: NodeId = NO_NODE, message: str = "") -> None:
        super().__init__(message or f"not the leader (leader hint: {leader_hint or 'unknown'})")
        self.leader_hint = leader_hint


class LeaderNotAvailable(NotLeader):
    """Not the leader, and no leader is known to name or forward to: an election is
    under way, or this replica has lost touch with the others. Retry after a moment.

    Its own code because the contract answers it 503 where a refusal naming the
    leader is 421 (DESIGN.md section 6; Kafka's LEADER_NOT_AVAILABLE): a client has
    nowhere to go but to wait. The core raises plain `NotLeader(NO_NODE)`; the
    boundary (`multiraft.errors.answered`) gives it this code.
    """

    code = "LEADER_NOT_AVAILABLE"
    http_status = 503

    def __init__(self, message: str = "") -> None:
        super().__init__(NO_NODE, message or "no leader known yet (an election may be under way); retry")


class ProposalDropped(ClientError):
    """Refused before it entered the log: safe to retry."""

    code = "PROPOSAL_DROPPED"
    http_status = 503
    retriable = True


class LeadershipTransferInProgress(ProposalDropped):
    code = "LEADERSHIP_TRANSFER_IN_PROGRESS"


class MembershipChangeInProgress(ClientError):
    code = "MEMBERSHIP_CHANGE_IN_PROGRESS"
    http_status = 409
    retriable = True


class InvalidMembershipChange(ClientError):
    code = "INVALID_MEMBERSHIP_CHANGE"
    http_status = 400


class OutcomeUnknown(ClientError):
    """The proposal may or may not commit (leadership was lost after it was appended)."""

    code = "OUTCOME_UNKNOWN"
    http_status = 504
    retriable = False


class NotEnoughReplicas(ClientError):
    code = "NOT_ENOUGH_REPLICAS"
    http_status = 503
    retriable = True
