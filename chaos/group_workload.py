"""The consumer-group workload (issue 23): members that join, fetch, commit, give back
and leave, through the nemesis's faults, recorded for `chaos/group_checks.py`.

Each group (`GROUPS`) has a few members, each one logical process that keeps
one member at a time. A member does what a well-behaved KIP-848 consumer does,
over the native HTTP routes (docs/http.md "Consumer groups"), asking a node
drawn at random each call, so every call may be forwarded:

- it joins with its subscription (a short session timeout, so faults expire
  members and move partitions often);
- it fetches records of what it owns, from positions it keeps only for
  partitions it held without a break since it learnt them (a partition that is
  new to it starts at the group's committed offset, else earliest);
- it commits the positions it reached, then heartbeats what it owns; when told to
  give partitions back it commits them first, then heartbeats an `owned` without
  them at the epoch that told it (the release);
- now and then it leaves and joins again later, or vanishes without a word (a
  client crash: its member expires after the session timeout, and the process
  joins again as a new member);
- an unknown member joins again as a new one; a fenced one joins again under its id.

Beside the members, one observer per group fetches the group's committed offsets
(the reads of the `group-offset-backwards` and register checks). After the heal,
`drain` joins one member per group that fetches until it passed every offset the
history saw in the group's topics (the final reads of `group-undelivered`).

Every call is one op in the history, ok, fail or info as the other workloads'
(`chaos/workload.py`); the group errors that refuse before anything changed
(a fenced or unknown member, a partition not owned) are `fail`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from chaos.cluster import ChaosCluster
from chaos.history import MemberAction, MemberView, PartitionKey, PartitionRead
from chaos.history_writer import HistoryWriter
from chaos.stopping import sleep_or_stop
from chaos.workload import CLIENT_HOST, OP_TIMEOUT_S, Stats, outcome_of, value_of
from multiraft.client import AsyncClient, RaftlogError


@dataclass(frozen=True, slots=True)
class GroupSpec:
    name: str
    topics: tuple[str, ...]
    members: int


# Two groups over the runner's two topics: one reads both (eight partitions, three
# members), one reads one topic (four partitions, two members).
GROUPS = (GroupSpec("cg-ab", ("chaos-a", "chaos-b"), 3), GroupSpec("cg-b", ("chaos-b",), 2))
# Short enough that a 1.5-5 s fault expires members (so partitions move under faults),
# long enough for a member that sees no fault to stay (its calls come every ~0.5 s).
SESSION_TIMEOUT_MS = 3_000
REBALANCE_TIMEOUT_MS = 10_000
FETCH_WAIT_MS = 300
FETCH_MAX_RECORDS = 200
HEARTBEAT_EVERY_S = 1.0  # fetches keep a member alive too; heartbeats report what it owns
# A member commits what it read at most this often (and always before it gives partitions
# back or leaves): each commit is a Raft write through the coordinator and the partition.
COMMIT_EVERY_S = 0.3
RETRY_PAUSE_S = (0.05, 0.25)  # after a refused or failed call, before the next
LEAVE_SHARE = 0.005  # per loop turn: leave gracefully, join again later
VANISH_SHARE = 0.005  # per loop turn: stop calling (a crashed client), join again as a new member
AWAY_S = (0.5, 4.0)
DRAIN_DEADLINE_S = 60.0
# History process numbers: the queue workload counts from 1, recovery probes from 10,000.
MEMBER_PROCESSES = 2_000
OBSERVER_PROCESSES = 3_000
DRAIN_PROCESSES = 4_000
# Refused before anything changed: the member must join again, or does not own it.
GROUP_DEFINITE = frozenset({"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH", "PARTITION_NOT_ASSIGNED",
                            "INCONSISTENT_GROUP_CONFIG", "GROUP_MAX_SIZE_REACHED", "NON_EMPTY_GROUP"})


def group_outcome(error: Exception) -> str:
    if isinstance(error, RaftlogError) and error.code in GROUP_DEFINITE:
        return "fail"
    return outcome_of(error)


def view_of(answer: Mapping[str, Any]) -> MemberView:
    """A member's JSON view (join, heartbeat, or a fetch's `member`) as the history keeps it."""
    return MemberView(member_id=answer["member_id"], epoch=int(answer["member_epoch"]),
                      assigned=_keys(answer["assignment"]), revoking=_keys(answer["revoking"]))


def _keys(listed: list[dict[str, Any]]) -> tuple[PartitionKey, ...]:
    return tuple(sorted(PartitionKey(item["topic"], int(p)) for item in listed for p in item["partitions"]))


def _listed(keys: tuple[PartitionKey, ...] | list[PartitionKey]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for key in sorted(keys):
        by_topic.setdefault(key.topic, []).append(key.partition)
    return [{"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()]


@dataclass
class MemberState:
    """What one member knows. `positions` and `committed` only for partitions it held
    without a break since it learnt them: a partition that left and came back starts
    again at the group's committed offset, so the member never commits a stale one."""

    member_id: str | None = None
    epoch: int = 0
    assigned: tuple[PartitionKey, ...] = ()
    revoking: tuple[PartitionKey, ...] = ()
    positions: dict[PartitionKey, int] = field(default_factory=dict)
    committed: dict[PartitionKey, int] = field(default_factory=dict)

    def learn(self, view: MemberView) -> None:
        held = set(view.assigned) | set(view.revoking)
        self.positions = {key: offset for key, offset in self.positions.items() if key in held}
        self.committed = {key: offset for key, offset in self.committed.items() if key in held}
        self.member_id, self.epoch = view.member_id, view.epoch
        self.assigned, self.revoking = view.assigned, view.revoking

    def forget(self, *, keep_id: bool = False) -> None:
        """Drop everything it knew (it owns nothing it knows of); `keep_id` to join again under its id."""
        if not keep_id:
            self.member_id = None
        self.epoch = 0
        self.assigned = self.revoking = ()
        self.positions, self.committed = {}, {}

    def to_commit(self) -> list[tuple[PartitionKey, int]]:
        return [(key, self.positions[key]) for key in (*self.assigned, *self.revoking)
                if key in self.positions and self.positions[key] != self.committed.get(key)]


