"""The group runtime drives real cores through the Ready loop on one event loop.

Three runtimes over in-memory storage, messages routed in process: proposals
resolve with their apply results, reads resolve at an applied index, and a
leader that loses its leadership fails its waiters with OutcomeUnknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import structlog
import structlog.testing

from multiraft.runtime.group import COMMIT_HOLD_S, GroupDeps, GroupRuntime
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.errors import NotLeader, OutcomeUnknown, ProposalDropped
from raftlog.messages import RESPONSE_TYPES, Entry, EntryKind, Message, MessageType, Role
from raftlog.types import GroupId, Index, NodeId
from storage.memory import MemoryStorage


class ListMachine:
    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply(self, entry: Entry) -> int:
        if entry.kind is EntryKind.DATA:
            self.applied.append(entry.payload)
        return len(self.applied)

    def restore(self, data: object, index: Index) -> None:
        raise AssertionError("no snapshots in this test")


class Cluster:
    def __init__(self, n: int = 3, persistence: Callable[[int], dict[str, Any]] | None = None, **config: int) -> None:
        """`persistence(node)`: the GroupDeps fields that make node's writes durable
        (sync, store_lazily, write_states, sync_in_background); a runtime chooses its
        persistence strategy once, when it is built."""
        entries, hard_state = bootstrap_entries([NodeId(i) for i in range(1, n + 1)])
        self.runtimes: dict[int, GroupRuntime] = {}
        self.isolated: set[int] = set()
        self.lost: set[MessageType] = set()  # messages of these types are lost on the way
        for node in range(1, n + 1):
            storage = MemoryStorage()
            storage.append(entries)
            storage.set_hard_state(hard_state)
            storage.sync()
            core = RaftCore(Config(node_id=NodeId(node), **config), storage, random.Random(node))
            self.runtimes[node] = GroupRuntime(
                GroupId(7), core, storage, ListMachine(), GroupDeps(
                    send=self.route, logger=structlog.get_logger(), is_live=functools.partial(self.is_live, node),
                    **(persistence(node) if persistence else {})
                )
            )

    def is_live(self, node: int, peer: int) -> bool:
        """Node-level liveness as `node` sees it: the peer is heard unless one is isolated."""
        return node not in self.isolated and peer not in self.isolated

    def route(self, group: GroupId, message: Message) -> None:
        if message.source in self.isolated or message.target in self.isolated or message.type in self.lost:
            return
        self.runtimes[message.target].deliver(message)

    async def ticker(self) -> None:
        while True:
            for runtime in self.runtimes.values():
                runtime.tick()  # an isolated node's clock keeps running
            await asyncio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def running(self, ticking: bool = True) -> AsyncIterator[None]:
        """Every runtime started (and the shared ticker, if `ticking`), all stopped after;
        the body has 20 s."""
        for runtime in self.runtimes.values():
            runtime.start()
        ticker = asyncio.create_task(self.ticker()) if ticking else None
        try:
            async with asyncio.timeout(20):
                yield
        finally:
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
            for runtime in self.runtimes.values():
                await runtime.stop()

    async def leader(self) -> GroupRuntime:
        while True:
            for node, runtime in self.runtimes.items():
                if node not in self.isolated and runtime.core.role is Role.LEADER:
                    return runtime
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_propose_read_and_step_down() -> None:
    cluster = Cluster()
    async with cluster.running():
        leader = await cluster.leader()
        results = await leader.propose([b"a", b"b", b"c"])
        assert results == [1, 2, 3], "each waiter gets its own entry's apply result"
        index = await leader.read_index()
        assert index >= leader.core.commit_index - 0 and leader.core.applied_index >= index

        follower = next(r for r in cluster.runtimes.values() if r is not leader)
        with pytest.raises(NotLeader):
            await follower.propose([b"x"])
        assert await follower.read_index() >= index, "followers read through the leader"

        # Cut the leader off: its pending proposal can no longer commit, and when it
        # steps down (CheckQuorum) the waiter learns the outcome is unknown.
        cluster.isolated.add(leader.core.id)
        pending = asyncio.create_task(leader.propose([b"lost?"]))
        with pytest.raises(OutcomeUnknown):
            await pending
        cluster.isolated.discard(leader.core.id)
        new_leader = await cluster.leader()
        await new_leader.propose([b"d"])  # (whether "lost?" made it is up to the schedule)
        while any(r.state_machine.applied[-1:] != [b"d"] for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
        logs = [r.state_machine.applied for r in cluster.runtimes.values()]
        assert logs[0] == logs[1] == logs[2]
        assert logs[0][:3] == [b"a", b"b", b"c"]


@pytest.mark.asyncio
async def test_the_status_the_edge_reads_is_a_frozen_snapshot() -> None:
    # Goal (issue 22): HTTP, /metrics and the UI read GroupStatus, not the core; the
    # leader's shows the ISR and follower lag, a follower's leaves them out.
    cluster = Cluster()
    async with cluster.running():
        leader = await cluster.leader()
        await leader.propose([b"a", b"b"])
        while any(r.core.applied_index < leader.core.commit_index for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
        status = leader.status()
        assert (status.role, status.leader, status.group_id) == (Role.LEADER, leader.core.id, GroupId(7))
        assert status.in_sync == status.voters == frozenset({1, 2, 3})
        assert status.follower_lag_entries == 0 and status.commit_index == status.last_index
        follower = next(r for r in cluster.runtimes.values() if r is not leader).status()
        assert follower.role is Role.FOLLOWER and follower.leader == leader.core.id
        assert follower.in_sync is None and follower.follower_lag_entries is None
        with pytest.raises(AttributeError):
            status.term = 99  # type: ignore[misc]


@pytest.mark.asyncio
async def test_commit_only_appends_are_held_and_replaced() -> None:
    """A leader's append that carries only a new commit index waits COMMIT_HOLD_S; the
    next write's append replaces it (sequential writes: one append per follower per
    write, not two), and without a next write followers still learn the commit."""
    cluster = Cluster()
    sent: list[Message] = []
    route = cluster.route

    def recording_route(group: GroupId, message: Message) -> None:
        sent.append(message)
        route(group, message)

    for runtime in cluster.runtimes.values():
        runtime.host.send = recording_route
        runtime.start()
    ticker = asyncio.create_task(cluster.ticker())
    try:
        async with asyncio.timeout(20):
            leader = await cluster.leader()
            await leader.propose([b"warm-up"])
            await asyncio.sleep(COMMIT_HOLD_S * 4)
            sent.clear()
            writes = 20
            for n in range(writes):
                await leader.propose([b"w%d" % n])
            appends = [m for m in sent if m.source == leader.core.id and m.type is MessageType.APPEND]
            commit_only = [m for m in appends if not m.entries]
            assert len(appends) - len(commit_only) == 2 * writes
            # The schedule may let a hold expire now and then; replaced holds are most.
            assert len(commit_only) < writes, f"{len(commit_only)} commit-only appends for {writes} writes"

            # No next write: the held commit still reaches both followers, a little later.
            last = leader.core.commit_index
            followers = [r for r in cluster.runtimes.values() if r is not leader]
            # (applied, not just committed: a runtime yields between learning the commit
            # and applying it)
            while any(r.core.applied_index < last for r in followers):
                await asyncio.sleep(COMMIT_HOLD_S / 5)
            assert all(r.state_machine.applied[-1] == b"w%d" % (writes - 1) for r in followers)
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        for runtime in cluster.runtimes.values():
            await runtime.stop()


@pytest.mark.asyncio
async def test_a_full_inbox_sheds_messages_and_refuses_proposals(monkeypatch) -> None:
    """The inbox is bounded: past INBOX_ITEMS_MAX waiting inputs a message is dropped
    (counted; Raft resends) and a proposal or read fails at once with ProposalDropped,
    rather than the loop queueing without end behind a stalled group task. What was
    queued in time is still delivered, in order."""
    monkeypatch.setattr("multiraft.runtime.group.INBOX_ITEMS_MAX", 3)
    cluster = Cluster()
    runtime = cluster.runtimes[1]  # not started: nothing drains the inbox yet
    beats = [Message(type=MessageType.HEARTBEAT, source=NodeId(2), target=NodeId(1), term=1) for _ in range(5)]
    for beat in beats:
        runtime.deliver(beat)
    assert runtime.messages_shed == 2
    with pytest.raises(ProposalDropped):
        await runtime.propose([b"x"])
    with pytest.raises(ProposalDropped):
        await runtime.read_index()
    stepped: list[Message] = []
    monkeypatch.setattr(runtime.core, "step", stepped.append)
    runtime._drain()
    assert stepped == beats[:3]


@pytest.mark.asyncio
async def test_a_follower_woken_by_a_false_alarm_goes_back_to_quiet() -> None:
    """A quiet follower woken because its leader's node seemed silent goes quiet again
    when that node is heard before anything changed here (the node was slow, and its
    leader never woke, so nothing else would quiet the follower). Once the follower has
    campaigned, or a leader was woken, it stays awake: that is no false alarm to undo."""
    cluster = Cluster(heartbeat_interval_ticks=2)  # as a node's (a heartbeat every tick wakes the quiet)
    for node, runtime in cluster.runtimes.items():
        runtime.on_quiesce = lambda group, term, index, node=node: [
            r.request_quiesce(node, term, index) for n, r in cluster.runtimes.items() if n != node]
    async with cluster.running():
        leader = await cluster.leader()
        await leader.propose([b"a"])
        while not all(r.quiesced for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
        follower = next(r for r in cluster.runtimes.values() if r is not leader)

        follower.wake_for_silence()
        assert not follower.quiesced
        await asyncio.sleep(0)  # its task runs; far from an election timeout
        assert follower.sleep_again() and follower.quiesced
        assert not follower.sleep_again(), "nothing to undo twice"

        cluster.isolated.add(leader.core.id)  # now the leader's node is silent for real
        follower.wake_for_silence()
        while follower.core.role is Role.FOLLOWER:
            await asyncio.sleep(0.01)
        assert not follower.sleep_again() and not follower.quiesced, "it campaigned: stays awake"

        cluster.isolated.clear()
        leader.wake_for_silence()
        assert not leader.sleep_again() and not leader.quiesced, "a leader quiets by asking its followers"


@pytest.mark.asyncio
async def test_a_replica_back_short_in_a_quiet_group_is_refilled_and_the_group_quiets_again() -> None:
    """Issue 27, at the runtime: the group is quiet everywhere; a follower is reopened with
    its log cut at damage (marked for repair). Nothing is written, and the quiet leader
    is not touched: the follower does not go quiet (not on the leader's old request, not
    after a false alarm), its notice wakes the leader, which refills it; the store is
    marked repaired, and the whole group goes quiet again."""
    cluster = Cluster(heartbeat_interval_ticks=2)
    for node, runtime in cluster.runtimes.items():
        runtime.on_quiesce = lambda group, term, index, node=node: [
            r.request_quiesce(node, term, index) for n, r in cluster.runtimes.items() if n != node]
    async with cluster.running():
        leader = await cluster.leader()
        await leader.propose([b"a", b"b", b"c", b"d"])
        while not all(r.quiesced for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
        last = leader.core.log.last_index()
        node = next(n for n, r in cluster.runtimes.items() if r is not leader)
        old = cluster.runtimes[node]
        await old.stop()
        storage = old.store
        assert isinstance(storage, MemoryStorage)
        storage.lose_tail(3)
        core = RaftCore(Config(node_id=NodeId(node), heartbeat_interval_ticks=2), storage, random.Random(node))
        short = GroupRuntime(GroupId(7), core, storage, ListMachine(),
                             GroupDeps(send=cluster.route, logger=structlog.get_logger()))
        short.on_quiesce = old.on_quiesce
        cluster.runtimes[node] = short
        short.hold_for_first_voter()
        assert not short.quiesced, "a replica in repair is never held quiet"
        short.start()
        short.request_quiesce(leader.core.id, leader.core.term, last)  # the leader's old request
        short.wake_for_silence()
        await asyncio.sleep(0)
        assert not short.sleep_again() and not short.quiesced, "in repair: it keeps ticking"
        assert leader.quiesced and short.core.log.last_index() == last - 3

        while short.core.log.last_index() < last or short.core.needs_repair:
            await asyncio.sleep(0.01)
        assert storage.initial_state().needs_repair is False, "the store was marked repaired"
        assert leader.core.log.last_index() == last, "refilled without a write"
        assert short.core.leader == leader.core.id
        while not all(r.quiesced for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
        assert leader.core.in_sync_replicas() == {1, 2, 3}


@pytest.mark.asyncio
async def test_campaigns_that_find_no_leader_slow_the_replicas_clock() -> None:
    """A replica that campaigned again and again without a leader emerging lets through
    only every 2nd, 4th, then 8th tick, so an overloaded node's election storm thins out
    instead of feeding itself; the first campaign is not slowed, and once a leader is
    known the clock runs at full speed again."""
    cluster = Cluster()
    lonely = cluster.runtimes[1]
    cluster.isolated.update({2, 3})  # nobody answers node 1: every campaign fails
    async with cluster.running(ticking=False):  # only node 1's clock runs, by hand
        campaigns: list[int] = []
        for _ in range(400):
            lonely.tick()
            await asyncio.sleep(0)  # let the group task drain the tick
            campaigns.append(lonely._campaigns_without_leader)
        assert max(campaigns) >= 5, "it kept campaigning, at a slowing pace"
        # Ticks between the starts of consecutive campaigns grow to 8 election timeouts.
        starts = [i for i in range(1, len(campaigns)) if campaigns[i] > campaigns[i - 1]]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        timeout = lonely.core.config.election_timeout_ticks
        assert gaps[0] < 2 * timeout and gaps[-1] >= 8 * timeout, gaps
        cluster.isolated.clear()  # a leader appears
        while lonely.core.leader == 0:
            lonely.tick()
            await asyncio.sleep(0.001)
        assert lonely._campaigns_without_leader == 0


@pytest.mark.asyncio
async def test_a_held_replica_waits_for_the_first_voter_and_wakes_for_it() -> None:
    """A new group's other voters start quiet (no ticks, so no competing campaigns) and
    wake at the first voter's vote request; release_hold wakes one that heard nothing,
    and does not wake a replica that has since gone quiet for the ordinary reason."""
    cluster = Cluster()
    held = [cluster.runtimes[2], cluster.runtimes[3]]
    for runtime in held:
        runtime.hold_for_first_voter()
    cluster.isolated.add(1)  # the first voter's group has not opened yet
    async with cluster.running():
        await asyncio.sleep(0.5)  # many election timeouts of 5 ms ticks
        assert all(r.quiesced and r.core.role is Role.FOLLOWER for r in held), "held replicas do not campaign"
        cluster.isolated.clear()
        cluster.runtimes[1].request_campaign()
        leader = await cluster.leader()
        assert leader is cluster.runtimes[1]
        async with asyncio.timeout(5):  # woken by the leader's first append, not by its votes
            while any(r.quiesced for r in held):
                await asyncio.sleep(0.005)

        lone = Cluster()
        waiting = lone.runtimes[2]
        waiting.hold_for_first_voter()
        waiting.release_hold()
        assert not waiting.quiesced, "no campaign came: it starts its own clock"
        waiting.quiesced = True  # later quiet for the ordinary reason
        waiting.release_hold()
        assert waiting.quiesced, "a stale release does not wake it"


@pytest.mark.asyncio
async def test_a_held_replica_answers_vote_requests_and_stays_held() -> None:
    """A held replica answers the campaign it waits for without starting its own clock:
    ticking, it would campaign against that candidate whenever the candidate's next round
    was slower than an election timeout (a full restart at 10,000 partitions). A message
    of any other kind wakes it."""
    cluster = Cluster()
    held = cluster.runtimes[2]
    held.hold_for_first_voter()
    cluster.isolated.update({1, 3})  # the candidate's next rounds never come, nor anyone else's
    async with cluster.running():
        core = held.core
        for kind in (MessageType.PRE_VOTE, MessageType.VOTE):
            held.deliver(Message(type=kind, source=3, target=2, term=core.term + 1,
                                 index=core.log.last_index(), log_term=core.log.last_term()))
        await asyncio.sleep(0.5)  # many election timeouts of 5 ms ticks
        assert held.quiesced and held.core.role is Role.FOLLOWER and held.elections == 0
        assert held.core.vote == 3, "it answered: voted for the candidate"
        held.deliver(Message(type=MessageType.HEARTBEAT, source=3, target=2, term=held.core.term))
        async with asyncio.timeout(5):
            while held.quiesced:
                await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_held_replica_wakes_for_a_candidate_whose_log_is_behind_its_own() -> None:
    """A held replica waits for a campaign that can win; a candidate whose log is behind
    its own (it lost unsynced entries in a power failure) cannot win its vote, so it
    starts its own clock at once instead of waiting out the hold (20-30 s leaderless in
    chaos runs after a restart)."""
    cluster = Cluster()
    held = cluster.runtimes[2]
    held.hold_for_first_voter()
    cluster.isolated.update({1, 3})
    async with cluster.running():
        core = held.core
        held.deliver(Message(type=MessageType.PRE_VOTE, source=3, target=2, term=core.term + 1,
                             index=core.log.last_index() - 1, log_term=core.log.last_term()))
        async with asyncio.timeout(5):
            while held.quiesced:
                await asyncio.sleep(0.005)
        assert core.vote != 3


@pytest.mark.asyncio
async def test_a_flushed_ready_answers_then_writes_the_states_then_applies() -> None:
    """With the node's flusher, a Ready that waited for a flush sends its answers first,
    then, if it has entries to apply, has the flush's state write done
    (Flusher.write_states), and only then applies: the answer does not wait for the
    database write, and nothing is applied (and served) by a follower above what is
    stored."""
    events: list[tuple[int, str]] = []

    def flusher(node: int) -> dict[str, Any]:
        def sync(store: MemoryStorage) -> asyncio.Future[None]:
            events.append((node, "flush"))
            store.sync()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

        return {"sync": sync, "store_lazily": lambda store: store.sync(),
                "write_states": lambda: events.append((node, "states"))}

    cluster = Cluster(persistence=flusher)
    for node, runtime in cluster.runtimes.items():

        def send(group: GroupId, message: Message, node: int = node) -> None:
            if message.type in RESPONSE_TYPES:
                events.append((node, "answer"))
            cluster.route(group, message)

        def apply(entry: Entry, machine: ListMachine = runtime.state_machine, node: int = node) -> int:
            events.append((node, "apply"))
            return ListMachine.apply(machine, entry)

        def advance(ready: Any, persisted: bool = True, core: RaftCore = runtime.core, node: int = node) -> None:
            events.append((node, "advance"))  # the end of one Ready
            RaftCore.advance(core, ready, persisted)

        runtime.core.advance = advance  # type: ignore[method-assign]
        runtime.host.send = send
        runtime.state_machine.apply = apply  # type: ignore[method-assign]
    async with cluster.running():
        leader = await cluster.leader()
        for payload in (b"a", b"b", b"c"):
            await leader.propose([payload])
        while any(r.state_machine.applied[-1:] != [b"c"] for r in cluster.runtimes.values()):
            await asyncio.sleep(0.01)
    answered_first = 0
    for node, runtime in cluster.runtimes.items():
        mine = [what for who, what in events if who == node]
        assert mine.count("flush") >= 3, mine
        readys, current = [], []
        for what in mine:
            if what == "advance":
                readys.append(current)
                current = []
            else:
                current.append(what)
        for ready in readys:
            if "flush" in ready and "apply" in ready:
                assert ready[ready.index("flush") + 1:ready.index("apply")][-1:] == ["states"], f"node {node}: {ready}"
            after_flush = ready[ready.index("flush"):] if "flush" in ready else []
            if runtime is not leader and "answer" in after_flush and "states" in after_flush:
                assert after_flush.index("answer") < after_flush.index("states"), f"node {node}: {ready}"
                answered_first += 1
    # How many Readies hold a flush, an answer and a state write depends on how the
    # appends and commits happen to batch; each follower has at least one.
    assert answered_first >= 2, "the followers answered their appends before their state writes"


@pytest.mark.asyncio
async def test_a_gone_leader_is_replaced_without_waiting_for_an_election_timeout() -> None:
    """When the node learns a leader's node is gone (its raft port refuses connections),
    the lowest-numbered voter left campaigns at once and the others give up the dead
    leader's lease: a new leader with no tick at all. A stale report (a node that does
    not lead) changes nothing. Every line the groups log carries their group id and
    the term they were in when they logged it."""
    with structlog.testing.capture_logs() as logs:  # (loggers bound inside it are captured)
        new, term_before = await _replace_a_gone_leader()
    campaign = [e for e in logs if e["event"] == "campaign_leader_gone"]
    assert campaign and all(e["group_id"] == 7 and e["term"] == term_before for e in campaign)
    assert any(e["event"] == "role_changed" and e["role"] == "leader" and e["term"] == new.core.term for e in logs)
    assert all("term" in e and "group_id" in e for e in logs)


async def _replace_a_gone_leader() -> tuple[GroupRuntime, int]:
    cluster = Cluster()
    async with cluster.running(ticking=False):
        while (leader := next((r for r in cluster.runtimes.values() if r.core.role is Role.LEADER), None)) is None:
            for runtime in cluster.runtimes.values():
                runtime.tick()
            await asyncio.sleep(0.005)
        await leader.propose([b"a"])
        followers = [r for r in cluster.runtimes.values() if r is not leader]
        while any(r.core.leader != leader.core.id for r in followers):
            await asyncio.sleep(0.005)
        terms = {r.core.term for r in followers}

        followers[0].leader_gone(99)  # not its leader: nothing happens
        await asyncio.sleep(0.05)
        assert all(r.core.leader == leader.core.id for r in followers)

        cluster.isolated.add(leader.core.id)  # dead: no ticks from here on either
        for runtime in followers:
            runtime.leader_gone(leader.core.id)
        while not any(r.core.role is Role.LEADER for r in followers):
            await asyncio.sleep(0.005)
        new = next(r for r in followers if r.core.role is Role.LEADER)
        assert new.core.id == min(r.core.id for r in followers), "the lowest-numbered voter left"
        assert new.core.term > max(terms)
        assert await new.propose([b"b"]) == [2]
    (term_before,) = terms
    return new, term_before


Held = list[tuple[MemoryStorage, asyncio.Future[None]]]


def hold_background_fsyncs() -> tuple[Cluster, dict[int, Held], list[int]]:
    """A cluster whose runtimes' flushes are the test's: a waited-for one completes at
    once (and its node is recorded), a background one (a leader's own write) is held,
    per node, until the test resolves it: the "fsync" takes as long as the test likes."""
    pending: dict[int, Held] = {}
    waited: list[int] = []

    def flusher(node: int) -> dict[str, Any]:
        def sync(store: MemoryStorage) -> asyncio.Future[None]:
            waited.append(node)
            store.sync()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

        def in_background(store: MemoryStorage) -> asyncio.Future[None]:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending.setdefault(node, []).append((store, done))
            return done

        return {"sync": sync, "store_lazily": lambda store: store.sync(), "sync_in_background": in_background}

    return Cluster(persistence=flusher), pending, waited


@pytest.mark.asyncio
async def test_a_leader_answers_before_its_own_fsync_and_counts_itself_after() -> None:
    """A leader's own appends are made durable in the background (the node's
    Flusher.sync_in_background): a write is committed, applied and answered on its
    followers' acknowledgements while the leader's fsync still runs; the leader counts
    itself, and answers acks=leader writes, only once that fsync reports; and a failed
    background fsync fails the group, as a failed flush always did."""
    cluster, pending, _ = hold_background_fsyncs()
    async with cluster.running():
        leader = await cluster.leader()
        me = leader.core.id
        index = leader.core.log.last_index() + 1
        assert await leader.propose([b"a"]) == [1]  # answered with the fsync still running
        assert pending.get(me), "the leader's append went to the background"
        assert leader.core.progress(me).match < index <= leader.core.commit_index
        assert not [n for n in pending if n != me], "followers never answer before their fsync"

        acks_leader = asyncio.ensure_future(leader.propose([b"b"], acks="leader"))
        while len(pending[me]) < 2:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert not acks_leader.done(), "acks=leader waits for the leader's own fsync"
        for store, done in pending.pop(me):
            store.sync()
            done.set_result(None)
        assert await asyncio.wait_for(acks_leader, 5) == [index + 1], "answered with its index"
        assert leader.core.progress(me).match >= index + 1

        failing = asyncio.ensure_future(leader.propose([b"c"]))
        while not pending.get(me):
            await asyncio.sleep(0.005)
        pending[me][0][1].set_exception(OSError(5, "Input/output error"))
        await asyncio.gather(failing, return_exceptions=True)
        while not leader.failed:
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_leader_whose_background_fsyncs_lag_too_far_waits_for_the_next(monkeypatch) -> None:
    """Followers commit without the leader's disk, so a leader whose fsyncs stall would
    otherwise keep every new entry in memory and queue fsync after fsync: past
    BACKGROUND_BYTES_MAX of unreported background writes, its next write is synced and
    waited for (the group stops taking new work until the disk catches up)."""
    monkeypatch.setattr("multiraft.runtime.persistence.BACKGROUND_BYTES_MAX", 1)  # one write in the background at most
    cluster, pending, waited = hold_background_fsyncs()
    async with cluster.running():
        leader = await cluster.leader()
        me = leader.core.id
        background = pending.setdefault(me, [])
        for store, done in background:  # the leader's first entry (its term's no-op)
            store.sync()
            done.set_result(None)
        background.clear()
        await asyncio.sleep(0.01)
        assert await leader.propose([b"a"]) == [1]
        assert len(background) == 1, "the first write's fsync went to the background"
        waited.clear()
        assert await leader.propose([b"b"]) == [2]
        assert len(background) == 1 and me in waited, "the next one was synced, not queued behind it"
        store, done = background.pop()
        store.sync()
        done.set_result(None)
        await asyncio.sleep(0.01)  # the report is taken on the group's next turn
        assert await leader.propose([b"c"]) == [3]
        assert len(background) == 1, "with the lag reported, writes go to the background again"
        store, done = background.pop()
        store.sync()
        done.set_result(None)


@pytest.mark.asyncio
async def test_a_followers_read_forwarded_to_a_leader_that_is_gone_fails_when_a_new_one_leads() -> None:
    # Goal: a follower's ReadIndex lost on its way to a leader that then hands its leadership
    # to the third node is refused as NOT_LEADER once the follower follows the new leader
    # (it never campaigns itself, so its role never changes), not left waiting for its
    # caller's deadline (the drain of the node leading the metadata group waited 15 s on
    # one); asked again, it is answered by the new leader.
    cluster = Cluster()
    async with cluster.running():
        leader = await cluster.leader()
        await leader.propose([b"a"])
        follower, third = [r for r in cluster.runtimes.values() if r is not leader]
        cluster.lost.add(MessageType.READ_INDEX)
        pending = asyncio.create_task(follower.read_index())
        await asyncio.sleep(0.05)
        assert not pending.done()
        leader.request_transfer(third.core.id)
        with pytest.raises(NotLeader):
            await asyncio.wait_for(pending, 10)
        assert follower.core.role is Role.FOLLOWER  # refused for the leader's change, not its own
        while follower.core.leader != third.core.id:
            await asyncio.sleep(0.005)
        cluster.lost.clear()
        assert await asyncio.wait_for(follower.read_index(), 10) >= 1
