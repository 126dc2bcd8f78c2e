"""Moving a partition's copies: each partition leader brings its group's membership
to the catalog's replica list, one Raft membership change at a time.

The controller decides where a partition's replicas should be (`ReplaceReplica`
names a live node in a long-dead one's place); the group's own membership says
where they are. Every node, each round, looks at the groups it leads and takes the
next step toward the catalog (the core allows one membership change in flight):

1. a listed node that is no member joins as a *learner*: it copies the log (or a
   snapshot) without a vote, so a slow copy never weighs on the quorum;
2. a listed learner whose log reached the leader's commit index becomes a voter;
3. once every listed node votes, a member no longer listed is removed; a leader
   that is itself unlisted first hands leadership to an in-sync listed voter (a
   leader cannot remove itself);
4. once the group applied that removal, the leader tells the catalog
   (`ReplicaLeft`), and only then does the leaving node delete its copy.

Adding before removing is the order etcd (learners) and hashicorp/raft
(non-voters) recommend: the group never has fewer copies than it should, and a
copy is deleted only after the group stopped counting on it. Step 3 waits for
*every* listed node, so a leader whose catalog is stale (it has not seen a move
yet) never removes anything the move needs.

The choice (`next_step`) is pure, apart from the loop that acts on it, as in
leadership.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.metadata.commands import Command, ReplicaLeft
from multiraft.transport.rpc import RPC_TIMEOUT_S
from raftlog.errors import ClientError
from raftlog.messages import ConfChange, ConfChangeOp
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node.routing import Routing

ProposeMetadata = Callable[[Command], Awaitable[Any]]

MOVE_INTERVAL_S = 1.0
STEPS_PER_ROUND_MAX = 100
# Idle rounds look only when the catalog changed or the last round had work (a
# thousand partitions scanned every second would be a visible share of an idle
# node's CPU); a leadership gained mid-move is picked up by this slower full scan.
FULL_SCAN_INTERVAL_S = 10.0


class StepKind(enum.Enum):
    ADD_LEARNER = "add_learner"
    PROMOTE = "promote"
    TRANSFER = "transfer"
    REMOVE = "remove"
    REPORT_LEFT = "report_left"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    target: NodeId


def next_step(me: NodeId, voters: Collection[NodeId], learners: Collection[NodeId], listed: Sequence[NodeId],
              leaving: Sequence[NodeId], matches: Mapping[NodeId, int], commit: int,
              in_sync: Collection[NodeId]) -> Step | None:
    """The next membership step of a group led by `me` toward the catalog's `listed`
    replicas (None: nothing to do, or wait for a copy to catch up)."""
    members = set(voters) | set(learners)
    for node in listed:
        if node not in members:
            return Step(StepKind.ADD_LEARNER, node)
    for node in listed:
        if node in learners and matches.get(node, 0) >= commit:
            return Step(StepKind.PROMOTE, node)
    if any(node not in voters for node in listed):
        return None  # a copy is still catching up
    for node in sorted(members - set(listed)):
        if node != me:
            return Step(StepKind.REMOVE, node)
    if me not in listed:
        heir = next((node for node in listed if node in in_sync), None)
        return Step(StepKind.TRANSFER, heir) if heir is not None else None
    for node in leaving:
        if node not in members:
            return Step(StepKind.REPORT_LEFT, node)
    return None


@dataclass(frozen=True, slots=True)
class GroupStep:
    group_id: GroupId
    topic: str
    partition: int
    step: Step


def steps(node: Routing, limit: int = STEPS_PER_ROUND_MAX) -> tuple[list[GroupStep], bool]:
    """One step for each group this node leads whose membership differs from the catalog,
    and whether any such group remains (possibly with no step yet: a copy catching up)."""
    found: list[GroupStep] = []
    unsettled = False
    for group_id, runtime, topic, info in node.led_partitions():
        if len(found) >= limit:
            break
        core = runtime.core
        membership = core.membership
        if not info.leaving and not membership.learners and membership.voters == set(info.replicas):
            continue  # settled: the common case, kept cheap
        unsettled = True
        matches = {n: p.match for n in membership.members if (p := core.progress(n)) is not None}
        step = next_step(node.id, membership.voters, membership.learners, info.replicas, info.leaving, matches,
                         core.commit_index, core.in_sync_replicas())
        if step is not None:
            found.append(GroupStep(group_id, topic, info.partition, step))
    return found, unsettled or len(found) >= limit


_OPS = {StepKind.ADD_LEARNER: ConfChangeOp.ADD_LEARNER, StepKind.PROMOTE: ConfChangeOp.ADD_VOTER,
        StepKind.REMOVE: ConfChangeOp.REMOVE}


async def take(node: Routing, propose_metadata: ProposeMetadata, chosen: GroupStep, logger: Any) -> None:
    """Act on one step; a refusal (leadership moved, a change still applying) waits for
    the next round, which chooses again from what is then true."""
    step = chosen.step
    groups = node.registry.groups
    logger.info("replica_move_step", group_id=chosen.group_id, topic=chosen.topic, partition=chosen.partition,
                     step=step.kind.value, node=step.target)
    try:
        async with asyncio.timeout(RPC_TIMEOUT_S):
            if step.kind is StepKind.TRANSFER:
                groups[chosen.group_id].request_transfer(step.target)
            elif step.kind is StepKind.REPORT_LEFT:
                await propose_metadata(ReplicaLeft(topic=chosen.topic, partition=chosen.partition,
                                                        node=step.target))
            else:
                await groups[chosen.group_id].propose_membership(ConfChange(_OPS[step.kind], step.target))
    except (ClientError, TimeoutError, KeyError) as error:
        logger.info("replica_move_step_deferred", group_id=chosen.group_id, error=repr(error))


async def move_loop(node: Routing, propose_metadata: ProposeMetadata, logger: Any,
                    interval_s: float = MOVE_INTERVAL_S) -> None:
    seen_index = -1
    busy = False
    scanned = asyncio.get_running_loop().time()
    while True:
        await asyncio.sleep(interval_s)
        now = asyncio.get_running_loop().time()
        applied = node.catalog.catalog.applied_index
        if not busy and applied == seen_index and now - scanned < FULL_SCAN_INTERVAL_S:
            continue
        seen_index, scanned = applied, now
        chosen_steps, busy = steps(node)
        for chosen in chosen_steps:
            with contextlib.suppress(KeyError):  # a group closed meanwhile
                await take(node, propose_metadata, chosen, logger)
