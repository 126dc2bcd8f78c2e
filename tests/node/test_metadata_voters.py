"""A dead metadata voter replaced without a restart (issue 25).

Goal: in a cluster of three voters and a joined learner, voter 3 is stopped for good;
`promote 4 --replace 3` (asked through a node that does not lead the metadata group)
leaves voters {1,2,4}, and then the group still commits with a second node (2)
down: a topic is created, which {1,2,3} could not have done with 2 and 3 down.
Replacing a live voter is refused; promoting a voter again is a no-op, also once the
controller has readmitted the replaced node as a learner (as it does every registered
node out of the group). The test asks as an operator does: again while the learner
has not caught up with the metadata log (a refusal that says "retry in a moment").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from multiraft.node.node import Node
from raftlog.errors import ClientError
from raftlog.messages import Role
from raftlog.types import GroupId, NodeId
from tests.node.test_node_cluster import running_four_nodes, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _metadata_leader(nodes: list[Node]) -> Node | None:
    return next((n for n in nodes if n.db is not None and n.groups[GroupId(0)].core.role is Role.LEADER), None)


async def _promote(asker: Node, node_id: NodeId, replace: NodeId) -> None:
    """Asked again while `node_id` is behind the metadata log: a learner just added (or one
    whose last entry's acknowledgement is still on its way) is refused for a moment."""
    async with asyncio.timeout(30):
        while True:
            try:
                return await asker.api.promote_node(node_id, replace)
            except ClientError as error:
                if "has not caught up" not in error.message:
                    raise
            await asyncio.sleep(0.05)


async def test_a_dead_voter_is_replaced_and_the_group_survives_the_next_failure(tmp_path: Path) -> None:
    async with running_four_nodes(tmp_path, node_dead_after_ms=1500) as everyone:
        learner = everyone[3]
        await until(lambda: (leader := _metadata_leader(everyone)) is not None
                    and learner.id in leader.groups[GroupId(0)].core.membership.learners, "node 4 a learner", 30)
        leader = _metadata_leader(everyone)
        assert leader is not None
        live_voter = next(n for n in everyone[:3] if n is not leader)  # the leader's refusal would differ
        with pytest.raises(ClientError, match="only a dead voter") as refused:
            await _promote(everyone[0], learner.id, live_voter.id)
        assert refused.value.code == "PROMOTION_REFUSED"
        gone = next(n for n in everyone[:3] if n is not leader)  # a voter, not the leader
        await gone.stop()
        alive = [n for n in everyone if n is not gone]
        await until(lambda: all(n.catalog.nodes[gone.id].status.value == "dead" for n in alive), "marked dead", 30)
        asker = next(n for n in alive if n is not _metadata_leader(alive))
        await _promote(asker, learner.id, gone.id)
        await until(lambda: all(n.api.metadata_membership()[0] == sorted({*[m.id for m in everyone[:3]],
                                                                           learner.id} - {gone.id})
                                for n in alive), "voters {..., 4} everywhere", 30)
        # The replaced node is readmitted as a learner within a controller round; then the
        # retry, which was refused ("no voter of the metadata group") when it came after that.
        await until(lambda: all(n.api.metadata_membership()[1] == [gone.id] for n in alive), "readmitted", 30)
        await asker.api.promote_node(learner.id, gone.id)  # again: a no-op
        # The next failure: another voter, not node 4, stopped. Two of {x, y, 4} still commit.
        second = next(n for n in alive if n is not learner and n is not _metadata_leader(alive))
        await second.stop()
        survivors = [n for n in alive if n is not second]
        await survivors[0].create_topic("after", 1, 1, {})
        await until(lambda: all("after" in n.catalog.topics for n in survivors), "a topic created", 30)
