"""Far-horizon streams that fail, and failures that are not the stream's
(multiraft/node/catchup_leader.py, catchup_follower.py, catchup_stream.py).

Goal: only a stream that broke (the leader never connected, the bytes stopped or came
damaged) sends the leader's next offers to that follower by chunks (`_no_stream`) and
counts in `streams_failed`; a follower that fails for its own reasons (a full disk, caught
up meanwhile) keeps streams. Either way the follower catches up.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers).
"""

from __future__ import annotations

import asyncio
import errno
import shutil
from pathlib import Path
from typing import Any

import pytest

from multiraft.node import catchup_follower, catchup_leader
from multiraft.node.node import Node
from tests.node.test_far_catchup import TOPIC, _holds, _write
from tests.node.test_node_cluster import leader_of, running_cluster, until, values_at


async def _far_behind_then_back(tmp_path: Path, fault: Any) -> tuple[Node, Node]:
    """A follower stopped, its log wiped, 600 records written meanwhile, then back with
    `fault(leader, back)` applied before it starts; returns once it caught up."""
    async with running_cluster(tmp_path, far_catchup_lag_entries=60) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {"segment_bytes": 16384})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        values = await _write(nodes[0], 0, 20)
        leader = leader_of(nodes, TOPIC, 0)
        assert leader is not None
        position, away = next((i, n) for i, n in enumerate(nodes) if n is not leader)
        await until(lambda: values_at(away, TOPIC, 0) == values, "the follower holds the first records")
        group = away.partition_group(TOPIC, 0)
        await away.stop()
        shutil.rmtree(away.config.data_dir / "groups" / str(group))
        values += await _write(leader, 20, 600)
        nodes[position] = back = Node(away.config)
        fault(leader, back)
        await back.start()
        await until(lambda: _holds(back, values), "the follower caught up", 60)
        return leader, back


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_full_disk_on_the_follower_does_not_turn_streams_off(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Review M2: any failed install of a stream transfer turned streams to that follower
    # off for NO_STREAM_S. The install failing on a full disk is not the stream's doing.
    monkeypatch.setattr(catchup_leader, "ROUND_S", 0.01)
    failures: list[int] = []

    def fault(leader: Node, back: Node) -> None:
        async def full(*args: Any) -> bool:
            failures.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(back.catchup_follower, "_install", full)

    leader, back = await _far_behind_then_back(tmp_path, fault)
    counts = leader.catchup_leader.counts
    assert failures and back.api.catchup_counts["follower_failed"] >= 1
    assert counts["streams"] >= 1 and counts["streams_failed"] == 0, counts
    assert back.id not in leader.catchup_leader._no_stream, "streams stay on"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_leader_that_never_connects_fails_the_stream_at_the_accept_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review M2: the follower's listener gives up after ACCEPT_S; the follower says the
    # stream broke, the leader's next offers go by chunks, and the counts agree: the
    # failed stream is one of the streams.
    monkeypatch.setattr(catchup_leader, "ROUND_S", 0.01)
    monkeypatch.setattr(catchup_follower, "ACCEPT_S", 0.3)

    def fault(leader: Node, back: Node) -> None:
        side = leader.catchup_leader._side
        assert side is not None

        async def never(peer: int, port: int) -> Any:
            await asyncio.sleep(3600)

        monkeypatch.setattr(side, "dial", never)

    leader, back = await _far_behind_then_back(tmp_path, fault)
    counts = leader.catchup_leader.counts
    assert counts["streams"] >= 1 and counts["streams_failed"] == 1, counts
    assert back.id in leader.catchup_leader._no_stream, "the next offers go by chunks"
