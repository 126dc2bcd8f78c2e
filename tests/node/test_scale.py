"""Issue 26, "scale without collapse", at a size the node tests afford (tens of groups).

Goal: each behaviour that keeps thousands of groups cheap holds on a real
3-node cluster (one event loop, real sockets and files):
- new groups open in chunks, each chunk's bootstrap durable (one shared flush)
  before any of its groups runs, with the loop free between chunks;
- quiet groups are not ticked (the registry's awake set), and the leaders list
  and `led_partitions` follow role changes without a walk over every group;
- a silent peer wakes only the quiet followers of the groups it led; a leader
  wakes for a dead member only once the controller declares the node dead (ISR);
- a leader goes quiet past members whose nodes are down, wakes by a timer when
  such a member leaves its ISR, and wakes to catch the member up once it is back;
- a restart opens the metadata group first, then the partition groups held:
  the preferred replicas elect, the others do not campaign;
- `Node.stop` stops the groups concurrently.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.node import replicas as replicas_module
from multiraft.node.compaction import Boundaries
from multiraft.node.node import Node
from multiraft.node.replicas import Replicas
from multiraft.node.ticker import _depends_on
from multiraft.runtime.group import GroupRuntime
from raftlog.messages import Membership, Role
from raftlog.types import GroupId, Index
from tests.node.test_node_cluster import (
    batch,
    leader_of,
    produce_retrying,
    restart_all,
    running_cluster,
    until,
)


async def _topic(nodes: list[Node], name: str, partitions: int) -> None:
    await nodes[0].create_topic(name, partitions, 3, {})
    for node in nodes:
        await node.wait_for_topic(name)
    await until(lambda: all(leader_of(nodes, name, p) for p in range(partitions)), f"leaders of {name}", 30)


def _all_quiet(nodes: list[Node]) -> bool:
    return all(n.quiesced_groups() == len(n.groups) for n in nodes)


def _awake_set_agrees(nodes: list[Node]) -> None:
    for node in nodes:
        for group, runtime in node.groups.items():
            assert (group in node.registry.awake) == (not runtime.quiesced), (node.id, group)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_new_groups_open_in_chunks_each_durable_before_it_runs(tmp_path: Path, monkeypatch) -> None:
    # Goal: 100 new groups open in chunks of OPEN_CHUNK_GROUPS; when a group starts, its
    # bootstrap entries and hard state are durable (nothing unsynced, no vote unsaved),
    # and other tasks ran between chunks (the loop was not held for the whole topic).
    monkeypatch.setattr(replicas_module, "OPEN_CHUNK_GROUPS", 16)
    chunks: list[int] = []
    turns: list[int] = [0]
    turns_at_chunk: dict[int, list[int]] = {}
    undurable: list[GroupId] = []
    real_chunk, real_start = Replicas._prepare_chunk, Replicas.start_group

    def prepare_chunk(self: Replicas, catalog: Any, chunk: list[Any], *args: Any) -> Any:
        chunks.append(len(chunk))
        turns_at_chunk.setdefault(self.id, []).append(turns[0])
        return real_chunk(self, catalog, chunk, *args)

    def start_group(self: Replicas, group_id: GroupId, store: Any, created: bool, *args: Any) -> GroupRuntime:
        if created and (store.unsynced_bytes or store.sync_in_flight or store.vote_unsaved()):
            undurable.append(group_id)
        return real_start(self, group_id, store, created, *args)

    monkeypatch.setattr(Replicas, "_prepare_chunk", prepare_chunk)
    monkeypatch.setattr(Replicas, "start_group", start_group)

    async def count_turns() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    async with running_cluster(tmp_path) as nodes:
        counter = asyncio.create_task(count_turns())
        try:
            await _topic(nodes, "chunked", 100)
        finally:
            counter.cancel()
        assert undurable == [], "a group started before its bootstrap was durable"
        assert max(chunks) <= 16 and sum(chunks) == 300, chunks
        for node_turns in turns_at_chunk.values():
            assert all(b > a for a, b in itertools.pairwise(node_turns)), \
                "other tasks ran between a node's chunks"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_quiet_groups_are_not_ticked_and_the_leaders_list_follows_roles(tmp_path: Path) -> None:
    # Goal: once quiet, no group is in the ticker's awake set; a produce puts its group
    # there on the leader; the registry's led table is what a walk over every group would
    # find; led_partitions is cached until a role changes.
    async with running_cluster(tmp_path) as nodes:
        await _topic(nodes, "quiet", 12)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        assert all(len(n.registry.awake) == 0 for n in nodes)
        _awake_set_agrees(nodes)
        for node in nodes:
            walked = {g: r.core.term for g, r in node.groups.items() if r.core.role is Role.LEADER}
            assert dict(node.registry.led) == walked
        leader = leader_of(nodes, "quiet", 3)
        assert leader is not None
        cached = leader.routing.led_partitions()
        assert leader.routing.led_partitions() is cached, "unchanged catalog and roles: the same list"
        group = leader.partition_group("quiet", 3)
        await produce_retrying(leader, "quiet", 3, batch(b"wake"))
        _awake_set_agrees(nodes)
        await until(lambda: _all_quiet(nodes), "quiet again", 30)
        _awake_set_agrees(nodes)
        target = next(n for n in nodes if n is not leader)
        leader.groups[group].request_transfer(target.id)
        await until(lambda: leader_of(nodes, "quiet", 3) is target, "leadership moved")
        assert group not in leader.registry.led and group in target.registry.led
        assert all(p.group_id != group for p in leader.routing.led_partitions()), "the cache followed the move"


def test_a_silence_wakes_only_a_follower_of_the_silent_leader_or_a_leader_without_quorum() -> None:
    # Goal: the ticker's rule: a quiet follower whose leader fell silent needs its clock,
    # and so does a leader left without a quorum of live voters (CheckQuorum must step it
    # down); a leader that keeps a quorum and a held voter (no leader known yet) do not.
    def runtime(role: Role, leader: int, voters: frozenset[int] = frozenset({1, 2, 3})) -> Any:
        return SimpleNamespace(core=SimpleNamespace(role=role, leader=leader, membership=SimpleNamespace(voters=voters)))

    assert _depends_on(runtime(Role.FOLLOWER, 2), {2}, {2})
    assert not _depends_on(runtime(Role.FOLLOWER, 3), {2}, {2})
    assert not _depends_on(runtime(Role.FOLLOWER, 0), {2}, {2}), "a held voter has its own release timer"
    assert not _depends_on(runtime(Role.LEADER, 1), {2}, {2}), "a leader wakes when the node is declared dead"
    assert _depends_on(runtime(Role.LEADER, 1), {3}, {2, 3}), "no quorum left: CheckQuorum needs its clock"
    assert not _depends_on(runtime(Role.LEADER, 1), {4}, {2, 3, 4}), "woken already when its voters fell silent"
    assert not _depends_on(runtime(Role.LEADER, 1, frozenset({1})), {2}, {2}), "a lone voter is its own quorum"
    five = frozenset({1, 2, 3, 4, 5})
    assert not _depends_on(runtime(Role.LEADER, 1, five), {2, 3}, {2, 3})
    assert _depends_on(runtime(Role.LEADER, 1, five), {4}, {2, 3, 4})


def test_boundaries_join_the_set_compaction_walks_at_their_first_capture() -> None:
    # Goal: a compaction pass looks only at groups holding captured states.
    with_captures: set[Any] = set()
    boundaries = Boundaries(GroupId(7), with_captures)
    machine = SimpleNamespace(snapshot=lambda: b"state")
    boundaries.pending.add(Index(5))
    boundaries.applied(Index(4), machine, Membership())
    assert with_captures == set()
    boundaries.applied(Index(5), machine, Membership())
    assert with_captures == {7}


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_stopped_node_wakes_only_the_followers_of_its_groups(tmp_path: Path) -> None:
    # Goal: a peer gone silent (here stopped: its port refuses) wakes the survivors'
    # followers of the groups it led, which elect; the groups the survivors lead stay
    # quiet although the gone node is their member (no dead declaration in this test).
    async with running_cluster(tmp_path, node_dead_after_ms=600_000) as nodes:
        await _topic(nodes, "silence", 12)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        victim = nodes[2]
        survivors = nodes[:2]
        theirs = [p for p in range(12) if leader_of(nodes, "silence", p) is victim]
        ours = {nodes[0].partition_group("silence", p): leader_of(nodes, "silence", p)
                for p in range(12) if p not in theirs}
        assert theirs and ours
        await victim.stop()
        await until(lambda: all(leader_of(survivors, "silence", p) for p in theirs), "the victim's groups led", 15)
        await until(lambda: all(n.peer_silences for n in survivors), "the silence noticed", 15)
        for group, leader in ours.items():
            runtime = leader.groups[group]
            assert runtime.quiesced and runtime.core.role is Role.LEADER, f"group {group} woke for the silence"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_quiet_leader_cut_off_from_its_quorum_wakes_and_steps_down(tmp_path: Path) -> None:
    # Goal: a quiet leader whose other voters' nodes all fall silent wakes, so CheckQuorum
    # steps it down: left quiet, it kept claiming leadership (and answering reads from a
    # high watermark the others had moved past) until the partition healed.
    async with running_cluster(tmp_path, node_dead_after_ms=600_000) as nodes:
        await _topic(nodes, "cutoff", 6)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        alone = nodes[0]
        led = [nodes[0].partition_group("cutoff", p) for p in range(6) if leader_of(nodes, "cutoff", p) is alone]
        assert led, "node 1 leads some partitions"
        for node in nodes[1:]:
            await node.stop()
        await until(lambda: all(alone.groups[g].core.role is not Role.LEADER for g in led),
                    "every leader here stepped down", 20)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_node_declared_dead_wakes_the_leaders_for_the_isr(tmp_path: Path) -> None:
    # Goal: the quiet leaders of groups with a replica on a node the controller declares
    # dead wake and drop it from their in-sync replicas.
    async with running_cluster(tmp_path) as nodes:
        await _topic(nodes, "isr", 6)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        victim = nodes[2]
        led = {nodes[0].partition_group("isr", p): leader_of(nodes, "isr", p) for p in range(6)}
        await victim.stop()

        def shrunk() -> bool:
            return all(leader.groups[g].core.in_sync_replicas() == frozenset(
                {n.id for n in nodes[:2]}) for g, leader in led.items() if leader is not victim)

        await until(shrunk, "the dead node out of every surviving leader's ISR", 30)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_survivors_go_quiet_past_a_stopped_node_and_catch_it_up_when_it_is_back(tmp_path: Path) -> None:
    # Goal: with one node stopped, every group on the survivors goes quiet again, those
    # elected after the loss and those written since included (at 10,000 partitions the
    # ones that could not went on heartbeating, and that load slowed the elections after
    # a kill to a minute); the stopped node leaves each ISR after the lag time although
    # no group ticks (a timer wakes the leader; no dead declaration in this test); once
    # the node is back, the leaders wake, catch it up and take it back into the ISR,
    # and the cluster goes quiet again.
    async with running_cluster(tmp_path, node_dead_after_ms=600_000) as nodes:
        partitions = 8
        await _topic(nodes, "past", partitions)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        victim, survivors = nodes[2], nodes[:2]
        await victim.stop()
        await until(lambda: all(leader_of(survivors, "past", p) for p in range(partitions)), "every partition led", 15)
        for p in range(partitions):
            await produce_retrying(survivors[p % 2], "past", p, batch(b"while node 3 is down"))
        await until(lambda: _all_quiet(survivors), "every survivor group quiet past the stopped node", 30)
        groups = [survivors[0].partition_group("past", p) for p in range(partitions)]

        def isr(expected: set[int]) -> bool:
            leaders = [leader_of(survivors, "past", p) for p in range(partitions)]
            return all(leader is not None and leader.groups[g].core.in_sync_replicas() == expected
                       for leader, g in zip(leaders, groups, strict=True))

        await until(lambda: isr({1, 2}), "the stopped node out of every ISR, the groups quiet", 15)
        await until(lambda: _all_quiet(survivors), "quiet again: the ISR timer woke them for a moment", 15)
        assert sum(n.ticker.groups_woken_for_isr for n in survivors) >= partitions - 1

        nodes[2] = Node(victim.config)
        await nodes[2].start()
        await until(lambda: isr({1, 2, 3}), "node 3 caught up and back in every ISR", 30)
        for p, g in enumerate(groups):
            leader = leader_of(nodes, "past", p)
            assert leader is not None
            assert nodes[2].groups[g].core.log.last_index() == leader.groups[g].core.log.last_index()
        await until(lambda: _all_quiet(nodes), "every group quiet again", 30)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_restart_elects_the_metadata_group_first_then_the_preferred_replicas(tmp_path: Path) -> None:
    # Goal: after a restart of every node, the metadata group has a leader before any
    # partition group campaigns; reopened partition groups are held and their preferred
    # replicas (the catalog's first) elect, so no replica but those stands for election.
    async with running_cluster(tmp_path) as nodes:
        await _topic(nodes, "again", 24)
        await until(lambda: _all_quiet(nodes), "every group quiet", 30)
        campaigns: list[tuple[int, float]] = []  # (node, when) of each partition campaign asked for
        waited: dict[int, tuple[float, int]] = {}  # node -> (when the wait ended, group 0's leader)
        real_campaign, real_wait = GroupRuntime.request_campaign, Replicas._wait_for_metadata_leader

        def request_campaign(self: GroupRuntime) -> None:
            campaigns.append((self.core.id, asyncio.get_running_loop().time()))
            real_campaign(self)

        async def wait(self: Replicas, bound_s: float) -> None:
            await real_wait(self, bound_s)
            waited[self.id] = (asyncio.get_running_loop().time(), self._links.leader_of(GroupId(0)))

        GroupRuntime.request_campaign = request_campaign  # type: ignore[method-assign]
        Replicas._wait_for_metadata_leader = wait  # type: ignore[method-assign]
        try:
            await restart_all(nodes)
            await until(lambda: all(leader_of(nodes, "again", p) for p in range(24)), "every partition led", 30)
        finally:
            GroupRuntime.request_campaign = real_campaign  # type: ignore[method-assign]
            Replicas._wait_for_metadata_leader = real_wait  # type: ignore[method-assign]
        assert sorted(waited) == [1, 2, 3] and all(leader for _, leader in waited.values()), waited
        assert campaigns, "the preferred replicas campaigned"
        assert all(when > waited[node][0] for node, when in campaigns), \
            "a partition group campaigned before its node knew the metadata group's leader"
        catalog = nodes[0].catalog.topics["again"]
        preferred = sum(leader_of(nodes, "again", p).id == catalog.partitions[p].replicas[0]  # type: ignore[union-attr]
                        for p in range(24))
        assert preferred >= 20, f"{preferred} of 24 partitions led by their preferred replica"
        elections = sum(n.groups[g].elections for n in nodes for g in n.groups if g != 0)
        assert elections <= 24 + 4, f"{elections} elections for 24 partitions: the held replicas campaigned"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_stop_stops_the_groups_concurrently(tmp_path: Path) -> None:
    # Goal: Node.stop does not stop thousands of groups one after the other (3,000 ran past
    # the launcher's 10 s grace): several runtimes' stops are under way at once.
    async with running_cluster(tmp_path) as nodes:
        await _topic(nodes, "stopping", 20)
        running = [0]
        most = [0]
        real = GroupRuntime.stop

        async def stop(self: GroupRuntime) -> None:
            running[0] += 1
            most[0] = max(most[0], running[0])
            await asyncio.sleep(0.01)
            try:
                await real(self)
            finally:
                running[0] -= 1

        GroupRuntime.stop = stop  # type: ignore[method-assign]
        try:
            await nodes[0].stop()
        finally:
            GroupRuntime.stop = real  # type: ignore[method-assign]
        assert most[0] == 21, f"at most {most[0]} of 21 groups stopping at once"
