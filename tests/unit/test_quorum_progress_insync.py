"""Pure helpers of the core: quorum arithmetic, follower progress, in-sync tracking."""

from __future__ import annotations

import pytest

from raftlog.core.insync import InSyncTracker
from raftlog.core.progress import Inflights, Progress, ProgressState
from raftlog.core.quorum import VoteResult, committed_index, has_quorum, majority, vote_result
from raftlog.types import Index, NodeId

N = NodeId


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        ({1: 5}, 5),
        ({1: 5, 2: 3, 3: 4}, 4),
        ({1: 5, 2: 3, 3: 0}, 3),
        ({1: 9, 2: 9, 3: 1, 4: 1}, 1),  # 4 voters need 3
        ({1: 9, 2: 8, 3: 7, 4: 1, 5: 1}, 7),
    ],
)
def test_committed_index_is_the_majority_match(matches: dict[int, int], expected: int) -> None:
    # Goal: commit index = the largest index a majority of voters hold.
    assert committed_index([N(v) for v in matches], {N(k): Index(m) for k, m in matches.items()}) == expected


def test_learners_do_not_count() -> None:
    # Goal: only voters' matches count; a learner's progress is ignored.
    assert committed_index([N(1), N(2), N(3)], {N(1): Index(9), N(4): Index(9)}) == 0


@pytest.mark.parametrize(
    ("votes", "result"),
    [
        ({1: True}, VoteResult.PENDING),
        ({1: True, 2: True}, VoteResult.WON),
        ({1: True, 2: False, 3: False}, VoteResult.LOST),
        ({1: True, 2: False}, VoteResult.PENDING),
    ],
)
def test_vote_result(votes: dict[int, bool], result: VoteResult) -> None:
    assert vote_result(frozenset({N(1), N(2), N(3)}), {N(k): v for k, v in votes.items()}) is result


def test_majority_and_has_quorum() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert has_quorum(frozenset({N(1), N(2), N(3)}), [N(1), N(3), N(9)])
    assert not has_quorum(frozenset({N(1), N(2), N(3)}), [N(1), N(9)])


def _progress() -> Progress:
    return Progress(match=Index(0), next=Index(11), inflights=Inflights(messages_max=2, bytes_max=100))


def test_probe_sends_one_then_pauses() -> None:
    # Goal: in PROBE the leader has at most one append outstanding.
    progress = _progress()
    assert not progress.is_paused()
    progress.sent_entries(Index(12), 10)
    assert progress.is_paused()
    assert progress.maybe_update(Index(12))
    assert not progress.is_paused()


def test_replicate_window_bounds_messages_and_bytes() -> None:
    # Goal: REPLICATE streams appends until the in-flight window is full, by count or bytes.
    progress = _progress()
    progress.become_replicate()
    progress.sent_entries(Index(1), 10)
    progress.sent_entries(Index(2), 10)
    assert progress.is_paused(), "two messages fill a window of two"
    progress.inflights.free_up_to(1)
    assert not progress.is_paused()
    progress.sent_entries(Index(3), 200)
    assert progress.is_paused(), "bytes fill it too"


def test_rejection_backs_off_using_the_hint() -> None:
    # Goal: fast backtracking jumps to the hint, never below match + 1, and ignores stale answers.
    progress = _progress()
    assert not progress.maybe_decrease_to(Index(5), Index(2)), "not the probe we sent"
    assert progress.maybe_decrease_to(Index(10), Index(3))
    assert progress.next == 4
    progress.maybe_update(Index(3))
    progress.become_replicate()
    assert not progress.maybe_decrease_to(Index(2), Index(0)), "answer to an old append"
    assert progress.state is ProgressState.REPLICATE


def test_in_sync_follower_slow_during_a_burst_stays_in() -> None:
    # Goal: a follower that lags during a burst but catches up to some recent tick stays in the ISR.
    tracker = InSyncTracker(lag_ticks=10)
    tracker.reset(0, in_sync=[N(2)], others=[])
    for now in range(1, 40):
        tracker.sample(now, Index(now * 100))  # the leader appends 100 entries per tick
        tracker.record_match(N(2), Index((now - 3) * 100), now, Index(now * 100))  # always 3 ticks behind
        assert N(2) in tracker.in_sync(now), f"dropped at tick {now}"


def test_in_sync_follower_stuck_leaves_after_the_lag_time() -> None:
    # Goal: a follower that stops acknowledging leaves the ISR after exactly the lag time.
    tracker = InSyncTracker(lag_ticks=10)
    tracker.reset(0, in_sync=[N(2)], others=[N(3)])
    assert tracker.in_sync(0) == {N(2)}
    assert tracker.out_of_sync(0) == {N(3)}, "learners start out of sync"
    for now in range(1, 12):
        tracker.sample(now, Index(now))
    assert N(2) in tracker.in_sync(10)
    assert N(2) not in tracker.in_sync(11)
    tracker.record_match(N(2), Index(11), 11, Index(11))
    assert N(2) in tracker.in_sync(11), "catching up brings it back"


def test_lag_ticks_count_from_the_last_catch_up_or_the_leadership_start() -> None:
    # Goal: the time lag a metric shows is the one the ISR rule compares with the lag time;
    # a node never caught up in this leadership lags at least since the leadership began.
    tracker = InSyncTracker(lag_ticks=10)
    tracker.reset(5, in_sync=[N(2)], others=[N(3)])
    for now in range(6, 20):
        tracker.sample(now, Index(now))
    assert tracker.lag_ticks(N(2), 19) == 14
    assert tracker.lag_ticks(N(3), 19) == 14, "from the leadership start, not from NEVER"
    tracker.record_match(N(2), Index(12), 19, Index(19))  # covers the last index as sampled at tick 12
    assert tracker.lag_ticks(N(2), 19) == 7
    tracker.record_match(N(2), Index(19), 19, Index(19))
    assert tracker.lag_ticks(N(2), 19) == 0


def test_a_follower_that_lost_entries_is_out_until_it_caught_up_again() -> None:
    # Goal: a follower known to have lost entries it acknowledged leaves the ISR at once,
    # however recently it was caught up; catching up to where the leader's log stood
    # before the loss does not bring it back, catching up to it since the loss does.
    tracker = InSyncTracker(lag_ticks=10)
    tracker.reset(0, in_sync=[N(2), N(3)], others=[])
    for now in range(1, 6):
        tracker.sample(now, Index(now * 10))  # the leader's log: 10, 20, ..., 50
        tracker.record_match(N(2), Index(now * 10), now, Index(now * 10))
    assert tracker.in_sync(5) == {N(2), N(3)}
    tracker.lost(N(2), 5)
    assert tracker.in_sync(5) == {N(3)}, "out at once"
    assert N(2) in tracker.out_of_sync(5)
    tracker.sample(6, Index(60))
    tracker.record_match(N(2), Index(40), 6, Index(60))  # covers tick 4's log: before the loss
    assert N(2) not in tracker.in_sync(6), "caught up to a log older than the loss: still short"
    assert tracker.lag_ticks(N(2), 6) == 1, "the lag still counts from its last catch-up"
    tracker.record_match(N(2), Index(50), 6, Index(60))  # covers tick 5's log: the loss's tick
    assert tracker.in_sync(6) == {N(2), N(3)}, "back in"
    tracker.lost(N(3), 6)
    tracker.remove(N(3))
    tracker.add(N(3))
    assert N(3) not in tracker.in_sync(6), "a member added again starts out"
    tracker.lost(N(2), 6)
    tracker.reset(7, in_sync=[N(2)], others=[])
    assert tracker.in_sync(7) == {N(2)}, "a new leadership starts from its own view"
