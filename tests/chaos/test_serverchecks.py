"""The replica comparison (chaos/serverchecks.py) against fake debug endpoints and a
fake clock: it compares the whole committed log, waits for a lagging replica, and
reports one that never catches up instead of comparing less."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from chaos.serverchecks import DebugOff, StuckReplica, compare_replicas

GROUP = 5
VOTERS = (1, 2, 3)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeSource:
    """One group on three nodes. `commits(now)` gives each node's commit index; each
    node's log is a list of entry payloads (the digest hashes a prefix of it)."""

    def __init__(self, clock: FakeClock, commits: Callable[[float], dict[int, int]],
                 logs: dict[int, list[str]], *, silent: frozenset[int] = frozenset(),
                 starts: dict[int, int] | None = None) -> None:
        self.clock, self.commits, self.logs, self.silent = clock, commits, logs, silent
        self.starts = starts or {}  # a node's first index held (1 unless given)
        self.digests_asked: list[tuple[int, int]] = []  # (node, upto)
        self.digests_from: list[int] = []

    def views(self) -> dict[int, list[dict[str, Any]]]:
        commits = self.commits(self.clock.now)
        return {node: [{"group_id": GROUP, "commit_index": commit, "log_start_index": self.starts.get(node, 1),
                        "voters": list(VOTERS)}]
                for node, commit in commits.items() if node not in self.silent}

    def digest(self, node: int, group: int, upto: int, start: int = 1) -> str | None:
        self.digests_asked.append((node, upto))
        self.digests_from.append(start)
        log = self.logs[node]
        if upto > len(log) or start < self.starts.get(node, 1):
            return None  # the real route refuses a start below the first index held
        return hashlib.sha256("|".join(log[start - 1:upto]).encode()).hexdigest()


def entries(count: int, *, diverge_from: int | None = None) -> list[str]:
    return [f"e{i}" if diverge_from is None or i < diverge_from else f"x{i}" for i in range(1, count + 1)]


def test_a_lagging_replica_is_waited_for_and_the_whole_log_compared():
    # Goal: replica 3 is at commit 5 while the others are at 10; it catches up at t=3 s.
    # The comparison waits for it and hashes all three up to 10 (the old one hashed up
    # to min(commit) = 5 and said nothing about entries 6..10).
    clock = FakeClock()
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 5 if now < 3.0 else 10},
                        {n: entries(10) for n in VOTERS})
    result = compare_replicas(source, catch_up_s=20.0, clock=clock, sleep=clock.sleep)
    assert (result.compared, result.identical, result.stuck, result.mismatched) == (1, 1, [], [])
    assert result.upto == {GROUP: 10}
    assert sorted(source.digests_asked) == [(1, 10), (2, 10), (3, 10)]
    assert 3.0 <= clock.now < 20.0


def test_a_replica_that_never_catches_up_is_its_own_finding():
    # Goal: replica 3 stays at commit 5. After the bound it is reported as stuck (with the
    # numbers), the group is not counted identical, and the other two are still compared
    # over the whole log: a divergence at entries 6..10 between them is found, which
    # comparing up to the lowest commit (5) hid.
    clock = FakeClock()
    logs = {1: entries(10), 2: entries(10, diverge_from=7), 3: entries(5)}
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 5}, logs)
    result = compare_replicas(source, catch_up_s=20.0, clock=clock, sleep=clock.sleep)
    assert result.stuck == [StuckReplica(group=GROUP, node=3, commit_index=5, target=10)]
    assert result.stuck[0].explanation() == "replica 3 of group 5 stuck at commit 5 < 10"
    assert result.identical == 0
    [mismatch] = result.mismatched
    assert mismatch["upto"] == 10 and set(mismatch["digests"]) == {1, 2}
    assert clock.now >= 20.0
    details = result.details()
    assert details["stuck"] == ["replica 3 of group 5 stuck at commit 5 < 10"]


def test_a_voter_that_reports_nothing_is_stuck():
    # Goal: a replica that never answers is behind, not left out of the count.
    clock = FakeClock()
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 10}, {n: entries(10) for n in VOTERS},
                        silent=frozenset({3}))
    result = compare_replicas(source, catch_up_s=5.0, clock=clock, sleep=clock.sleep)
    assert result.stuck == [StuckReplica(group=GROUP, node=3, commit_index=None, target=10)]
    assert "did not report the group" in result.stuck[0].explanation()
    assert result.identical == 0 and result.mismatched == []


def test_a_copy_outside_the_membership_need_not_catch_up():
    # Goal: a node still holding a group it was moved off (not a voter any more) is
    # neither waited for nor reported; the members are.
    clock = FakeClock()
    logs = {n: entries(10) for n in VOTERS} | {4: entries(3)}
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 10, 4: 3}, logs)
    result = compare_replicas(source, catch_up_s=20.0, clock=clock, sleep=clock.sleep)
    assert (result.identical, result.stuck, result.mismatched, clock.now) == (1, [], [], 0.0)


def test_identical_replicas_at_the_same_commit_pass_at_once():
    # Goal: the common case costs no waiting.
    clock = FakeClock()
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 10}, {n: entries(10) for n in VOTERS})
    result = compare_replicas(source, catch_up_s=20.0, clock=clock, sleep=clock.sleep)
    assert (result.identical, result.stuck, result.mismatched, clock.now) == (1, [], [], 0.0)


def test_debug_endpoints_off_is_an_error_not_a_pass():
    # Goal: nodes without RAFTLOG_CHAOS_DEBUG give nothing to compare, and the result says why.
    class Off(FakeSource):
        def views(self) -> dict[int, list[dict[str, Any]]]:
            raise DebugOff("debug endpoints: 404")

    clock = FakeClock()
    result = compare_replicas(Off(clock, lambda now: {}, {}), clock=clock, sleep=clock.sleep)
    assert (result.compared, result.identical, result.error) == (0, 0, "debug endpoints: 404")


def test_logs_that_begin_at_a_start_point_are_compared_from_the_first_index_all_hold():
    # Goal: a mirror partition's replicas all begin at a start point (index 4): they are
    # compared from there, not reported "incomparable" (which passed a sink whose
    # second copy differed); a replica that took a snapshot further on moves the
    # comparison to its first index; a start past the commit is no comparison at all.
    clock = FakeClock()
    same = compare_replicas(FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 10}, {n: entries(10) for n in VOTERS},
                                       starts={1: 4, 2: 4, 3: 4}), catch_up_s=5.0, clock=clock, sleep=clock.sleep)
    assert (same.compared, same.identical, same.incomparable, same.mismatched) == (1, 1, [], [])
    logs = {1: entries(10), 2: entries(10, diverge_from=8), 3: entries(10)}
    source = FakeSource(clock, lambda now: {1: 10, 2: 10, 3: 10}, logs, starts={1: 4, 2: 4, 3: 6})
    differ = compare_replicas(source, catch_up_s=5.0, clock=clock, sleep=clock.sleep)
    assert differ.identical == 0 and differ.mismatched[0]["from"] == 6 and set(source.digests_from) == {6}
    past = compare_replicas(FakeSource(clock, lambda now: {1: 3, 2: 3, 3: 3}, {n: entries(3) for n in VOTERS},
                                       starts={1: 4, 2: 4, 3: 4}), catch_up_s=5.0, clock=clock, sleep=clock.sleep)
    assert past.identical == 0 and "past the commit 3" in past.incomparable[0]["reason"]
