"""The leadership balancer does not churn (issue 26, multiraft/node/leadership.py).

Goal: a transfer goes only to a target that can take it at once (in sync, its match
at the leader's last index, its node live without a silence for the target-live
time); transfers in flight are bounded; a group whose transfer aborted is left
alone for the backoff; nothing moves during the settle period after the node
starts or a topic is created. The first tests drive the `Balancer` over a fake
node view with a fake clock; the last one runs three real nodes and checks that
a new topic reaches balance without transfers beyond those its elections made
necessary.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import CreateTopic, NodeStatus, RegisterNode, SetNodeStatus
from multiraft.node import leadership
from multiraft.node.leadership import CAUGHT_UP_ENTRIES_MAX, Balancer, BalanceSettings
from multiraft.node.routing import LedPartition
from raftlog.messages import Role
from raftlog.types import GroupId, Index, NodeId
from tests.node.test_node_cluster import leader_of, running_cluster, until

SETTINGS = BalanceSettings(target_live_s=30.0, settle_s=10.0, in_flight_max=2, transfer_timeout_s=1.0,
                           abort_backoff_s=60.0)


@dataclass
class FakeProgress:
    match: int


@dataclass
class FakeLog:
    last: int = 5

    def last_index(self) -> Index:
        return Index(self.last)


@dataclass
class FakeCore:
    voters: set[int]
    role: Role = Role.LEADER
    leader: int = 1
    isr: set[int] = field(default_factory=lambda: {1, 2, 3})
    matches: dict[int, int] = field(default_factory=lambda: {1: 5, 2: 5, 3: 5})
    log: FakeLog = field(default_factory=FakeLog)

    @property
    def membership(self) -> Any:
        return type("M", (), {"voters": self.voters})()

    def in_sync_replicas(self) -> frozenset[int]:
        return frozenset(self.isr) if self.role is Role.LEADER else frozenset()

    def progress(self, node: NodeId) -> FakeProgress | None:
        return FakeProgress(self.matches[node]) if node in self.matches else None


class FakeRuntime:
    def __init__(self) -> None:
        self.core = FakeCore(voters={1, 2, 3})
        self.transfers: list[int] = []

    def request_transfer(self, target: int) -> None:
        self.transfers.append(target)


class FakeNode:
    """Node 1's view: it leads every partition of topic "t", each preferring node 2."""

    def __init__(self, partitions: int) -> None:
        self.id = NodeId(1)
        self.catalog = type("Holder", (), {})()
        self.catalog.catalog = Catalog()
        self.live = {2: True, 3: True}
        self._index = 0
        for n in (1, 2, 3):
            self.apply(RegisterNode(node_id=n, raft_addr=f"127.0.0.{n}:7000", http_addr=f"127.0.0.{n}:8000",
                                    rack=None))
        self.create("t", partitions)
        self.registry = type("Registry", (), {})()
        self.registry.groups = {p.group_id: FakeRuntime() for p in self.catalog.catalog.topics["t"].partitions}

    def apply(self, command: Any) -> None:
        self._index += 1
        result = self.catalog.catalog.apply(Index(self._index), command)
        assert result.error is None, result.error

    def create(self, name: str, partitions: int) -> None:
        self.apply(CreateTopic(name=name, partitions=partitions, replication_factor=3, config={},
                               assignments=tuple((2, 1, 3) for _ in range(partitions))))

    def is_live(self, node: int) -> bool:
        return self.live.get(node, False)

    def peer_ids(self) -> list[int]:
        return [2, 3]

    def leader_of(self, group_id: GroupId) -> int:
        runtime = self.registry.groups.get(group_id)
        return 1 if runtime is not None and runtime.core.role is Role.LEADER else 0

    def led_partitions(self) -> list[LedPartition]:
        topic = self.catalog.catalog.topics["t"]
        return [LedPartition(p.group_id, self.registry.groups[p.group_id], "t", p) for p in topic.partitions
                if self.registry.groups[p.group_id].core.role is Role.LEADER]

    def runtime(self, partition: int) -> FakeRuntime:
        return self.registry.groups[self.catalog.catalog.topics["t"].partitions[partition].group_id]

    def transfers(self) -> int:
        return sum(len(r.transfers) for r in self.registry.groups.values())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def balancer(partitions: int = 1, settings: BalanceSettings = SETTINGS) -> tuple[FakeNode, Balancer, Clock]:
    """A node, its balancer just built (the node starting), past the settle period and
    with its peers live for the target-live time."""
    node, clock = FakeNode(partitions), Clock()
    balance = Balancer(node, settings, structlog.get_logger(), clock)  # type: ignore[arg-type]
    balance.observe()
    clock.now += max(settings.settle_s, settings.target_live_s)
    return node, balance, clock


