"""The simulator must catch deliberately broken cores (testing the tests).

Each variant in `broken.py` drops one safety rule. Within a bounded number of
seeds of the ordinary random swarm the simulator must report a violation; a
simulator that passes a broken core is too weak to trust when it passes ours.
"""

from __future__ import annotations

import random

import pytest

from tests.sim.broken import BROKEN_CORES
from tests.sim.simulator import FaultMix, SimOptions, Simulation

SEEDS_MAX = 300

# Raft's figure 8 needs leader churn while appends get lost; a swarm limited to those
# fault kinds reaches it in a few seeds instead of a few thousand.
LEADER_CHURN = FaultMix(crash=True, partition=True, loss=True, reorder=True, slow_disk=True)
# A leader's own unsynced write counted toward the quorum is lost by a crash while
# its fsync runs, with the followers' copies lost to drops or not yet written.
ASYNC_LEADER = FaultMix(
    leader_writes_async=True, crash=True, crash_mid_persist=True, slow_disk=True, loss=True, partition=True
)
# A node campaigning under a stale membership needs committed CONFIG entries it has not
# applied yet (slow apply: after a restart it re-applies its whole log) and an election at
# that moment: membership changes in bursts, each commit provoking one, with crashes and
# partitions so that the stale majority is all it can reach.
MEMBERSHIP_RACE = FaultMix(membership_race=True, slow_apply=True, crash=True, partition=True)
FAULTS = {
    "commit-old-term-by-counting": LEADER_CHURN,
    "leader-counts-unpersisted-write": ASYNC_LEADER,
    "campaign-with-unapplied-config": MEMBERSHIP_RACE,
}


def first_caught(name: str) -> tuple[int, str] | None:
    for seed in range(SEEDS_MAX):
        options = SimOptions(core_class=BROKEN_CORES[name], faults=FAULTS.get(name))
        options.nodes = random.Random(seed ^ 0x5EED).choice([3, 3, 5])
        try:
            Simulation(seed, options).run()
        except AssertionError as error:
            return seed, str(error)
    return None


@pytest.mark.sim
@pytest.mark.parametrize("name", sorted(BROKEN_CORES))
def test_broken_core_is_caught(name: str) -> None:
    # Goal: the named broken variant fails some seed below SEEDS_MAX.
    caught = first_caught(name)
    assert caught is not None, f"{name} survived {SEEDS_MAX} seeds: the simulator is too weak"
    print(f"{name}: caught at seed {caught[0]}: {caught[1]}")


@pytest.mark.sim
@pytest.mark.parametrize(
    "faults", [LEADER_CHURN, ASYNC_LEADER, MEMBERSHIP_RACE], ids=["leader-churn", "async-leader", "membership-race"]
)
def test_correct_core_passes_the_same_schedules(faults: FaultMix) -> None:
    # Goal: the focused fault mixes are not themselves false alarms for the real core.
    for seed in range(30):
        Simulation(seed, SimOptions(faults=faults)).run()
