"""Goal: a mirror partition whose source truncated past it (multiraft/node/mirror_truncated.py)
does what its link's `on_source_truncated` says: `stop` waits and proposes nothing; `resync`
proposes one whole resync of that incarnation from the source's log start (a refused proposal
tried again after a growing backoff, never a second one once accepted, none for a promoted
topic), logs and counts it, and the new incarnation then copies from the new start.

The pull runs over tests/unit/test_mirror_pull.py's fakes (a registry whose runtimes apply at
once, a source of in-memory logs), with a real catalog: the resync is validated and applied by
`Catalog.apply`, as group 0's replicas do, through a proposer standing in for the metadata
group (which needs a running Raft group: tests/node/test_mirror_truncated.py runs the real one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from multiraft.metadata.catalog import Catalog, NodeInfo
from multiraft.metadata.commands import DeleteTopic
from multiraft.metadata.features import require_command_level
from multiraft.metadata.mirror_commands import (
    CreateMirrorTopic,
    OnSourceTruncated,
    PromoteMirrorTopic,
    ResyncMirrorPartition,
    SetMirrorLinkPolicy,
)
from multiraft.node import mirror_pull
from multiraft.node.metadata_ops import _catalog_value
from multiraft.node.mirror_pull import MirrorPulls
from multiraft.node.mirror_source import BACKOFF_MAX_S
from multiraft.node.mirror_truncated import (
    CONFIRM_AFTER_S,
    TRUNCATED_RETRY_S,
    Action,
    TruncatedResyncs,
    Truncation,
    truncated_action,
)
from raftlog.errors import ClientError, NotLeader, ProposalDropped
from raftlog.types import GroupId, Index, NodeId
from tests.unit.test_mirror_catalog import _catalog, _finalized
from tests.unit.test_mirror_link_tls import _link
from tests.unit.test_mirror_pull import FakeRegistry, FakeSource, _log, _until, pauses  # noqa: F401 (a fixture)

asynchronous = pytest.mark.asyncio(loop_scope="function")
# Its source partition's identity: FakeSource's group (tests/unit/test_mirror_pull.py).
MIRROR = CreateMirrorTopic(name="orders", link="dr", replication_factor=1, config={},
                           assignments=((NodeId(1),),), start_offsets=(0,), source_groups=(900,))


class CatalogProposer:
    """Group 0 standing in: each command validated and applied to the real catalog (the metadata
    leader's) at the next index, and kept in `log`; `refusals` are raised first, one per call,
    before anything is applied. `sync_catalog` applies what the log holds to `follower`, a node's
    own catalog (the leader's itself when it is None), as the ReadIndex and the wait for it do;
    `syncs=False`: a catalog that still lags after it (not a real ReadIndex: it tests the pull's own
    record of what it proposed)."""

    def __init__(self, catalog: Catalog, refusals: list[ClientError] | None = None,
                 follower: Catalog | None = None, syncs: bool = True) -> None:
        self.catalog = catalog
        self.refusals = list(refusals or [])
        self.proposed: list[Any] = []
        self.log: list[tuple[Index, Any]] = []
        self.follower = follower
        self.syncs = syncs

    def node(self, follower: Catalog, syncs: bool = True) -> CatalogProposer:
        """The same group 0 as another node, holding `follower`, sees it."""
        view = CatalogProposer(self.catalog, follower=follower, syncs=syncs)
        view.proposed, view.log, view.refusals = self.proposed, self.log, self.refusals
        return view

    async def sync_catalog(self) -> None:
        if self.follower is not None and self.syncs:
            for index, command in self.log:
                if index > self.follower.applied_index:
                    self.follower.apply(index, command)

    def check_files(self, assignments: list[list[NodeId]]) -> None:
        """No open-files limit here (discovery asks before it proposes a mirror)."""

    def placeable_nodes(self) -> list[NodeInfo]:
        return self.catalog.placeable_nodes()  # no node below the feature level here

    async def propose(self, command: Any) -> Any:
        self.proposed.append(command)
        if self.refusals:
            raise self.refusals.pop(0)
        require_command_level(self.catalog, command)  # as MetadataOps.propose
        index = Index(self.catalog.applied_index + 1)
        result = self.catalog.apply(index, command)
        self.log.append((index, command))
        if result.error is not None:
            raise result.error
        return _catalog_value(result.value)  # as the metadata leader answers it


class SimpleHolder:
    """A node's CatalogHolder standing in: its catalog, versioned by the last index applied."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    @property
    def topics_index(self) -> int:
        return int(self.catalog.applied_index)


def _setup(monkeypatch: pytest.MonkeyPatch, policy: str, refusals: list[ClientError] | None = None,
           source_start: int = 100, source: FakeSource | None = None, clock: Callable[[], float] | None = None,
           mirror: CreateMirrorTopic = MIRROR) -> tuple[Catalog, CatalogProposer, FakeRegistry, MirrorPulls, GroupId]:
    """A mirror partition led here that copied nothing, its source's log starting at `source_start`
    (`source`: that source, made by the caller to watch or steer it). `clock`: the monotonic clock
    a truncation is confirmed by (`lambda: sum(pauses)`: the time the pull paused, as if slept).
    `mirror`: the mirror topic's command."""
    catalog = _finalized(_catalog(_link(on_source_truncated=policy), mirror))  # a cluster of this build's
    group = catalog.topic("orders").partitions[0].group_id
    registry = FakeRegistry()
    registry.add(group, start=0)  # the mirror copied nothing; the source deleted 0..99
    source = source or FakeSource({0: _log(5, first=source_start)})
    source.start = source_start
    monkeypatch.setattr(mirror_pull, "source_client", lambda *_args: source)
    proposer = CatalogProposer(catalog, refusals)
    holder = SimpleHolder(catalog)
    pulls = MirrorPulls(registry, holder, structlog.get_logger(), random.Random(7), metadata=proposer)  # type: ignore[arg-type]
    if clock is not None:
        pulls.truncated.monotonic = clock
    return catalog, proposer, registry, pulls, group


@asynchronous
async def test_resync_proposes_one_whole_resync_from_the_source_log_start_then_copies(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    catalog, proposer, registry, pulls, old = _setup(monkeypatch, "resync", clock=lambda: sum(pauses))
    try:
        with capture_logs() as logs:
            await pulls.scan()
            await _until(lambda: proposer.proposed, "a resync proposed")
            await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= 5, "the old pull waiting after it")
        assert proposer.proposed == [ResyncMirrorPartition(name="orders", partition=0, group_id=int(old),
                                                           start_offset=100)], "one, whole (no prefix)"
        fresh = catalog.topic("orders").partitions[0]
        assert fresh.group_id != old and fresh.start_offset == 100 and fresh.prefix == ()
        status = pulls.status[old]
        assert status.state == "source_truncated" and "deleted offsets 0..99" in (status.last_error or "")
        assert "replaced by a new incarnation from offset 100, waiting for it" in (status.last_error or "")
        [event] = [e for e in logs if e["event"] == "mirror_source_truncated_resync"]
        assert event["log_level"] == "warning"
        assert {k: event[k] for k in ("link", "topic", "partition", "group_id", "deleted_from", "deleted_to",
                                      "start_offset")} == {"link": "dr", "topic": "orders", "partition": 0,
                                                           "group_id": old, "deleted_from": 0, "deleted_to": 99,
                                                           "start_offset": 100}
        assert pulls.truncated.counts() == {"dr": 1}
        [shown] = pulls.truncated.partitions("dr")
        assert (shown["count"], shown["deleted"], shown["start_offset"], shown["old_group"]) == (1, [0, 99], 100, old)

        # The new incarnation (started by every host's reconcile at the catalog's start offset)
        # is pulled as any mirror partition: from 100 to the source's end.
        registry.leaders.pop(old)
        runtime = registry.add(fresh.group_id, start=100)
        await pulls.scan()
        await _until(lambda: runtime.machine.state.next_offset == 110, "the new incarnation copied")
        assert pulls.status[fresh.group_id].state == "running" and len(proposer.proposed) == 1
    finally:
        await pulls.stop()


@asynchronous
async def test_stop_waits_and_proposes_nothing_until_the_policy_changes(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "stop", clock=lambda: sum(pauses))
    try:
        await pulls.scan()
        await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= 3, "the pull waiting")
        assert proposer.proposed == [] and catalog.topic("orders").partitions[0].group_id == old
        status = pulls.status[old]
        assert status.state == "source_truncated" and status.position == 0
        assert "deleted offsets 0..99" in (status.last_error or "") and "stop" in (status.last_error or "")
        # Changed in place (raftlog mirror alter): the next read of the source resyncs.
        assert catalog.apply(Index(catalog.applied_index + 1),
                             SetMirrorLinkPolicy(name="dr", on_source_truncated="resync")).ok
        await _until(lambda: proposer.proposed, "a resync proposed after the change")
        assert catalog.topic("orders").partitions[0].start_offset == 100
    finally:
        await pulls.stop()


@asynchronous
async def test_a_refused_proposal_backs_off_and_is_tried_again(
        monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:  # noqa: F811
    refusals: list[ClientError] = [NotLeader(0, "no metadata leader"), ProposalDropped("full"), ProposalDropped("x")]
    catalog, proposer, _, pulls, old = _setup(monkeypatch, "resync", refusals, clock=lambda: sum(pauses))
    try:
        with capture_logs() as logs:
            await pulls.scan()
            await _until(lambda: catalog.topic("orders").partitions[0].group_id != old, "the resync accepted")
            await _until(lambda: pauses.count(TRUNCATED_RETRY_S) >= 2, "the pull waiting after it")
    finally:
        await pulls.stop()
    assert len(proposer.proposed) == 4 and len(set(proposer.proposed)) == 1, "the same command, until accepted"
    # The pauses after the refusals: 0.2 s doubling, half random (backoff_s), below 30 s.
    backoffs = [p for p in pauses if p != TRUNCATED_RETRY_S][:3]
    assert [0.1 <= backoffs[0] <= 0.2, 0.2 <= backoffs[1] <= 0.4, 0.4 <= backoffs[2] <= 0.8] == [True] * 3, pauses
    assert all(p <= BACKOFF_MAX_S for p in pauses)
    refused = [e for e in logs if e["event"] == "mirror_source_truncated_resync_refused"]
    assert [e["error"] for e in refused] == ["NOT_LEADER", "PROPOSAL_DROPPED", "PROPOSAL_DROPPED"]
    assert pulls.truncated.counts() == {"dr": 1}


def _truncation(group_id: int, term: int = 1, position: int = 0) -> Truncation:
    """`group_id`'s pull, led in `term`, at `position`; the source's log starting at 100."""
    return Truncation("dr", "orders", 0, GroupId(group_id), position, 100, term)


async def _behind(start: int) -> int:
    """The pull's leader confirmed (`StillBehind`), its applied position 0 as `_truncation` says."""
    assert start > 0
    return 0


# Goal: the decision, from the catalog alone: stop unless the link says resync; never for a
# promoted topic, nor a deleted one, nor one another link mirrors; once per incarnation (proposed here, or
# replaced in the catalog by another node's proposal); never for a mirror that did not record
# its source partition's identity (made before it was).
def test_the_decision_is_a_function_of_the_catalog() -> None:
    catalog = _catalog(_link(on_source_truncated="resync"), MIRROR)
    group = int(catalog.topic("orders").partitions[0].group_id)
    assert truncated_action(catalog, _truncation(group), proposed=False) is Action.RESYNC
    older = _catalog(_link(on_source_truncated="resync"), dataclasses.replace(MIRROR, source_groups=None))
    assert truncated_action(older, _truncation(group), proposed=False) is Action.UNIDENTIFIED
    assert truncated_action(catalog, _truncation(group), proposed=True) is Action.DONE
    assert truncated_action(catalog, _truncation(group + 1), proposed=False) is Action.DONE  # replaced
    assert truncated_action(catalog, Truncation("gone", "orders", 0, GroupId(group), 0, 100, 1), False) is Action.STOP
    stop = _catalog(_link(), MIRROR)
    assert truncated_action(stop, _truncation(group), proposed=False) is Action.STOP
    other = _catalog(_link(on_source_truncated="resync"), _link(name="dr2", on_source_truncated="resync"),
                     dataclasses.replace(MIRROR, link="dr2"))
    assert truncated_action(other, _truncation(group), proposed=False) is Action.GONE  # another link's mirror
    assert catalog.apply(Index(catalog.applied_index + 1), PromoteMirrorTopic(name="orders")).ok
    assert truncated_action(catalog, _truncation(group), proposed=False) is Action.PROMOTED
    assert catalog.apply(Index(catalog.applied_index + 1), DeleteTopic(name="orders")).ok
    assert truncated_action(catalog, _truncation(group), proposed=False) is Action.GONE
    with pytest.raises(AssertionError):
        Truncation("dr", "orders", 0, GroupId(group), 100, 100, 1)  # not truncated past the position


def _resyncs(catalog: Catalog, metadata: CatalogProposer | None) -> TruncatedResyncs:
    """A node's policy over `catalog`, its clock moving `CONFIRM_AFTER_S` at each look."""
    clock = itertools.count(0.0, CONFIRM_AFTER_S)
    return TruncatedResyncs(SimpleHolder(catalog), metadata, structlog.get_logger(),  # type: ignore[arg-type]
                            monotonic=lambda: next(clock))


async def _seen_twice(resyncs: TruncatedResyncs, group: int) -> tuple[float, str]:
    """The truncation of `group` found by two reads `CONFIRM_AFTER_S` apart; what the second did."""
    source = FakeSource({0: _log(5, first=100)})
    source.start = 100
    await resyncs.on_truncated(_truncation(group), source, _behind)
    return await resyncs.on_truncated(_truncation(group), source, _behind)


# Goal: two nodes finding one incarnation truncated (a leader change between two reads) replace
# it once: the second decides on a catalog caught up with the metadata leader's and proposes
# nothing; one whose catalog still lags (no real ReadIndex here) proposes once, the command
# naming the group it replaces applies as a no-op, it proposes no more and counts nothing; a
# node without a proposer (metadata None) acts as stop.
@asynchronous
async def test_racing_nodes_replace_the_incarnation_once() -> None:
    catalog = _catalog(_link(on_source_truncated=OnSourceTruncated.RESYNC.value), MIRROR)
    group = int(catalog.topic("orders").partitions[0].group_id)
    group0 = CatalogProposer(catalog)
    before = catalog.next_group_id
    async with asyncio.timeout(5):
        first = _resyncs(catalog, group0)
        await _seen_twice(first, group)
        assert len(group0.proposed) == 1 and catalog.next_group_id == before + 1
        behind = _catalog(_link(on_source_truncated="resync"), MIRROR)  # has not applied the resync yet
        second = _resyncs(behind, group0.node(behind))
        pause_s, shown = await _seen_twice(second, group)
        assert len(group0.proposed) == 1 and behind.topic("orders").partitions[0].group_id != group
        assert pause_s == TRUNCATED_RETRY_S and "replaced by a new incarnation from offset 100, waiting" in shown
        lagging = _catalog(_link(on_source_truncated="resync"), MIRROR)
        third = _resyncs(lagging, group0.node(lagging, syncs=False))
        _, shown = await _seen_twice(third, group)
        assert "another node's resync had replaced this incarnation already" in shown
        await _seen_twice(third, group)  # its catalog still lags: its own record holds it back
        await _seen_twice(first, group)
        assert catalog.next_group_id == before + 1 and len(group0.proposed) == 2
        # Counted by the node whose proposal replaced the incarnation only (the catalog's apply
        # of the other changed nothing).
        assert (first.counts(), second.counts(), third.counts()) == ({"dr": 1}, {}, {})
        assert [p["count"] for p in first.partitions("dr")] == [1] and third.partitions("dr") == []
        pause_s, shown = await _seen_twice(_resyncs(lagging, None), group)
    assert pause_s == TRUNCATED_RETRY_S and "stop" in shown


class _CountedTopics(dict):  # type: ignore[type-arg]
    """A catalog's topics, counting the walks over all of them."""

    walks = 0

    def values(self) -> Any:
        self.walks += 1
        return super().values()


# Goal: the policy forgets what the catalog no longer names once per catalog version, not at
# every truncation found (each truncated pull calls it every 5 s; the walk reads every mirror
# partition): a command applied, or the catalog replaced (a snapshot restored), walks again.
@asynchronous
async def test_forgetting_walks_the_catalog_once_per_version() -> None:
    catalog = _catalog(_link(), MIRROR)
    topics = catalog.topics = _CountedTopics(catalog.topics)
    holder = SimpleHolder(catalog)
    resyncs = TruncatedResyncs(holder, CatalogProposer(catalog), structlog.get_logger())  # type: ignore[arg-type]
    group = int(catalog.topic("orders").partitions[0].group_id)
    for _ in range(5):
        assert "stop" in (await resyncs.on_truncated(_truncation(group), FakeSource({0: []}), _behind))[1]
    assert resyncs.counts() == {} and resyncs.partitions("dr") == [] and topics.walks == 1
    assert catalog.apply(Index(catalog.applied_index + 1), SetMirrorLinkPolicy(name="dr",
                                                                                on_source_truncated="stop")).ok
    await resyncs.on_truncated(_truncation(group), FakeSource({0: []}), _behind)
    resyncs.counts()
    assert topics.walks == 2
    holder.catalog = Catalog.restore(catalog.snapshot())  # another object, at the same index
    holder.catalog.topics = topics
    resyncs.counts()
    assert topics.walks == 3


# Goal: once a resync is accepted, the status names the start the resync used (as the catalog
# applied it, or as this node proposed it while its catalog has not applied it yet), not this
# node's later reads of the source, which retention may have moved on.
@asynchronous
async def test_the_status_names_the_start_the_resync_used() -> None:
    leader = _catalog(_link(on_source_truncated="resync"), MIRROR)
    group = int(leader.topic("orders").partitions[0].group_id)
    lagging = _catalog(_link(on_source_truncated="resync"), MIRROR)
    group0 = CatalogProposer(leader)
    node = _resyncs(lagging, group0.node(lagging, syncs=False))
    async with asyncio.timeout(5):
        _, shown = await _seen_twice(node, group)
        assert shown.endswith("resync from offset 100 proposed, waiting for the new incarnation"), shown
        later = Truncation("dr", "orders", 0, GroupId(group), 0, 130, 1)  # retention moved on since
        _, shown = await node.on_truncated(later, FakeSource({0: []}), _behind)
        assert "deleted offsets 0..129" in shown and "resync from offset 100 proposed" in shown, shown
        for index, command in group0.log:  # the node's catalog applies the resync
            lagging.apply(index, command)
        _, shown = await node.on_truncated(later, FakeSource({0: []}), _behind)
    assert shown.endswith("replaced by a new incarnation from offset 100, waiting for it"), shown


# Goal: a truncation seen of an incarnation the catalog then drops (its topic deleted, or the
# incarnation replaced) is forgotten at the catalog's next version, so what the policy keeps
# stays bounded by the catalog.
@asynchronous
async def test_sightings_of_incarnations_the_catalog_dropped_are_forgotten() -> None:
    catalog = _catalog(_link(on_source_truncated="resync"), MIRROR)
    group = GroupId(int(catalog.topic("orders").partitions[0].group_id))
    resyncs = TruncatedResyncs(SimpleHolder(catalog), CatalogProposer(catalog), structlog.get_logger(),  # type: ignore[arg-type]
                               monotonic=lambda: 0.0)
    _, shown = await resyncs.on_truncated(_truncation(group), FakeSource({0: []}), _behind)
    assert "resync once the truncation is seen again" in shown and group in resyncs._seen
    assert catalog.apply(Index(catalog.applied_index + 1), DeleteTopic(name="orders")).ok
    resyncs.counts()  # the catalog's next version: what it no longer names is forgotten
    assert resyncs._seen == {}