def test_a_ready_preferred_replica_gets_its_leadership() -> None:
    node, balance, _ = balancer()
    assert balance.balance_now() == 1
    assert node.runtime(0).transfers == [2]


def test_a_lagging_target_is_not_chosen() -> None:
    # In the ISR (within the lag time) but far behind the leader's last index: TimeoutNow
    # could not go soon, and the transfer would race its own election timeout.
    node, balance, _ = balancer()
    core = node.runtime(0).core
    core.log.last = 100
    core.matches[2] = 100 - CAUGHT_UP_ENTRIES_MAX - 1
    assert balance.balance_now() == 0
    core.isr.discard(2)
    core.matches[2] = 100 - CAUGHT_UP_ENTRIES_MAX  # the rest would go in one append
    assert balance.balance_now() == 0, "out of the ISR"
    node.runtime(0).core.isr.add(2)
    assert balance.balance_now() == 1, "caught up and in sync"


def test_a_just_restarted_target_is_not_chosen_until_it_has_been_live_long_enough() -> None:
    node, balance, clock = balancer()
    node.live[2] = False  # node 2 restarts: silent (its port refuses) for a moment
    assert balance.balance_now() == 0
    node.live[2] = True
    balance.observe()  # seen live again from now
    clock.now += SETTINGS.target_live_s - 1
    assert balance.balance_now() == 0, "back, caught up, in sync, but not live for long enough"
    clock.now += 1
    assert balance.balance_now() == 1


def test_a_target_dead_in_the_catalog_is_not_chosen() -> None:
    node, balance, _ = balancer()
    node.apply(SetNodeStatus(node_id=2, status=NodeStatus.DEAD))
    assert balance.balance_now() == 0


def test_transfers_in_flight_are_bounded() -> None:
    node, balance, _ = balancer(partitions=5)
    assert balance.balance_now() == SETTINGS.in_flight_max
    assert balance.balance_now() == 0, "no room until one is over"
    node.runtime(0).core.role = Role.FOLLOWER  # the first one moved
    assert balance.balance_now() == 1
    assert len(balance.in_flight) == SETTINGS.in_flight_max
    assert node.transfers() == SETTINGS.in_flight_max + 1


def test_a_group_whose_transfer_aborted_backs_off() -> None:
    node, balance, clock = balancer()
    assert balance.balance_now() == 1
    clock.now += SETTINGS.transfer_timeout_s  # still leading: the transfer aborted
    assert balance.balance_now() == 0, "the group backs off"
    assert balance.transfers_aborted == 1 and not balance.in_flight
    clock.now += SETTINGS.abort_backoff_s - 0.5  # from the abort's discovery
    assert balance.balance_now() == 0
    clock.now += 1
    assert balance.balance_now() == 1, "tried again after the backoff"
    assert node.runtime(0).transfers == [2, 2]


def test_nothing_moves_while_settling_after_a_topic_creation() -> None:
    node, balance, clock = balancer()
    assert balance.balance_now() == 1
    node.runtime(0).core.role = Role.FOLLOWER
    balance.balance_now()  # the transfer is over
    node.create("u", 1)  # a topic is created: no automatic round for the settle period
    node.runtime(0).core.role = Role.LEADER
    assert balance.balance_now() == 0
    assert balance.balance_now(explicit=True) == 1, "an explicit round does not wait"
    node.runtime(0).core.role = Role.FOLLOWER
    balance.balance_now()
    node.runtime(0).core.role = Role.LEADER
    assert balance.balance_now() == 0
    clock.now += SETTINGS.settle_s
    assert balance.balance_now() == 1


def test_nothing_moves_while_settling_after_a_peer_falls_silent() -> None:
    # A node lost (kill -9): its partitions are being elected on the survivors; a transfer
    # now would depose a leader just elected (at 10,000 partitions, hundreds of them).
    node, balance, clock = balancer()
    node.live[3] = False
    assert balance.balance_now() == 0, "node 2 is ready, but node 3 fell silent just now"
    clock.now += SETTINGS.settle_s - 0.5
    assert balance.balance_now() == 0
    clock.now += 0.5
    assert balance.balance_now() == 1
    assert node.runtime(0).transfers == [2]


def test_nothing_moves_while_a_group_here_knows_no_leader() -> None:
    # After a full restart thousands of elections run; a transfer then only races them.
    node, balance, clock = balancer(partitions=2)
    node.runtime(1).core.leader = 0
    node.runtime(1).core.role = Role.FOLLOWER
    assert balance.balance_now() == 0, "partition 0 could go home, but partition 1 has no leader"
    node.runtime(1).core.leader = 2  # elected
    clock.now += SETTINGS.settle_s - 0.5
    assert balance.balance_now() == 0, "settling since the leaderless group was last seen"
    clock.now += 0.5
    assert balance.balance_now() == 1