class GroupMember:
    """One logical process keeping one member of `spec` at a time (module docstring)."""

    def __init__(self, workload: GroupWorkload, spec: GroupSpec, process: int, *, final: bool = False) -> None:
        self.workload = workload
        self.spec = spec
        self.process = process
        self.final = final
        self.state = MemberState()
        self.joined = False  # the member in `state` is one the cluster may hold
        self.last_heartbeat = 0.0
        self.last_commit = 0.0

    def _path(self, tail: str = "") -> str:
        return f"/v1/groups/{self.spec.name}/members{tail}"

    async def _call(self, client: AsyncClient, method: str, path: str, body: Any = None,
                    params: dict[str, Any] | None = None) -> Any:
        _, raw, _ = await client.request(method, path, json_body=body, params=params, ambiguous_retry=False,
                                         server=self.workload.node())
        return orjson.loads(raw) if raw else None

    def _error(self, index: int, error: Exception, kind: str) -> None:
        code = getattr(error, "code", type(error).__name__)
        outcome = group_outcome(error)
        (self.workload.history.fail if outcome == "fail" else self.workload.history.info)(index, code)
        self.workload.stats.record(f"{kind}-{outcome}", time.monotonic())
        if code == "UNKNOWN_MEMBER_ID":
            self.state.forget()
            self.joined = False
        elif code == "FENCED_MEMBER_EPOCH":
            self.state.forget(keep_id=True)  # join again under its id; owns nothing it knows of
            self.joined = False

    async def join(self, client: AsyncClient) -> bool:
        body: dict[str, Any] = {"topics": list(self.spec.topics), "session_timeout_ms": SESSION_TIMEOUT_MS,
                                "rebalance_timeout_ms": REBALANCE_TIMEOUT_MS}
        if self.state.member_id is not None:
            body["member_id"] = self.state.member_id
        index = self.workload.history.invoke_member(self.process, self.spec.name, MemberAction.JOIN, self.state.member_id,
                                             topics=self.spec.topics, session_timeout_ms=SESSION_TIMEOUT_MS,
                                             rebalance_timeout_ms=REBALANCE_TIMEOUT_MS)
        try:
            answer = await self._call(client, "POST", self._path(), body)
        except (RaftlogError, TimeoutError, OSError) as error:
            self._error(index, error, "member")
            return False
        view = view_of(answer)
        self.workload.history.ok_member(index, view)
        self.state.learn(view)
        self.joined = True
        self.last_heartbeat = time.monotonic()
        return True

    async def heartbeat(self, client: AsyncClient) -> None:
        """Report what it owns; when that leaves out partitions it was revoking, this is the release."""
        state = self.state
        assert state.member_id is not None
        owned = state.assigned
        index = self.workload.history.invoke_member(self.process, self.spec.name, MemberAction.HEARTBEAT, state.member_id,
                                             epoch=state.epoch, owned=owned)
        self.last_heartbeat = time.monotonic()
        try:
            answer = await self._call(client, "POST", self._path(f"/{state.member_id}/heartbeat"),
                                      {"member_epoch": state.epoch, "owned": _listed(owned)})
        except (RaftlogError, TimeoutError, OSError) as error:
            self._error(index, error, "member")
            return
        view = view_of(answer)
        self.workload.history.ok_member(index, view)
        state.learn(view)

    async def fetch(self, client: AsyncClient) -> bool:
        """One fetch; True when every partition it read reached `until` (the drain's goal)."""
        state = self.state
        assert state.member_id is not None
        positions = sorted((key, offset) for key, offset in state.positions.items() if key in state.assigned)
        index = self.workload.history.invoke_group_fetch(self.process, self.spec.name, state.member_id, state.epoch,
                                                  positions, final=self.final)
        body = {"member_epoch": state.epoch, "auto_offset_reset": "earliest", "max_records": FETCH_MAX_RECORDS,
                "wait_ms": FETCH_WAIT_MS, "format": "json",
                "positions": [{"topic": k.topic, "partition": k.partition, "offset": o} for k, o in positions]}
        began = time.monotonic()
        try:
            answer = await self._call(client, "POST", self._path(f"/{state.member_id}/records"), body)
        except (RaftlogError, TimeoutError, OSError) as error:
            self._error(index, error, "group-fetch")
            return False
        view = view_of(answer["member"])
        records = [(PartitionKey(r["topic"], int(r["partition"])), int(r["offset"]), value_of(r))
                   for r in answer["records"]]
        reads = [PartitionRead(key=PartitionKey(p["topic"], int(p["partition"])), offset=int(p["offset"]),
                               next_offset=int(p["next_offset"]), high_watermark=int(p["high_watermark"]))
                 for p in answer["positions"]]
        self.workload.history.ok_group_fetch(index, view, records, reads)
        self.workload.stats.record("group-fetch-ok", began)
        state.learn(view)
        for read in reads:
            if read.key in state.assigned:
                state.positions[read.key] = read.next_offset
        return True

    async def commit(self, client: AsyncClient) -> None:
        state = self.state
        offsets = state.to_commit()
        if not offsets or state.member_id is None:
            return
        self.last_commit = time.monotonic()
        index = self.workload.history.invoke_group_commit(self.process, self.spec.name, state.member_id, state.epoch,
                                                   offsets)
        body = {"offsets": [{"topic": k.topic, "partition": k.partition, "offset": o} for k, o in offsets],
                "member_id": state.member_id, "member_epoch": state.epoch}
        try:
            await self._call(client, "POST", f"/v1/groups/{self.spec.name}/offsets", body)
        except (RaftlogError, TimeoutError, OSError) as error:
            self._error(index, error, "group-commit")
            return
        self.workload.history.ok_group_commit(index)
        self.workload.stats.record("group-commit-ok", time.monotonic())
        state.committed.update(offsets)

    async def leave(self, client: AsyncClient) -> None:
        state = self.state
        assert state.member_id is not None
        index = self.workload.history.invoke_member(self.process, self.spec.name, MemberAction.LEAVE, state.member_id,
                                             epoch=state.epoch)
        try:
            await self._call(client, "DELETE", self._path(f"/{state.member_id}"),
                             params={"member_epoch": state.epoch})
        except (RaftlogError, TimeoutError, OSError) as error:
            self._error(index, error, "member")
        else:
            self.workload.history.ok_member(index, None)
        state.forget()
        self.joined = False

    async def turn(self, client: AsyncClient) -> None:
        """One round of a member's life: fetch, commit, give back or heartbeat."""
        if not await self.fetch(client):
            await asyncio.sleep(self.workload.rng.uniform(*RETRY_PAUSE_S))
            return
        if self.state.revoking or time.monotonic() - self.last_commit > COMMIT_EVERY_S:
            await self.commit(client)
        if self.joined and (self.state.revoking or time.monotonic() - self.last_heartbeat > HEARTBEAT_EVERY_S):
            await self.heartbeat(client)

    async def run(self, stop: asyncio.Event) -> None:
        rng = self.workload.rng
        async with self.workload.client() as client:
            while not stop.is_set():
                if not self.joined:
                    if not await self.join(client):
                        await asyncio.sleep(rng.uniform(*RETRY_PAUSE_S))
                    continue
                chance = rng.random()
                if chance < LEAVE_SHARE + VANISH_SHARE:
                    if chance < LEAVE_SHARE:
                        await self.commit(client)
                        await self.leave(client)
                    else:
                        self.state.forget()  # the old member expires; this process comes back as a new one
                        self.joined = False
                    await sleep_or_stop(stop, rng.uniform(*AWAY_S))
                    continue
                await self.turn(client)
            if self.joined:  # the end of the main phase: commit, then leave as a consumer shutting down
                await self.commit(client)
                await self.leave(client)


