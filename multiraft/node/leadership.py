"""Preferred-leader balancing: each partition's leadership goes home to its first replica.

Placement spreads the first replica of each partition evenly over the nodes, and
a new partition's first replica campaigns first; but elections are races (a node
that applied the catalog late, or restarted, loses them), so leadership drifts
toward some nodes and their CPU and network do all the work. Kafka's answer is
the "preferred replica": the first of the assignment, restored periodically
(`auto.leader.rebalance.enable`). Ours, without a coordinator: every node looks
at the groups *it* leads and hands each one whose preferred replica is ready
over to it (Raft leadership transfer: the target is caught up, then told to
campaign at once).

When a partition's preferred replica cannot lead (its node is dead, or the
replica is behind), elections put its leadership wherever they happen to, and
one survivor can end up leading far more than the others. So a node that leads
more than its fair share of the partitions (the ceiling of the leaders counted
over the live nodes) also hands such partitions to ready followers on nodes
below that share, least loaded first: the fewest transfers that even the
leaders out, as DESIGN.md section 5 asks. Only partitions whose preferred
replica is not eligible at all (and is not this node) move this way, so the two
rules never undo each other; once the preferred node is back, leadership goes
home. The counts come from this node's view (its replicas' leaders, the
leaders' pings for the rest), a second old at most; concurrent moves by two
nodes can overshoot by a little, and the next round evens that out.

A transfer must not churn (issue 26, docs/scale.md "Fixes, ranked" 4: after a
full restart each node started about 2,400 transfers in 130 s, 97 % aborted, and
a transfer that reached a lagging target deposed a working leader for an
election the target then lost). So:
- the target is *ready*: a live, in-sync voter whose match index is at the
  leader's last index, or within `CAUGHT_UP_ENTRIES_MAX` of it (TimeoutNow goes
  out at once, or after one append: no catch-up race against the transfer's one
  election timeout), on a node live without a silence for
  `leader_balance_target_live_ms` (a node back from a restart first settles);
- at most `leader_transfers_in_flight_max` transfers from this node at a time; a
  transfer is over when this node no longer leads the group, or aborted when it
  still does after `TRANSFER_TIMEOUT_ELECTIONS` election timeouts (the core gives
  up after one);
- a group whose transfer aborted is left alone for `ABORT_BACKOFF_S`;
- no automatic round for `leader_balance_settle_ms` after this node starts, a
  topic is created, a peer falls silent or a group here was last seen without a
  leader (after a full restart at 10,000 partitions, 490 transfers started among
  the elections and every one aborted) (the new groups' first voters, or the
  dead node's successors, win their elections; moving leaders meanwhile only races
  them: at 10,000 partitions, transfers started 2 s after a kill deposed hundreds of
  leaders just elected, for elections that took a minute on the loaded loops). An explicit round (`POST
  /v1/admin/leadership/balance`) skips the settle period, nothing else.

"Live without a silence" is sampled each `OBSERVE_INTERVAL_S` from the node's
peer liveness (a restart shows as a refused connection, `PeerLiveness.gone`,
until the node's first frame), so a silence shorter than a sample can be missed;
a restart takes longer than that.

Pure choices (`preferred_moves`, `evening_moves`, `even_out`) apart from the
`Balancer` that keeps the state and the loop that acts on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiraft.metadata.catalog import NodeStatus
from multiraft.node import draining
from multiraft.transport.rpc import RPC_TIMEOUT_S, RemoteError, Rpc, RpcError, answer
from raftlog.messages import Role
from raftlog.types import GroupId, NodeId

if TYPE_CHECKING:
    from multiraft.node.config import NodeConfig
    from multiraft.node.routing import Routing
    from multiraft.runtime.group import GroupRuntime

# Rounds are cheap when transfers are in flight up to the bound (no walk at all); a
# round walks the led partitions once. Once a second keeps that walk a small share of
# an idle node (docs/scale.md: the walk was 7-10 % of 3.5 % of a core every 5 s).
OBSERVE_INTERVAL_S = 1.0
FULL_ROUND_EVERY_S = 10.0  # at rest, at least one full balancing round this often
# Kafka's leader.imbalance.check.interval is 5 minutes; a minute keeps a target that
# cannot take leadership (slow disk, overloaded loop) from being asked every round.
ABORT_BACKOFF_S = 60.0
# The core abandons a transfer after one election timeout; two leave room for a late task.
TRANSFER_TIMEOUT_ELECTIONS = 2
# A target counts as caught up with its match this close to the leader's last index: a
# partition written without pause always has a few entries in flight to every follower,
# and would never go home if the match had to equal the last index at the moment of the
# round. The rest reach the target in one append: a leader refuses proposals while it
# transfers (LEADERSHIP_TRANSFER_IN_PROGRESS), so its log stops growing, and TimeoutNow
# follows the target's answer. A target catching up from far (a restart) is far outside.
CAUGHT_UP_ENTRIES_MAX = 16
MOVES_PER_ROUND_MAX = 100  # the pure choosers' default bound; the Balancer passes its own
# A drained node that still leads rounds this often: a decommission's copies of the groups
# it leads are made by their next leader (a copy it started is abandoned when its
# leadership moves), so the sooner it hands them over the better; and the operator waits.
DRAIN_ROUND_S = 0.1


@dataclass(frozen=True, slots=True)
class Move:
    group_id: GroupId
    target: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class BalanceSettings:
    target_live_s: float
    settle_s: float
    in_flight_max: int
    transfer_timeout_s: float
    abort_backoff_s: float = ABORT_BACKOFF_S

    def __post_init__(self) -> None:
        assert self.target_live_s >= 0 and self.settle_s >= 0
        assert self.in_flight_max >= 1 and self.transfer_timeout_s > 0 and self.abort_backoff_s >= 0

    @classmethod
    def of(cls, config: NodeConfig) -> BalanceSettings:
        election_s = config.election_timeout_ticks * config.tick_ms / 1000
        return cls(target_live_s=config.leader_balance_target_live_ms / 1000,
                   settle_s=config.leader_balance_settle_ms / 1000,
                   in_flight_max=config.leader_transfers_in_flight_max,
                   transfer_timeout_s=TRANSFER_TIMEOUT_ELECTIONS * election_s)


def _eligible(node: Routing, runtime: GroupRuntime, candidate: NodeId) -> bool:
    """`candidate` is a live, in-sync voter on a node the catalog counts alive and not
    drained (draining.py: a drained node leads nothing)."""
    if candidate == node.id or candidate not in runtime.core.membership.voters:
        return False
    info = node.catalog.catalog.nodes.get(candidate)
    if info is None or info.status is not NodeStatus.ALIVE or info.leads_nothing or not node.is_live(candidate):
        return False
    return candidate in runtime.core.in_sync_replicas()


def _caught_up(runtime: GroupRuntime, candidate: NodeId) -> bool:
    progress = runtime.core.progress(candidate)
    return progress is not None and progress.match + CAUGHT_UP_ENTRIES_MAX >= runtime.core.log.last_index()


TargetCheck = Callable[[NodeId], bool]  # the target's node qualifies (live long enough)


def _ready(node: Routing, runtime: GroupRuntime, candidate: NodeId, settled: TargetCheck) -> bool:
    """`candidate` can take this group's leadership now, without a catch-up race."""
    return _eligible(node, runtime, candidate) and _caught_up(runtime, candidate) and settled(candidate)


