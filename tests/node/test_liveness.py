"""Peer liveness: heard frames, the start-up grace, and the leaders table from pings."""

from __future__ import annotations

import pytest

from multiraft.runtime.liveness import LEADER_ENTRY, LEADERS_EVERY_PINGS, PeerLiveness
from raftlog.types import GroupId
from raftlog.wire import WireError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_not_heard_yet_is_live_for_one_silence_period_after_start():
    # Goal: a slower-starting peer is not "silent" at once (forwarded writes to it
    # failed as outcome-unknown); after the period it is, unless it was heard.
    clock = Clock()
    liveness = PeerLiveness(silence_s=1.0, clock=clock)
    assert liveness.is_live(2) and liveness.silent([2, 3]) == set()
    clock.now += 0.6
    liveness.heard(3)
    clock.now += 0.6
    assert not liveness.is_live(2) and liveness.is_live(3)
    assert liveness.silent([2, 3]) == {2}
    clock.now += 1.0
    assert liveness.silent([2, 3]) == {2, 3}



def test_silence_can_be_asked_for_over_several_periods():
    # Goal: quiet groups wake only after a longer silence than "not live" takes (the
    # node's WAKE_SILENCE_PERIODS), so a stall shorter than that wakes nothing.
    clock = Clock()
    liveness = PeerLiveness(silence_s=1.0, clock=clock)
    liveness.heard(2)
    clock.now += 1.5
    assert not liveness.is_live(2) and liveness.silent([2]) == {2}
    assert liveness.silent([2], periods=2) == set()
    clock.now += 0.6
    assert liveness.silent([2], periods=2) == {2}

def test_a_gone_peer_is_silent_at_once_until_heard_again():
    # Goal: a peer whose raft port refuses connections (its process is gone) counts as
    # silent now, not a silence period later (calls waiting on it fail at once), and a
    # frame from it makes it live again.
    clock = Clock()
    liveness = PeerLiveness(silence_s=1.0, clock=clock)
    liveness.heard(2)
    liveness.gone(2)
    assert not liveness.is_live(2) and liveness.silent([2], periods=2) == {2}
    clock.now += 0.1
    liveness.heard(2)
    assert liveness.is_live(2) and liveness.silent([2]) == set()


def test_leaders_list_rides_every_tenth_ping_and_replaces_the_senders_entries():
    # Goal: the list is built only when sent; a newer list from a node replaces its
    # old claims; a claim with a lower term does not beat another node's.
    liveness = PeerLiveness(silence_s=1.0, clock=Clock())
    asked = []

    def led():
        asked.append(1)
        return [(GroupId(7), 3)]

    bodies = [liveness.next_ping(led) for _ in range(LEADERS_EVERY_PINGS)]
    assert bodies[:-1] == [b""] * (LEADERS_EVERY_PINGS - 1) and len(asked) == 1
    assert bodies[-1] == LEADER_ENTRY.pack(7, 3)
    liveness.on_leaders(2, LEADER_ENTRY.pack(7, 3) + LEADER_ENTRY.pack(8, 3))
    liveness.on_leaders(3, LEADER_ENTRY.pack(8, 2))
    assert liveness.leader_heard(GroupId(7)) == 2 and liveness.leader_heard(GroupId(8)) == 2
    liveness.on_leaders(2, LEADER_ENTRY.pack(7, 3))  # node 2 no longer leads group 8
    liveness.on_leaders(3, LEADER_ENTRY.pack(8, 4))
    assert liveness.leader_heard(GroupId(8)) == 3 and liveness.leader_heard(GroupId(9)) == 0
    with pytest.raises(WireError):
        liveness.on_leaders(2, b"\x00" * 5)


def test_the_leaders_version_moves_only_when_what_a_peer_leads_changes() -> None:
    # The balancer skips rounds at rest keyed on this version: a ping repeating the same
    # list must not move it (an idle cluster would never rest), a changed one must.
    liveness = PeerLiveness(silence_s=1.0, clock=Clock())
    same = LEADER_ENTRY.pack(5, 2) + LEADER_ENTRY.pack(6, 3)
    liveness.on_leaders(2, same)
    version = liveness.leaders_version
    liveness.on_leaders(2, same)
    assert liveness.leaders_version == version
    liveness.on_leaders(2, LEADER_ENTRY.pack(5, 2))  # group 6 no longer led by node 2
    assert liveness.leaders_version == version + 1
    liveness.on_leaders(3, LEADER_ENTRY.pack(5, 3))  # node 3 leads group 5 in a later term
    assert liveness.leaders_version == version + 2 and liveness.leader_heard(5) == 3
