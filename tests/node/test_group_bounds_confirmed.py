"""A group fetch past the answering replica's end asks the leader for the log end
(`GroupReads.bounds(leader=True)`), to tell a lagging replica from a real out-of-range
position. The leader must confirm it still leads (a ReadIndex) before it answers: a
leader cut off from its followers that has not noticed yet answers its own stale high
watermark, and the member was reset to its policy's start (chaos seed 712994,
docs/chaos.md: an isolated n3, high watermark 240, sent a member at 262 back to 0, and
the member's next commit took the group's offset back).

In-process three-node clusters (tests/node/test_node_cluster.py's helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.errors import ClientError
from tests.node.test_node_cluster import batch, leader_of, produce_retrying, running_cluster, until

TOPIC = "bounds"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_cut_off_leader_does_not_answer_its_own_log_end(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        for i in range(5):
            await produce_retrying(nodes[0], TOPIC, 0, batch(b"v%d" % i))
        leader = leader_of(nodes, TOPIC, 0)
        assert leader is not None
        tp = (TOPIC, 0)
        assert (await leader.group_reads.bounds([tp], leader=True))[tp] == (0, 5)  # confirmed: it answers

        # Cut off: nothing it sends reaches its followers (it still believes it leads).
        leader.transport.send = lambda *frame: True  # type: ignore[method-assign]
        with pytest.raises(ClientError) as raised:
            await leader.group_reads.bounds([tp], leader=True)
        assert raised.value.retriable, "an error the member retries, keeping its position: never a reset"
        assert (await leader.group_reads.bounds([tp]))[tp] == (0, 5), "its own replica's view is still there"