def _always(candidate: NodeId) -> bool:
    return True


def preferred_moves(node: Routing, limit: int = MOVES_PER_ROUND_MAX, settled: TargetCheck = _always,
                    skip: Callable[[GroupId], bool] = lambda group_id: False) -> list[Move]:
    """Groups this node leads whose preferred replica is ready to lead."""
    assert limit >= 0
    moves: list[Move] = []
    for group_id, runtime, _, info in node.led_partitions():
        if len(moves) >= limit:
            break
        preferred = NodeId(info.replicas[0])
        if not skip(group_id) and _ready(node, runtime, preferred, settled):
            moves.append(Move(group_id, preferred))
    return moves


def even_out(me: NodeId, counts: dict[NodeId, int], movable: list[tuple[GroupId, list[NodeId]]],
             limit: int) -> list[Move]:
    """Transfers that bring `me` down to the fair share of leaders over the nodes in
    `counts` (leaders per live node, `me` included): each of `movable` (a group `me`
    leads, with the nodes that could take it) goes to its candidate with the fewest
    leaders, while `me` is above the share and that candidate is below it."""
    assert me in counts and limit >= 0
    counts = dict(counts)
    fair = -(-sum(counts.values()) // len(counts))  # the ceiling
    moves: list[Move] = []
    for group_id, candidates in movable:
        if counts[me] <= fair or len(moves) >= limit:
            break
        # Below the share, and the move narrows the gap (never trades one excess for another).
        below = [c for c in candidates if c in counts and counts[c] < fair and counts[c] < counts[me] - 1]
        if not below:
            continue
        target = min(below, key=lambda c: (counts[c], c))
        moves.append(Move(group_id, target))
        counts[me] -= 1
        counts[target] += 1
    return moves


def evening_moves(node: Routing, limit: int = MOVES_PER_ROUND_MAX, settled: TargetCheck = _always,
                  skip: Callable[[GroupId], bool] = lambda group_id: False) -> list[Move]:
    """Groups to hand over so this node leads no more than its fair share; only those
    whose preferred replica is not eligible at all (the preferred rule takes the others,
    once their preferred replica is ready)."""
    catalog = node.catalog.catalog
    live = {n.node_id for n in catalog.live_nodes()
            if not n.leads_nothing and (n.node_id == node.id or node.is_live(n.node_id))}
    if node.id not in live or len(live) < 2 or limit == 0:
        return []
    counts = dict.fromkeys(live, 0)
    for topic in catalog.topics.values():
        for partition in topic.partitions:
            leader = NodeId(node.leader_of(partition.group_id))
            if leader in counts:
                counts[leader] += 1
    movable = []
    for group_id, runtime, _, info in node.led_partitions():
        if skip(group_id) or info.replicas[0] == node.id or _eligible(node, runtime, NodeId(info.replicas[0])):
            continue  # busy, at home, or going home once ready: the preferred rule's
        candidates = [NodeId(r) for r in info.replicas if _ready(node, runtime, NodeId(r), settled)]
        if candidates:
            movable.append((group_id, candidates))
    return even_out(node.id, counts, movable, limit)


@dataclass(slots=True)
class _Transfer:
    target: NodeId
    started: float


class Balancer:
    """The balancing state of one node: transfers in flight, groups backing off after an
    abort, since when each peer has been live, and the settle period."""

    def __init__(self, node: Routing, settings: BalanceSettings, logger: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node
        self.settings = settings
        self._logger = logger
        self._clock = clock
        self._live_since: dict[NodeId, float] = {}
        self.in_flight: dict[GroupId, _Transfer] = {}  # invariant: len <= settings.in_flight_max
        self._backoff_until: dict[GroupId, float] = {}
        self._settle_until = clock() + settings.settle_s
        self._groups_allocated = node.catalog.catalog.next_group_id
        self.transfers_started = 0
        self.transfers_aborted = 0
        self._idle_inputs: tuple[Any, ...] | None = None  # a round's inputs that found nothing to do
        self._idle_at = 0.0  # when that round ran
        self.rounds_skipped = 0

    # ------------------------------------------------------------------ observation

    def observe(self) -> None:
        """Sample peer liveness, settle after a topic creation or a peer's silence, and
        settle transfers in flight."""
        self._observe_peers()
        self._observe_leaderless()

    def _observe_leaderless(self) -> None:
        """Settle while a group here knows no leader: the walk over every group."""
        now = self._clock()
        if any(not runtime.core.leader for runtime in self._node.registry.groups.values()):
            # A group here knows no leader (elections after a restart or a loss): a
            # transfer now only races them; settle from the last time one was seen.
            self._settle_until = max(self._settle_until, now + self.settings.settle_s)

    def _observe_peers(self) -> None:
        """`observe` but the walk over every group: the cheap part, done every round."""
        now = self._clock()
        for peer in self._node.peer_ids():
            if not self._node.is_live(peer):
                if self._live_since.pop(NodeId(peer), None) is not None:
                    # A node lost: its partitions are being elected here, and a transfer
                    # now would depose a leader just elected for another contested election.
                    self._settle_until = max(self._settle_until, now + self.settings.settle_s)
            else:
                self._live_since.setdefault(NodeId(peer), now)
        allocated = self._node.catalog.catalog.next_group_id
        if allocated != self._groups_allocated:  # a topic was created: let its first voters win
            self._groups_allocated = allocated
            self._settle_until = max(self._settle_until, now + self.settings.settle_s)
        self._settle_transfers(now)
        for group_id in [g for g, until in self._backoff_until.items() if until <= now]:
            del self._backoff_until[group_id]

    def _settle_transfers(self, now: float) -> None:
        groups = self._node.registry.groups
        for group_id, transfer in list(self.in_flight.items()):
            runtime = groups.get(group_id)
            if runtime is None or runtime.core.role is not Role.LEADER:
                del self.in_flight[group_id]  # moved (or this node lost it anyway): over
            elif now - transfer.started >= self.settings.transfer_timeout_s:
                del self.in_flight[group_id]
                self._backoff_until[group_id] = now + self.settings.abort_backoff_s
                self.transfers_aborted += 1
                self._logger.debug("leadership_transfer_backing_off", group_id=group_id, target=transfer.target)

    def target_settled(self, candidate: NodeId) -> bool:
        """`candidate`'s node has been live, without a silence seen, for the target-live time."""
        since = self._live_since.get(candidate)
        return since is not None and self._clock() - since >= self.settings.target_live_s

    def busy(self, group_id: GroupId) -> bool:
        return group_id in self.in_flight or group_id in self._backoff_until

    def settling(self) -> bool:
        return self._clock() < self._settle_until

    # ------------------------------------------------------------------ rounds

    def _inputs(self) -> tuple[Any, ...] | None:
        """What an automatic round's choice depends on, beyond time passing: the catalog,
        every leadership this node knows of, which peers are live and which of them have
        been live long enough to take a transfer, the groups backing off. None when the
        node cannot say (its leaderships carry no version)."""
        version = getattr(self._node, "leadership_version", None)
        if version is None:
            return None
        catalog = self._node.catalog.catalog
        peers = self._node.peer_ids()
        return (id(catalog), catalog.applied_index, version(), tuple(self._node.is_live(p) for p in peers),
                tuple(self.target_settled(NodeId(p)) for p in peers), frozenset(self._backoff_until))

    def balance_now(self, explicit: bool = False) -> int:
        """One round: start transfers up to the in-flight bound; returns how many started.
        An automatic round does nothing while settling; an `explicit` one does not wait.

        An automatic round whose inputs (`_inputs`) are those of the last round, which
        found nothing to do with nothing in flight and no settling, is skipped, for up to
        FULL_ROUND_EVERY_S: at rest the rounds walked every group and partition each
        second, half of an idle node's CPU at 10,000 partitions (docs/scale.md). What the
        inputs do not show (a target replica catching up on a busy partition) waits for
        the next full round. A drained node never skips: its leaderships must go."""
        self._observe_peers()
        inputs = self._inputs()
        if (not explicit and inputs is not None and inputs == self._idle_inputs and not self.in_flight
                and self._clock() - self._idle_at < FULL_ROUND_EVERY_S
                and not draining.is_drained(self._node, self._node.id)):
            self.rounds_skipped += 1
            return 0
        self._idle_inputs = None
        self._observe_leaderless()  # the peers were observed above
        node = self._node
        drained = draining.is_drained(node, node.id)
        if not explicit and self.settling() and not drained:  # a drain does not wait (draining.py)
            return 0
        room = self.settings.in_flight_max - len(self.in_flight)
        if room <= 0:
            return 0
        if drained:
            moves = [Move(g, t) for g, t in draining.drain_moves(
                node, lambda runtime, c: _eligible(node, runtime, c) and _caught_up(runtime, c),
                self.target_settled, room, self.busy)]
        else:
            moves = preferred_moves(node, room, self.target_settled, self.busy)
            skip = {m.group_id for m in moves}
            moves += evening_moves(node, room - len(moves), self.target_settled,
                                   lambda g: g in skip or self.busy(g))
        now = self._clock()
        for move in moves:
            node.registry.groups[move.group_id].request_transfer(move.target)
            self.in_flight[move.group_id] = _Transfer(move.target, now)
        assert len(self.in_flight) <= self.settings.in_flight_max
        self.transfers_started += len(moves)
        if not explicit and not moves and not self.in_flight and not self.settling():
            self._idle_inputs, self._idle_at = inputs, now
        if moves:
            self._logger.info("leadership_balancing", transfers=len(moves), in_flight=len(self.in_flight))
        return len(moves)

    async def run(self, interval_s: float = OBSERVE_INTERVAL_S) -> None:
        """A round every `interval_s`; every DRAIN_ROUND_S while this node is drained and
        still leads a group (draining.py), as long as its rounds move something: the
        first after the mark, then while transfers start or are in flight (one that
        finds no ready target waits the usual interval)."""
        last = float("-inf")
        moving = False  # drained, and the last round started or awaited transfers
        last_drained: bool | None = None  # whether it was at the last look (None: not looked yet)
        while True:
            await asyncio.sleep(min(interval_s, DRAIN_ROUND_S))
            node = self._node
            drained = bool(node.registry.led) and draining.is_drained(node, node.id)
            now = self._clock()
            if now - last < interval_s and not (drained and (moving or last_drained is False)):
                last_drained = drained
                continue
            last, last_drained = now, drained
            started = 0
            with contextlib.suppress(KeyError):  # a group closed between the choice and the move
                started = self.balance_now()
            moving = drained and bool(started or self.in_flight)


async def balance_everywhere(balancer: Balancer, node: Routing, rpc: Rpc) -> dict[int, int]:
    """One explicit balancing round on every node now; transfers started, by node (-1: not reached)."""
    started = {int(node.id): balancer.balance_now(explicit=True)}
    for peer in node.peer_ids():
        try:
            reply = await rpc.call(peer, "leaders.balance", b"", RPC_TIMEOUT_S)
            started[peer] = int(reply)
        except (RpcError, RemoteError, ValueError):
            started[peer] = -1  # not reached: reported, not fatal
    return started


def serve_balance(balancer: Balancer, rpc: Rpc) -> None:
    """Answer peers' `leaders.balance` calls with an explicit round here."""

    async def round_here() -> int:
        return balancer.balance_now(explicit=True)

    async def serve(source: int, body: bytes) -> tuple[int, bytes]:
        return await answer(round_here(), lambda count: str(count).encode())

    rpc.register("leaders.balance", serve)
