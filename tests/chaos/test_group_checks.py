"""The consumer-group checks (chaos/group_checks.py) on hand-written histories: each
anomaly class caught, and a clean history of members passing."""

from __future__ import annotations

import io
import math

import pytest

from chaos.checker import ANOMALY_CLASSES, CheckResult, check
from chaos.history import (
    AnyOp,
    GroupCommit,
    GroupFetch,
    HistoryError,
    MemberAction,
    Membership,
    MemberView,
    OffsetFetch,
    Outcome,
    PartitionKey,
    PartitionRead,
    Poll,
    Send,
)
from chaos.history_file import parse_history, write_history
from chaos.history_writer import HistoryWriter

OK, FAIL, INFO = Outcome.OK, Outcome.FAIL, Outcome.INFO
P0, P1 = PartitionKey("t", 0), PartitionKey("t", 1)
GROUP = "cg"
SESSION_MS = 3_000


class Groups:
    """Hand-written group histories: each op takes 0.1 s, one after another, unless
    `at=(invoke_s, complete_s)` places it."""

    def __init__(self) -> None:
        self.ops: list[AnyOp] = []
        self.clock = 0.0

    def _common(self, process: int, outcome: Outcome, at: tuple[float, float] | None) -> dict:
        if at is None:
            at = (self.clock, self.clock + 0.1)
            self.clock += 0.2
        return {"index": len(self.ops), "process": process, "invoke_s": at[0], "complete_s": at[1],
                "outcome": outcome}

    def add(self, cls, process, outcome, at, **fields) -> int:
        self.ops.append(cls(**self._common(process, outcome, at), **fields))
        return len(self.ops) - 1

    def send(self, key, values, offsets, *, at=None) -> int:
        return self.add(Send, 0, OK, at, key=key, values=tuple(values), offsets=tuple(offsets))

    def join(self, member, assigned, *, epoch=1, process=1, revoking=(), outcome=OK, at=None, again=False) -> int:
        view = MemberView(member_id=member, epoch=epoch, assigned=tuple(assigned), revoking=tuple(revoking))
        return self.add(Membership, process, outcome, at, group=GROUP, action=MemberAction.JOIN,
                        member_id=member if again else None, topics=("t",), session_timeout_ms=SESSION_MS,
                        rebalance_timeout_ms=10_000, view=view if outcome is OK else None)

    def heartbeat(self, member, owned, assigned, *, epoch=1, told_epoch=None, revoking=(), process=1,
                  outcome=OK, at=None) -> int:
        view = MemberView(member_id=member, epoch=told_epoch or epoch, assigned=tuple(assigned),
                          revoking=tuple(revoking))
        return self.add(Membership, process, outcome, at, group=GROUP, action=MemberAction.HEARTBEAT,
                        member_id=member, epoch=epoch, owned=tuple(owned), view=view if outcome is OK else None)

    def leave(self, member, *, epoch=1, process=1, at=None) -> int:
        return self.add(Membership, process, OK, at, group=GROUP, action=MemberAction.LEAVE, member_id=member,
                        epoch=epoch)

    def fetch(self, member, assigned, records, reads, *, epoch=1, process=1, final=False, at=None) -> int:
        """`records`: (key, offset, value); `reads`: (key, offset, next_offset)."""
        view = MemberView(member_id=member, epoch=epoch, assigned=tuple(assigned))
        return self.add(GroupFetch, process, OK, at, group=GROUP, member_id=member, epoch=epoch, final=final,
                        view=view, records=tuple(records),
                        reads=tuple(PartitionRead(key=k, offset=o, next_offset=n, high_watermark=n)
                                    for k, o, n in reads))

    def commit(self, member, offsets, *, epoch=1, process=1, outcome=OK, admin_reset=False, at=None) -> int:
        return self.add(GroupCommit, process, outcome, at, group=GROUP, member_id=member, epoch=epoch,
                        offsets=tuple(offsets), admin_reset=admin_reset)

    def offsets(self, key, offset, *, process=9, at=None) -> int:
        return self.add(OffsetFetch, process, OK, at, group=GROUP, key=key, offset=offset)

    def final_poll(self, key, records, hw) -> int:
        return self.add(Poll, 99, OK, None, key=key, position=0, final=True, records=tuple(records),
                        high_watermark=hw)

    def check(self) -> CheckResult:
        return check(self.ops)