def test_a_fresh_node_waits_for_its_settle_period() -> None:
    node, clock = FakeNode(1), Clock()
    balance = Balancer(node, BalanceSettings(target_live_s=0, settle_s=10, in_flight_max=4, transfer_timeout_s=1),
                       structlog.get_logger(), clock)  # type: ignore[arg-type]
    assert balance.balance_now() == 0
    clock.now += 10
    assert balance.balance_now() == 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_new_topic_reaches_balance_without_needless_leader_changes(tmp_path: Path) -> None:
    # Goal: after a topic is created on three real nodes, its partitions' first voters win
    # (placement spreads them evenly), and the balancers start no transfer beyond those
    # that partitions led elsewhere need; none aborts; every partition ends at home.
    partitions = 12
    async with running_cluster(tmp_path, leader_balance_settle_ms=1500, leader_balance_target_live_ms=500) as nodes:
        await nodes[0].create_topic("calm", partitions, 3, {})
        for node in nodes:
            await node.wait_for_topic("calm")
        infos = nodes[0].catalog.topics["calm"].partitions
        preferred = [p.replicas[0] for p in infos]
        assert sorted(preferred.count(n.id) for n in nodes) == [4, 4, 4], "placement spreads preferred leaders"
        await until(lambda: all(leader_of(nodes, "calm", p) for p in range(partitions)), "leaders")
        started_before = sum(n.balancer.transfers_started for n in nodes)
        away = sum(leader_of(nodes, "calm", p).id != preferred[p] for p in range(partitions))

        def at_home() -> bool:
            return all((leader := leader_of(nodes, "calm", p)) is not None and leader.id == preferred[p]
                       for p in range(partitions))

        await until(at_home, "every partition led by its preferred replica", 30)
        await asyncio.sleep(3 * 1.0)  # a few more rounds: nothing left to move
        assert at_home()
        started = sum(n.balancer.transfers_started for n in nodes)
        assert started - started_before <= away, f"{started - started_before} transfers for {away} partitions away"
        assert sum(n.balancer.transfers_aborted for n in nodes) == 0
        assert not any(n.balancer.in_flight for n in nodes)


class VersionedNode(FakeNode):
    """A node whose leaderships carry a version, as Routing's do."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.version = 0

    def leadership_version(self) -> tuple[int, int]:
        return self.version, 0


def test_rounds_at_rest_are_skipped_until_an_input_changes_or_the_full_round_is_due() -> None:
    # Goal: an idle node's automatic rounds cost nothing while nothing they depend on
    # changed (they walked every group each second: half its idle CPU at 10,000
    # partitions), and still act at once when something did, and at least every
    # FULL_ROUND_EVERY_S for what the inputs do not show.
    clock = Clock()
    node = VersionedNode(1)
    node.live[2] = False  # the preferred replica's node is down from the start: nothing to do
    balance = Balancer(node, SETTINGS, structlog.get_logger(), clock=clock)  # type: ignore[arg-type]
    balance.observe()
    clock.now += SETTINGS.target_live_s + SETTINGS.settle_s
    assert balance.balance_now() == 0
    assert balance.balance_now() == 0 and balance.rounds_skipped == 1, "the same inputs: skipped"
    node.runtime(0).core.log.last = 100  # what the inputs do not show (a busy partition)...
    node.runtime(0).core.matches[2] = 100 - CAUGHT_UP_ENTRIES_MAX - 1
    node.live[2] = True  # ...but a peer back is an input: a full round, though not yet settled
    assert balance.balance_now() == 0 and balance.rounds_skipped == 1
    clock.now += SETTINGS.target_live_s
    assert balance.balance_now() == 0, "settled now: another input, another full round (lagging)"
    skipped = balance.rounds_skipped
    node.runtime(0).core.matches[2] = 100  # caught up: no input shows it...
    assert balance.balance_now() == 0 and balance.rounds_skipped == skipped + 1, "...so skipped for now"
    clock.now += leadership.FULL_ROUND_EVERY_S
    assert balance.balance_now() == 1, "the full round is due, and finds the move"
    assert node.runtime(0).transfers == [2]


def test_a_change_of_leadership_news_ends_the_skipping() -> None:
    clock = Clock()
    node = VersionedNode(1)
    node.live[2] = False
    balance = Balancer(node, SETTINGS, structlog.get_logger(), clock=clock)  # type: ignore[arg-type]
    balance.observe()
    clock.now += SETTINGS.target_live_s + SETTINGS.settle_s
    assert balance.balance_now() == 0 and balance.balance_now() == 0 and balance.rounds_skipped == 1
    node.version += 1  # a role here, or a peer's list of what it leads, changed
    assert balance.balance_now() == 0 and balance.rounds_skipped == 1, "a full round"
