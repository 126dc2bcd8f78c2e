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

When the loop looks (`MoveScan`): a round every MOVE_INTERVAL_S does nothing unless
the catalog changed, a leadership here changed, or a group was left unsettled, and
then walks all the led groups only for the first two (the third re-checks just those
groups), with a full walk at least every FULL_SCAN_INTERVAL_S. A leadership gained
counts: a decommissioning node hands its groups over while their moves start (its
drain and the moves run side by side), and its successor must take the move up at
once. It once waited for the 10 s full walk, so a decommission's copies of the groups
the node led started about 4 s after the others (docs/node.md, "Moves by files,
throttled"). A step that went through is followed at once by its group's next one
(a promotion by the removal, the removal by the report), not a round later.

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
from multiraft.node.learners import caught_up
from multiraft.transport.rpc import RPC_TIMEOUT_S
from raftlog.errors import ClientError
from raftlog.messages import ConfChange, ConfChangeOp
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node.routing import Routing

ProposeMetadata = Callable[[Command], Awaitable[Any]]

# A round's own cost is two comparisons when nothing changed, and a walk of the groups
# left unsettled otherwise, so rounds can be frequent: a move's steps wait for them (at
# 1 s, a move's add, promote, remove and report took 3-4 s of rounds beside its copy).
MOVE_INTERVAL_S = 0.1
STEPS_PER_ROUND_MAX = 100
# Idle rounds look only when the catalog or a leadership here changed, or the last
# round left groups unsettled (a thousand partitions walked every round would be a
# visible share of an idle node's CPU); this slower full walk catches the rest.
FULL_SCAN_INTERVAL_S = 10.0
# Steps taken in a row for one group once one went through: add (when the copy is
# caught up at once), promote, remove, report.
FOLLOW_THROUGH_STEPS_MAX = 4


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
        if node in learners and caught_up(matches.get(node, 0), commit):
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


def steps(node: Routing, limit: int = STEPS_PER_ROUND_MAX,
          only: Collection[GroupId] | None = None) -> tuple[list[GroupStep], set[GroupId]]:
    """One step for each group this node leads (of `only`, when given) whose membership
    differs from the catalog, and every such group it reached (possibly with no step
    yet: a copy catching up); at most `limit` steps."""
    found: list[GroupStep] = []
    unsettled: set[GroupId] = set()
    for group_id, runtime, topic, info in node.led_partitions():
        if len(found) >= limit:
            break
        if only is not None and group_id not in only:
            continue
        core = runtime.core
        membership = core.membership
        if not info.leaving and not membership.learners and membership.voters == set(info.replicas):
            continue  # settled: the common case, kept cheap
        unsettled.add(group_id)
        matches = {n: p.match for n in membership.members if (p := core.progress(n)) is not None}
        step = next_step(node.id, membership.voters, membership.learners, info.replicas, info.leaving, matches,
                         core.commit_index, core.in_sync_replicas())
        if step is not None:
            found.append(GroupStep(group_id, topic, info.partition, step))
    return found, unsettled


_OPS = {StepKind.ADD_LEARNER: ConfChangeOp.ADD_LEARNER, StepKind.PROMOTE: ConfChangeOp.ADD_VOTER,
        StepKind.REMOVE: ConfChangeOp.REMOVE}


async def take(node: Routing, propose_metadata: ProposeMetadata, chosen: GroupStep, logger: Any) -> bool:
    """Act on one step; True when it went through (applied here; a transfer is only
    asked for, so False). A refusal (leadership moved, a change still applying) waits
    for the next round, which chooses again from what is then true."""
    step = chosen.step
    groups = node.registry.groups
    logger.info("replica_move_step", group_id=chosen.group_id, topic=chosen.topic, partition=chosen.partition,
                step=step.kind.value, node=step.target)
    try:
        async with asyncio.timeout(RPC_TIMEOUT_S):
            if step.kind is StepKind.TRANSFER:
                groups[chosen.group_id].request_transfer(step.target)
                return False
            if step.kind is StepKind.REPORT_LEFT:
                await propose_metadata(ReplicaLeft(topic=chosen.topic, partition=chosen.partition,
                                                   node=step.target))
            else:
                await groups[chosen.group_id].propose_membership(ConfChange(_OPS[step.kind], step.target))
    except (ClientError, TimeoutError, KeyError) as error:
        logger.info("replica_move_step_deferred", group_id=chosen.group_id, error=repr(error))
        return False
    return True


async def follow_through(node: Routing, propose_metadata: ProposeMetadata, chosen: GroupStep, logger: Any) -> None:
    """Take `chosen`, then the group's next steps while each goes through."""
    for _ in range(FOLLOW_THROUGH_STEPS_MAX):
        if not await take(node, propose_metadata, chosen, logger) or chosen.step.kind is StepKind.REPORT_LEFT:
            return  # (the report is the last step: this node's catalog may not show it yet)
        found, _ = steps(node, only=(chosen.group_id,))
        if not found:
            return
        chosen = found[0]


@dataclass(slots=True)
class MoveScan:
    """When a move round looks, and at which groups: all of them when the catalog or a
    leadership here changed (`seen`: the index of the catalog's last command, not the
    consumer groups' ones that share its log, and the registry's `led_version`, last
    walked at) or the full walk is due; only the `unsettled` ones otherwise; none when
    there are none."""

    seen: tuple[int, int] | None = None
    scanned: float = float("-inf")
    unsettled: frozenset[GroupId] = frozenset()
    moving: tuple[int, bool] = (-1, True)  # (catalog index, whether a partition has a copy leaving then)

    def scope(self, now: float, catalog_index: int, led_version: int,
              moving: bool = True) -> tuple[bool, frozenset[GroupId]]:
        """(walk everything, else these groups); records a full walk as done. A leadership
        change alone walks only while some partition is `moving` (a copy leaving): with
        none, no group has a step, and after a kill or a restart beside thousands of
        partitions leaderships change for seconds on end, each change a walk."""
        key = (catalog_index, led_version)
        if self.seen is not None and not moving and catalog_index == self.seen[0]:
            self.seen = key
        if key != self.seen or now - self.scanned >= FULL_SCAN_INTERVAL_S:
            self.seen, self.scanned = key, now
            return True, frozenset()
        return False, self.unsettled

    def catalog_moving(self, catalog: Any, catalog_index: int) -> bool:
        """Whether a partition of `catalog` has a copy leaving, worked out once per catalog index."""
        if self.moving[0] != catalog_index:
            self.moving = (catalog_index, any(p.leaving for t in catalog.topics.values() for p in t.partitions))
        return self.moving[1]


async def move_round(node: Routing, propose_metadata: ProposeMetadata, logger: Any, scan: MoveScan,
                     now: float) -> int:
    """One round; returns the groups it stepped."""
    index = node.catalog.topics_index
    moving = scan.catalog_moving(node.catalog.catalog, index)
    full, groups = scan.scope(now, index, node.registry.led_version, moving)
    if not full and not groups:
        return 0
    chosen_steps, unsettled = steps(node, only=None if full else groups)
    scan.unsettled = frozenset(unsettled)
    if len(chosen_steps) >= STEPS_PER_ROUND_MAX:
        scan.seen = None  # stopped at the bound: the groups it did not reach need the next walk
    for chosen in chosen_steps:
        with contextlib.suppress(KeyError):  # a group closed meanwhile
            await follow_through(node, propose_metadata, chosen, logger)
    return len(chosen_steps)


async def move_loop(node: Routing, propose_metadata: ProposeMetadata, logger: Any,
                    interval_s: float = MOVE_INTERVAL_S) -> None:
    scan = MoveScan()
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        await move_round(node, propose_metadata, logger, scan, loop.time())