def only(result: CheckResult, name: str) -> None:
    assert name in ANOMALY_CLASSES
    assert set(result.counts()) == {name}, result.anomalies


def clean() -> Groups:
    """Two members split two partitions, one gives P1 back to the other, then leaves;
    a drain member reads everything at the end."""
    h = Groups()
    h.send(P0, [1, 2], [0, 1])
    h.send(P1, [3, 4], [0, 1])
    h.join("a", [P0, P1], process=1)
    h.fetch("a", [P0, P1], [(P0, 0, 1), (P1, 0, 3)], [(P0, 0, 1), (P1, 0, 1)], process=1)
    h.commit("a", [(P0, 1), (P1, 1)], process=1)
    h.join("b", [], process=2)  # the group moves to epoch 2: P1 goes to b, once a gives it back
    h.heartbeat("a", [P0, P1], [P0], told_epoch=2, revoking=[P1], process=1)
    h.commit("a", [(P1, 1)], epoch=2, process=1)
    h.heartbeat("a", [P0], [P0], epoch=2, process=1)  # the release
    h.heartbeat("b", [], [P1], epoch=1, told_epoch=2, process=2)
    h.fetch("b", [P1], [(P1, 1, 4)], [(P1, 1, 2)], epoch=2, process=2)
    h.commit("b", [(P1, 2)], epoch=2, process=2)
    h.offsets(P1, 2)
    h.fetch("a", [P0], [(P0, 1, 2)], [(P0, 1, 2)], epoch=2, process=1)
    h.commit("a", [(P0, 2)], epoch=2, process=1)
    h.leave("a", epoch=2, process=1)
    h.leave("b", epoch=2, process=2)
    h.offsets(P0, 2)
    h.join("d", [P0, P1], epoch=4, process=3)
    h.fetch("d", [P0, P1], [], [(P0, 2, 2), (P1, 2, 2)], epoch=4, process=3, final=True)
    for key, values in ((P0, [1, 2]), (P1, [3, 4])):
        h.final_poll(key, list(enumerate(values)), 2)
    return h


def test_clean_group_history_passes():
    # Goal: members that split, hand over, commit and leave as KIP-848 says pass every check.
    result = clean().check()
    assert result.valid, result.anomalies
    assert result.stats["group-fetch-ok"] == 4 and result.stats["group-commit-ok"] == 4


def test_a_record_no_member_fetched_is_undelivered():
    # Goal: a commit that moved past a record nobody fetched shows once the drain reads past it.
    h = Groups()
    h.send(P0, [1, 2, 3], [0, 1, 2])
    h.join("a", [P0])
    h.fetch("a", [P0], [(P0, 0, 1)], [(P0, 0, 1)])
    h.commit("a", [(P0, 2)])  # skips offset 1
    h.leave("a")
    h.join("d", [P0], epoch=3, process=3)
    h.fetch("d", [P0], [(P0, 2, 3)], [(P0, 2, 3)], epoch=3, process=3, final=True)
    h.final_poll(P0, [(0, 1), (1, 2), (2, 3)], 3)
    result = h.check()
    only(result, "group-undelivered")
    assert "offsets 1" in result.anomalies[0].explanation


def test_a_drain_short_of_the_acknowledged_records_is_incomplete():
    # Goal: a drain that stopped early is its own verdict, and values above it are not judged.
    h = Groups()
    h.send(P0, [1, 2, 3], [0, 1, 2])
    h.join("d", [P0], process=3)
    h.fetch("d", [P0], [(P0, 0, 1)], [(P0, 0, 1)], process=3, final=True)
    h.final_poll(P0, [(0, 1), (1, 2), (2, 3)], 3)
    only(h.check(), "group-drain-incomplete")


def test_committed_offset_going_back_is_caught():
    # Goal: a fetch of the committed offset below an earlier acknowledged commit is an anomaly.
    h = clean()
    h.offsets(P1, 1)  # after b's commit of 2 (and the earlier fetch of 2) completed
    result = h.check()
    assert set(result.counts()) == {"group-offset-backwards", "committed-offset-nonlinearizable"}


