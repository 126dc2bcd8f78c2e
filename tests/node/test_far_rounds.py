"""Far-horizon rounds (multiraft/node/catchup_leader.py `round`).

Goal (review L2): a fast round (PROBING_ROUND_S, while a follower that answers is probed)
visits only the groups the last full round found probing, not every awake group the node
leads; a full round visits them all and finds the probing ones again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import structlog

from multiraft.node import catchup_leader
from multiraft.node.catchup_leader import CatchUpLeader
from raftlog.core.progress import ProgressState


class _Visits(dict):  # type: ignore[type-arg]
    """registry.groups, counting which groups a round looked at."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.visited: list[int] = []

    def __getitem__(self, key: Any) -> Any:
        self.visited.append(key)
        return super().__getitem__(key)


def _group(probing: bool) -> Any:
    progress = SimpleNamespace(state=ProgressState.PROBE, recent_active=probing, far_wait=False)
    core = SimpleNamespace(id=1, membership=SimpleNamespace(voters={1, 2}, learners=set()),
                           progress=lambda node: progress)
    return SimpleNamespace(core=core)


def test_fast_rounds_visit_only_the_groups_found_probing() -> None:
    groups = _Visits({group: _group(probing=group == 7) for group in range(1, 101)})
    registry = SimpleNamespace(awake=dict(groups), led=set(groups), partitions=set(groups), groups=groups,
                               stores={group: SimpleNamespace() for group in groups})
    leader = CatchUpLeader(registry, rpc=None, lag=(60, 0), acquire=None, is_live=lambda node: True,  # type: ignore[arg-type]
                           start_task=lambda coroutine, name: None, logger=structlog.get_logger())
    try:
        assert leader.round(full=True) is True
        assert len(groups.visited) == 100
        groups.visited.clear()
        assert leader.round(full=False) is True
        assert groups.visited == [7]
        groups[7].core.progress(2).recent_active = False  # its probe ended
        groups.visited.clear()
        assert leader.round(full=False) is False
        assert leader.round(full=True) is False and len(groups.visited) == 101
    finally:
        leader.close()


def _held_group() -> tuple[Any, Any, list[Any], list[int]]:
    """A group led here whose follower 2 is far behind; the core's inbox (call_core) is a
    list the test runs when it chooses."""
    progress = SimpleNamespace(state=ProgressState.REPLICATE, recent_active=True, far_wait=False, match=10,
                               install_index=0)
    holds: list[int] = []
    inbox: list[Any] = []

    def hold_for_install(node: int, upto: int) -> bool:
        holds.append(upto)
        progress.state, progress.install_index = ProgressState.INSTALL, upto
        return True

    def finish_install(node: int, ok: bool) -> None:
        if progress.state is ProgressState.INSTALL:
            progress.state = ProgressState.PROBE

    core = SimpleNamespace(id=1, membership=SimpleNamespace(voters={1, 2}, learners=set()),
                           progress=lambda node: progress, log=SimpleNamespace(last_index=lambda: 1000),
                           commit_index=1000, hold_for_install=hold_for_install, finish_install=finish_install)
    runtime = SimpleNamespace(core=core, call_core=inbox.append)
    segments = [SimpleNamespace(first_index=first, last_index=first + 99, size=16384, closed=True)
                for first in range(1, 1000, 100)]
    store = SimpleNamespace(segments=segments, first_index=lambda: 1)
    registry = SimpleNamespace(awake={5: runtime}, led={5}, partitions={5}, groups={5: runtime},
                               stores={5: store}, leading=lambda group: runtime)
    return registry, progress, inbox, holds


@contextlib.contextmanager
def _held_once() -> Iterator[tuple[CatchUpLeader, Any, Any, list[Any], list[int]]]:
    """A leader of `_held_group` whose first round held follower 2 (at 1,000)."""
    registry, progress, inbox, holds = _held_group()
    leader = CatchUpLeader(registry, rpc=None, lag=(60, 0), acquire=None, is_live=lambda node: True,  # type: ignore[arg-type]
                           start_task=lambda coroutine, name: coroutine.close(), logger=structlog.get_logger())
    try:
        leader.round(full=True)
        assert holds == [1000]
        yield leader, registry, progress, inbox, holds
    finally:
        leader.close()


def test_no_new_hold_until_the_core_ran_the_last_transfers_end() -> None:
    # CI regression (test_far_catchup's TLS test, on a loaded box): a transfer ended by a
    # probe queues its end for the core; the probe succeeded and the next round held the
    # follower again before the core ran that end, which then released the new hold, so
    # the second transfer failed too and the follower replayed instead of taking files.
    with _held_once() as (leader, registry, progress, inbox, holds):
        progress.state = ProgressState.PROBE  # a probe ended the hold: the round ends the transfer
        leader.round(full=True)
        assert leader.counts["failed"] == 1 and len(inbox) == 1
        progress.state = ProgressState.REPLICATE  # the probe succeeded; the core has not run the end yet
        leader.round(full=True)
        assert holds == [1000], "held again before the core ran the last transfer's end"
        inbox.pop()(registry.groups[5].core)  # the core runs it
        progress.state = ProgressState.REPLICATE
        leader.round(full=True)
        assert holds == [1000, 1000] and progress.state is ProgressState.INSTALL


def test_an_end_the_core_never_ran_blocks_no_hold_for_long() -> None:
    # A full inbox sheds what it is given: after FINISH_WAIT_S the rounds hold it again.
    with _held_once() as (leader, _registry, progress, inbox, holds):
        progress.state = ProgressState.PROBE
        leader.round(full=True)
        inbox.clear()  # shed
        progress.state = ProgressState.REPLICATE
        leader.round(full=True)
        assert holds == [1000]
        assert catchup_leader.FINISH_WAIT_S <= 2.0
        leader._finishing = {key: (runtime, 0.0) for key, (runtime, _) in leader._finishing.items()}  # time passed
        leader.round(full=True)
        assert holds == [1000, 1000]


def test_a_transfer_ended_by_a_probe_that_already_succeeded_is_not_held_again_in_that_round() -> None:
    # A second CI regression, traced: the follower said it lost its entries, the probe
    # carried 504 of them and succeeded (REPLICATE, far behind still); the round found the
    # first transfer no longer held, ended it, and in the same pass held the follower again;
    # the end then ran on the core and released that new hold, and replay won.
    with _held_once() as (leader, registry, progress, inbox, holds):
        progress.state = ProgressState.REPLICATE  # lost entries, probed, the probe succeeded
        leader.round(full=True)
        assert leader.counts["failed"] == 1 and len(inbox) == 1
        assert holds == [1000], "held again in the round that ended the last transfer"
        inbox.pop()(registry.groups[5].core)
        leader.round(full=True)
        assert holds == [1000, 1000]
