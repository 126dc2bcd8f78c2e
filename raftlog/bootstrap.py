"""The first entries of a new group, identical on every initial voter.

Why entries and not a membership stored beside the log? A replica that joins
later (a learner, a re-replicated partition) starts empty and must be able to
learn the whole membership history from the log alone (or from a snapshot). So
the initial voters are the first CONFIG entries of the log, already committed,
written the same way by every initial voter: their logs agree from index 1.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.messages import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    encode_conf_change,
)
from raftlog.types import Index, NodeId, Term

BOOTSTRAP_TERM = Term(1)


def bootstrap_entries(voters: Iterable[NodeId]) -> tuple[list[Entry], HardState]:
    """Entries 1..N adding each voter (sorted), and the hard state that commits them."""
    ordered = sorted(set(voters))
    assert ordered, "a group starts with at least one voter"
    entries = [
        Entry(
            Index(position + 1),
            BOOTSTRAP_TERM,
            EntryKind.CONFIG,
            encode_conf_change(ConfChange(ConfChangeOp.ADD_VOTER, node)),
        )
        for position, node in enumerate(ordered)
    ]
    hard_state = HardState(term=BOOTSTRAP_TERM, commit=Index(len(entries)))
    return entries, hard_state