def test_concurrent_or_reset_observations_are_not_backwards():
    # Goal: only real-time order counts, and an admin reset between two observations excuses them.
    h = Groups()
    h.send(P0, [1], [0])
    h.join("a", [P0])
    h.commit("a", [(P0, 5)], at=(1.0, 2.0))
    h.offsets(P0, None, at=(1.5, 1.6))  # concurrent with the commit: fine
    h.commit(None, [(P0, 1)], epoch=None, process=8, admin_reset=True, at=(3.0, 3.1))
    h.offsets(P0, 1, at=(4.0, 4.1))
    result = h.check()
    assert "group-offset-backwards" not in result.counts(), result.anomalies
    h.offsets(P0, 0, at=(5.0, 5.1))  # nothing excuses this one
    assert "group-offset-backwards" in h.check().counts()


def test_two_members_assigned_one_partition_in_one_epoch():
    # Goal: two members told they own P0 at the same member epoch, both alive, is caught.
    h = Groups()
    h.join("a", [P0], epoch=2, process=1, at=(0.0, 0.1))
    h.join("b", [P0], epoch=2, process=2, at=(0.2, 0.3))
    h.heartbeat("a", [P0], [P0], epoch=2, process=1, at=(5.0, 5.1))
    h.heartbeat("b", [P0], [P0], epoch=2, process=2, at=(5.2, 5.3))
    result = h.check()
    assert "group-two-owners-epoch" in result.counts()


def test_the_same_epoch_in_a_later_incarnation_of_the_group_is_fine():
    # Goal: a group that emptied starts again at epoch 1; members that never coexisted are not compared.
    h = Groups()
    h.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))
    h.heartbeat("a", [P0], [P0], epoch=1, process=1, at=(1.0, 1.1))
    h.leave("a", epoch=1, process=1, at=(1.2, 1.3))
    h.join("b", [P0], epoch=1, process=2, at=(2.0, 2.1))
    h.heartbeat("b", [P0], [P0], epoch=1, process=2, at=(3.0, 3.1))
    assert h.check().valid


def test_a_partition_given_before_its_owner_gave_it_back():
    # Goal: b told it owns P0 while a, told it owns P0, has sent no release, left nor expired.
    h = Groups()
    h.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))
    h.join("b", [], epoch=2, process=2, at=(0.2, 0.3))
    h.heartbeat("a", [P0], [], told_epoch=2, revoking=[P0], process=1, at=(0.4, 0.5))
    h.heartbeat("b", [], [P0], epoch=2, process=2, at=(0.6, 0.7))  # a has not given it back yet
    h.heartbeat("a", [], [], epoch=2, process=1, at=(0.8, 0.9))
    only(h.check(), "group-two-owners")


def test_a_partition_given_after_the_release_or_the_session_is_fine():
    # Goal: the new owner may get P0 once the old one's release was invoked, or its session ran out.
    h = Groups()
    h.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))
    h.join("b", [], epoch=2, process=2, at=(0.2, 0.3))
    h.heartbeat("a", [P0], [], told_epoch=2, revoking=[P0], process=1, at=(0.4, 0.5))
    h.heartbeat("a", [], [], epoch=2, process=1, at=(0.6, 0.9))
    h.heartbeat("b", [], [P0], epoch=2, process=2, at=(0.7, 0.8))  # concurrent with the release
    assert h.check().valid
    silent = Groups()
    silent.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))  # then a falls silent
    silent.join("b", [P0], epoch=2, process=2, at=(0.2, 0.3 + SESSION_MS / 1000))
    assert silent.check().valid
    # Seen from the run of seed 2: a member silent past its session (a commit is not a
    # keep-alive) is still answered while the coordinator's expiry waits for its fence.
    raced = Groups()
    raced.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))
    raced.commit("a", [(P0, 0)], process=1, outcome=INFO, at=(0.2, 3.5))
    raced.fetch("a", [P0], [], [], process=1, at=(3.6, 3.7))
    raced.join("b", [P0], epoch=2, process=2, at=(3.8, 3.9))
    assert raced.check().valid
    early = Groups()
    early.join("a", [P0], epoch=1, process=1, at=(0.0, 0.1))
    early.join("b", [P0], epoch=2, process=2, at=(0.2, 0.3))  # well inside a's session
    only(early.check(), "group-two-owners")