class GroupWorkload:
    def __init__(self, cluster: ChaosCluster, history: HistoryWriter, rng: random.Random, stats: Stats,
                 partitions: Mapping[str, int], groups: tuple[GroupSpec, ...] = GROUPS) -> None:
        """`partitions`: the partition count of every topic the groups subscribe to."""
        assert all(topic in partitions for spec in groups for topic in spec.topics)
        self.cluster = cluster
        self.partitions = partitions
        self.history = history
        self.rng = rng
        self.stats = stats
        self.groups = groups

    def client(self) -> AsyncClient:
        servers = [self.cluster.http(n) for n in self.cluster.ids]
        return AsyncClient(servers, timeout_s=OP_TIMEOUT_S, attempts=1, local_host=CLIENT_HOST)

    def node(self) -> str | None:
        """A node drawn at random for each call (None: the client's own choice)."""
        serving = self.cluster.serving()
        return self.cluster.http(self.rng.choice(serving)) if serving else None

    async def run(self, stop: asyncio.Event) -> None:
        processes = itertools.count(MEMBER_PROCESSES)
        tasks = [GroupMember(self, spec, next(processes)).run(stop) for spec in self.groups
                 for _ in range(spec.members)]
        tasks += [self._observer(spec, OBSERVER_PROCESSES + number, stop) for number, spec in enumerate(self.groups)]
        await asyncio.gather(*tasks)

    async def _observer(self, spec: GroupSpec, process: int, stop: asyncio.Event) -> None:
        """Fetch the group's committed offsets, one partition per op (the register's reads)."""
        async with self.client() as client:
            while not stop.is_set():
                topic = self.rng.choice(spec.topics)
                key = PartitionKey(topic, self.rng.randrange(self.partitions[topic]))
                index = self.history.invoke_fetch(process, spec.name, key)
                try:
                    _, raw, _ = await client.request("GET", f"/v1/groups/{spec.name}/offsets",
                                                     params={"topic": topic}, server=self.node())
                except (RaftlogError, TimeoutError, OSError) as error:
                    code = getattr(error, "code", type(error).__name__)
                    (self.history.fail if outcome_of(error) == "fail" else self.history.info)(index, code)
                else:
                    found = {int(o["partition"]): int(o["offset"]) for o in orjson.loads(raw)["offsets"]}
                    self.history.ok_fetch(index, found.get(key.partition))
                await sleep_or_stop(stop, self.rng.uniform(0.05, 0.3))

    async def drain(self, targets: Mapping[PartitionKey, int], deadline_s: float = DRAIN_DEADLINE_S) -> dict[str, Any]:
        """After the heal: per group, a new member fetches until its position in every
        partition of the group's topics passed `targets` (the highest offset the history
        saw there), or the deadline. Returns, per group, the partitions left short."""
        deadline = time.monotonic() + deadline_s
        short: dict[str, Any] = {}
        for number, spec in enumerate(self.groups):
            goals = {key: offset for key, offset in targets.items() if key.topic in spec.topics}
            member = GroupMember(self, spec, DRAIN_PROCESSES + number, final=True)
            async with self.client() as client:
                while time.monotonic() < deadline:
                    if not member.joined:
                        if not await member.join(client):
                            await asyncio.sleep(RETRY_PAUSE_S[1])
                        continue
                    if not await member.fetch(client):
                        await asyncio.sleep(RETRY_PAUSE_S[1])
                    elif all(member.state.positions.get(key, 0) > goal for key, goal in goals.items()):
                        break
                    if member.joined and member.state.revoking:
                        await member.heartbeat(client)
                left = {str(key): [member.state.positions.get(key), goal] for key, goal in goals.items()
                        if member.state.positions.get(key, 0) <= goal}
                if member.joined:
                    await member.leave(client)
            if left:
                short[spec.name] = left
        return short
