"""Majority arithmetic: the only place that knows what a quorum is."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

from raftlog.types import Index, NodeId


class VoteResult(enum.Enum):
    PENDING = 0
    WON = 1
    LOST = 2


def majority(voter_count: int) -> int:
    return voter_count // 2 + 1


def committed_index(voters: Iterable[NodeId], match: Mapping[NodeId, Index]) -> Index:
    """The largest index that a majority of voters hold (0 with no voters)."""
    matches = sorted((match.get(v, Index(0)) for v in voters), reverse=True)
    if not matches:
        return Index(0)
    return matches[majority(len(matches)) - 1]


def vote_result(voters: frozenset[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    needed = majority(len(voters))
    if granted >= needed:
        return VoteResult.WON
    if len(voters) - rejected < needed:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: frozenset[NodeId], acks: Iterable[NodeId]) -> bool:
    return len(voters.intersection(acks)) >= majority(len(voters))