def test_records_of_a_partition_the_answer_did_not_assign():
    # Goal: a fetch answer holding records of a partition its own view does not assign is caught.
    h = Groups()
    h.send(P1, [7], [0])
    h.join("a", [P0])
    h.fetch("a", [P0], [(P1, 0, 7)], [(P1, 0, 1)])
    h.final_poll(P1, [(0, 7)], 1)
    assert "group-fetch-unowned" in h.check().counts()


def test_group_reads_join_the_version_order():
    # Goal: a member reading another value at an offset than the log holds is inconsistent-offsets.
    h = Groups()
    h.send(P0, [1], [0])
    h.join("a", [P0])
    h.fetch("a", [P0], [(P0, 0, 2)], [(P0, 0, 1)])
    h.final_poll(P0, [(0, 1)], 1)
    counts = h.check().counts()
    assert "inconsistent-offsets" in counts and "unexpected" in counts


def test_group_ops_round_trip_through_the_file():
    # Goal: the writer's group events read back as the same ops, and `write_history` writes them alike.
    ticks = iter(range(100))
    stream = io.BytesIO()
    writer = HistoryWriter(stream, clock=lambda: float(next(ticks)))
    view = MemberView(member_id="m", epoch=3, assigned=(P0,), revoking=(P1,))
    join = writer.invoke_member(1, GROUP, MemberAction.JOIN, None, topics=("t",), session_timeout_ms=3000,
                                rebalance_timeout_ms=9000)
    writer.ok_member(join, view)
    beat = writer.invoke_member(1, GROUP, MemberAction.HEARTBEAT, "m", epoch=3, owned=[P0])
    writer.info(beat, "OUTCOME_UNKNOWN")
    fetch = writer.invoke_group_fetch(1, GROUP, "m", 3, [(P0, 4)], final=True)
    writer.ok_group_fetch(fetch, view, [(P0, 4, 7), (P0, 5, "probe")],
                          [PartitionRead(key=P0, offset=4, next_offset=6, high_watermark=6)])
    commit = writer.invoke_group_commit(1, GROUP, "m", 3, [(P0, 6)])
    writer.fail(commit, "FENCED_MEMBER_EPOCH")
    leave = writer.invoke_member(1, GROUP, MemberAction.LEAVE, "m", epoch=3)
    writer.ok_member(leave, None)
    ops = parse_history(stream.getvalue().splitlines())
    assert ops[0].view == view and ops[0].topics == ("t",) and ops[0].session_timeout_ms == 3000
    assert ops[1].outcome is INFO and ops[1].owned == (P0,)
    assert ops[2].records == ((P0, 4, 7), (P0, 5, "probe")) and ops[2].final and ops[2].positions == ((P0, 4),)
    assert ops[2].reads[0].next_offset == 6
    assert ops[3].outcome is FAIL and ops[3].offsets == ((P0, 6),)
    assert ops[4].outcome is OK and ops[4].view is None
    rewritten = io.BytesIO()
    write_history(rewritten, ops)
    assert parse_history(rewritten.getvalue().splitlines()) == ops
    assert ops[1].complete_s != math.inf


@pytest.mark.parametrize("fields, message", [
    ({"action": MemberAction.JOIN, "member_id": None, "topics": (), "outcome": FAIL}, "without a subscription"),
    ({"action": MemberAction.HEARTBEAT, "member_id": "m", "epoch": None, "outcome": FAIL},
     "names its member and epoch"),
    ({"action": MemberAction.LEAVE, "member_id": "m", "epoch": 1, "outcome": OK,
      "view": MemberView(member_id="m", epoch=1, assigned=())}, "has a view"),
])
def test_malformed_group_ops_are_history_errors(fields, message):
    # Goal: a group op that breaks its own shape is a HistoryError, never a silent pass.
    with pytest.raises(HistoryError, match=message):
        Membership(index=0, process=1, invoke_s=0.0, complete_s=1.0, group=GROUP, **fields)
