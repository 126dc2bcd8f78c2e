"""Who votes in the metadata group: promoting a learner, replacing a dead voter (issue 25).

A node that joins a running cluster becomes a *learner* of the metadata group (it
receives the catalog, never votes). An operator makes one a voter with `raftlog node
promote N` (`POST /v1/admin/nodes/{n}/promote`), to grow the group (three voters to
five, one at a time: an even count tolerates no more failures than one fewer), or,
with `--replace M`, in place of voter M: N is promoted first, then M removed, so the
group never has fewer voters than before. That is how a dead voter is replaced
without a full-cluster restart: with voters {1,2,3} and node 3 lost for good,
`promote 4 --replace 3` leaves {1,2,4}, and the group survives the next failure.

Refused (the one error shape, nothing changed): a node that is no learner of the
group, leaving the cluster, not live, or not caught up with the group's log (it
would count toward the quorum while it catches up); replacing a node that is no
voter, the node itself, the group's leader, or a live node (a live node leaves by
decommission, decommission.py); a sixth voter; a change that would leave the group
without a live majority. Promoting a voter again, or replacing a voter already gone,
is a no-op: a retry after a lost answer is safe. Gone means no voter any more, not out
of the group: the controller readmits every registered node that is no member as a
learner (controller.py, `_readmit_non_members`), the replaced one too, within a
decommission round (0.1 s) of its removal; so once `node_id` votes, `replace` being a
learner is the replacement done, not a refusal (it was one, and a retry failed).

`promotion` is pure; the controller (controller.py) proposes its steps.
"""

from __future__ import annotations

from collections.abc import Mapping

from multiraft.errors import PromotionRefused, UnknownNode
from multiraft.metadata.catalog import Catalog
from multiraft.node.decommission import node_alive
from multiraft.node.learners import caught_up
from raftlog.messages import ConfChange, ConfChangeOp, Membership
from raftlog.types import NodeId

VOTERS_MAX = 5


def promotion(catalog: Catalog, membership: Membership, leader: NodeId, matches: Mapping[NodeId, int],
              commit: int, node_id: NodeId, replace: NodeId | None) -> list[ConfChange]:
    """The membership changes that make `node_id` a voter (in place of `replace`), in
    order; empty when there is nothing left to do. Raises the typed refusal."""
    if node_id not in catalog.nodes:
        raise UnknownNode(f"node {node_id} is not registered")
    if replace is not None and replace not in catalog.nodes:
        raise UnknownNode(f"node {replace} is not registered")
    if replace == node_id:
        raise PromotionRefused("a node cannot replace itself")
    promoted = node_id in membership.voters
    steps: list[ConfChange] = []
    if not promoted:
        if node_id not in membership.learners:
            raise PromotionRefused(f"node {node_id} is not in the metadata group; it joins as a learner first")
        if catalog.nodes[node_id].decommissioning:
            raise PromotionRefused(f"node {node_id} is being decommissioned; recommission it first")
        if not node_alive(catalog, node_id):
            raise PromotionRefused(f"node {node_id} is not live")
        if not caught_up(matches.get(node_id, 0), commit):
            raise PromotionRefused(f"node {node_id} has not caught up with the metadata log yet "
                                 f"({matches.get(node_id, 0)} of {commit}): retry in a moment")
        if replace is None and len(membership.voters) >= VOTERS_MAX:
            raise PromotionRefused(f"the metadata group has {len(membership.voters)} voters already (at most "
                                 f"{VOTERS_MAX}); use --replace to swap one")
        steps.append(ConfChange(ConfChangeOp.ADD_VOTER, node_id))
    if replace is not None and replace in membership.members:
        if replace not in membership.voters:
            if promoted:  # replaced before, and readmitted as a learner since: nothing left to do
                return steps
            raise PromotionRefused(f"node {replace} is no voter of the metadata group")
        if replace == leader:
            raise PromotionRefused(f"node {replace} leads the metadata group: drain it first")
        if node_alive(catalog, replace):
            raise PromotionRefused(f"node {replace} is live: only a dead voter is replaced this way "
                                 "(decommission a live node instead)")
        after = (membership.voters | {node_id}) - {replace}
        if 2 * sum(node_alive(catalog, v) for v in after) <= len(after):
            raise PromotionRefused(f"replacing node {replace} would leave the metadata group {sorted(after)} "
                                 "without a live majority")
        steps.append(ConfChange(ConfChangeOp.REMOVE, replace))
    return steps
