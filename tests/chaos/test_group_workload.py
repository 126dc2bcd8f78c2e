"""The consumer-group workload's own bookkeeping (chaos/group_workload.py), without a cluster."""

from __future__ import annotations

import pytest

from chaos.group_workload import MemberState, group_outcome, view_of
from chaos.history import MemberView, PartitionKey
from multiraft.client import OutcomeUnknownError, RaftlogError

P0, P1, P2 = PartitionKey("t", 0), PartitionKey("t", 1), PartitionKey("u", 2)


def test_view_of_a_member_answer():
    # Goal: the server's member JSON becomes the history's view, partitions sorted.
    answer = {"member_id": "m", "member_epoch": 4, "assignment": [{"topic": "u", "partitions": [2]},
                                                                  {"topic": "t", "partitions": [1, 0]}],
              "revoking": [], "pending": [], "state": "stable"}
    assert view_of(answer) == MemberView(member_id="m", epoch=4, assigned=(P0, P1, P2), revoking=())


def test_positions_kept_only_while_a_partition_stays_held():
    # Goal: a partition that left the member (even to come back) starts again at the group's
    # committed offset: its old position is never sent nor committed again.
    state = MemberState()
    state.learn(MemberView(member_id="m", epoch=1, assigned=(P0, P1)))
    state.positions.update({P0: 5, P1: 7})
    state.committed[P0] = 5
    assert state.to_commit() == [(P1, 7)]
    state.learn(MemberView(member_id="m", epoch=2, assigned=(P0,), revoking=(P1,)))
    assert state.to_commit() == [(P1, 7)]  # a revoked partition is committed before it is given back
    state.learn(MemberView(member_id="m", epoch=2, assigned=(P0,)))
    assert state.positions == {P0: 5}
    state.learn(MemberView(member_id="m", epoch=3, assigned=(P0, P1)))
    assert P1 not in state.positions and state.to_commit() == []
    state.forget(keep_id=True)
    assert state.member_id == "m" and state.positions == {} and state.assigned == ()
    state.forget()
    assert state.member_id is None


@pytest.mark.parametrize("error, outcome", [
    (RaftlogError("FENCED_MEMBER_EPOCH", "fenced", 409), "fail"),
    (RaftlogError("PARTITION_NOT_ASSIGNED", "not yours", 409), "fail"),
    (RaftlogError("UNKNOWN_MEMBER_ID", "gone", 404), "fail"),
    (RaftlogError("NOT_LEADER", "elsewhere", 421), "fail"),
    (RaftlogError("TIMEOUT", "slow", 504), "info"),
    (OutcomeUnknownError("OUTCOME_UNKNOWN", "lost"), "info"),
])
def test_group_refusals_are_definite(error, outcome):
    # Goal: a group call refused before anything changed is `fail`; a lost answer stays `info`.
    assert group_outcome(error) == outcome
