"""Far-horizon rounds (multiraft/node/catchup_leader.py `round`).

Goal (review L2): a fast round (PROBING_ROUND_S, while a follower that answers is probed)
visits only the groups the last full round found probing, not every awake group the node
leads; a full round visits them all and finds the probing ones again.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import structlog

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
