"""When a learner counts as caught up, for the steps that make it a voter.

Promoting a learner (a partition's move, the metadata group's promote and decommission)
waits until it holds the group's log. Asking for its match to equal the commit index
exactly was too strict under steady writes: the commit moves with every append the
voters acknowledge, the learner's acknowledgement arrives a moment after theirs, and a
round that samples in between refuses it, round after round (seen as a promote refused
"not caught up" in tests/node/test_metadata_voters.py). A learner within
`CATCH_UP_SLACK_ENTRIES` of the commit is caught up: promoted, it is sent those few
entries with the next append. Raft's safety never depended on it (a voter may join with
an empty log); what the wait protects is availability, a quorum that would need a voter
still far behind, and a handful of entries costs that quorum one append round.
"""

from __future__ import annotations

CATCH_UP_SLACK_ENTRIES = 16


def caught_up(match: int, commit: int) -> bool:
    """Whether a learner whose log matches the leader's up to `match` may become a voter."""
    return match >= commit - CATCH_UP_SLACK_ENTRIES
