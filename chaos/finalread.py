"""The final read: every partition read back until the read covers everything the
history says exists, from a node a majority of the replicas name as leader.

Why: `unseen` (chaos/checker.py) is "acknowledged, but not in the final read".
A read that stops short turns the missing tail into unseen values, a false loss.
It happened (600 s, seed 20261126, unseen=285 on chaos-a/0): the runner asked
once who led, the node named was a stale ex-leader that had not heard of the new
one, and the read stopped at its high watermark, 8,124, while values were
acknowledged up to offset 8,245. So a partition's read counts as complete only when

- the high watermark of an answer is above the partition's *target*, the highest
  offset the history saw (acknowledged by a send, or returned by a poll), and
- the node that gave that answer is the leader a majority of the partition's
  replicas name in one term, asked again after the answer.

Otherwise the reader asks again who leads and reads on from where it stopped, on
whichever node is named, until one deadline shared by all partitions. A
partition still short then is its own verdict, `final-read-incomplete` ("node 3
stuck at HW 8124, acked up to 8245"): the checker judges `unseen` only below the
high watermark the read did reach, and the run fails on the verdict itself.

The reader is written against `Replicas` (who leads, read from a node) and an
injected clock and sleep, so tests drive it with fakes; `ClusterReplicas` is
the real cluster over HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chaos.cluster import ChaosCluster
from chaos.history import AnyOp, GroupFetch, Outcome, PartitionKey, Poll, Record, Send
from chaos.history_writer import HistoryWriter
from chaos.workload import value_of
from multiraft.client import AsyncClient, RaftlogError

FINAL_PROCESS = 99_999  # the history process of the final reads
READ_RECORDS_MAX = 5000  # per read: a 600 s run's partition (~10,000 records) in a few answers


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """The highest offsets the history saw on one partition (-1: none)."""

    acked: int = -1  # by an ok send's answer
    read: int = -1  # in an ok poll's records

    @property
    def offset(self) -> int:
        return max(self.acked, self.read)

    def describe(self) -> str:
        if self.read > self.acked:
            return f"acked up to {self.acked}, read up to {self.read}"
        return f"acked up to {self.acked}"


def targets_of(history: Iterable[AnyOp]) -> dict[PartitionKey, Target]:
    """Per partition, the highest acknowledged and the highest read offset."""
    acked: dict[PartitionKey, int] = {}
    read: dict[PartitionKey, int] = {}
    for op in history:
        if op.outcome is not Outcome.OK:
            continue
        if isinstance(op, Send):
            offsets = [o for o in op.offsets if o is not None]
            if offsets:
                acked[op.key] = max(acked.get(op.key, -1), *offsets)
        elif isinstance(op, Poll) and op.records:
            read[op.key] = max(read.get(op.key, -1), *(offset for offset, _ in op.records))
        elif isinstance(op, GroupFetch):
            for key, offset, _ in op.records:
                read[key] = max(read.get(key, -1), offset)
    return {key: Target(acked=acked.get(key, -1), read=read.get(key, -1))
            for key in acked.keys() | read.keys()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadAnswer:
    """One answer to a committed read, from the node that was asked."""

    records: tuple[Record, ...]
    next_offset: int
    high_watermark: int


class ReadFailed(Exception):
    """The node asked did not answer the read (refused, unreachable, timed out)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Replicas(Protocol):
    async def leader(self, key: PartitionKey) -> int | None:
        """The node a majority of the partition's replicas name as leader in one term, or None."""

    async def read(self, key: PartitionKey, node: int, position: int) -> ReadAnswer:
        """A committed read from `position` answered by `node` itself; raises `ReadFailed`."""

    def label(self, node: int) -> str:
        """The node's current incarnation ("n2#3"), for the history."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalReadLimits:
    # All partitions together. A healed cluster elects within a few election timeouts
    # (500 ms each) and a follower catches up in well under a second, so a minute is
    # ample; a partition short after it is a finding, not a slow read.
    budget_s: float = 60.0
    retry_s: float = 0.25  # between two asks of a partition that is not complete yet

    def __post_init__(self) -> None:
        assert self.budget_s > 0
        assert self.retry_s > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalRead:
    """How one partition's final read ended."""

    key: PartitionKey
    target: Target
    complete: bool
    node: int | None  # the node of the last answer (None: no answer at all)
    high_watermark: int  # the highest one any answer reported (-1: no answer)
    confirmed: bool  # the last answering node was confirmed as leader after it answered
    reads: int  # answers received
    last_error: str | None = None

    def details(self) -> dict[str, Any]:
        """For details.json."""
        return {"key": str(self.key), "complete": self.complete, "acked": self.target.acked,
                "read": self.target.read, "node": self.node, "high_watermark": self.high_watermark,
                "confirmed": self.confirmed, "reads": self.reads, "last_error": self.last_error}

    def explanation(self) -> str:
        """Why the read is incomplete, e.g. `node 3 stuck at HW 8124, acked up to 8245`."""
        assert not self.complete
        wanted = self.target.describe()
        if self.node is None:
            failure = f" (last error {self.last_error})" if self.last_error else ""
            return f"no confirmed leader answered{failure}, {wanted}"
        if self.high_watermark > self.target.offset:
            return (f"node {self.node} reached HW {self.high_watermark} ({wanted}) but no majority "
                    "of replicas confirmed it as leader")
        return f"node {self.node} stuck at HW {self.high_watermark}, {wanted}"


@dataclass(slots=True)
class _Progress:
    position: int = 0
    node: int | None = None
    high_watermark: int = -1
    confirmed: bool = False
    reads: int = 0
    last_error: str | None = None


class FinalReader:
    """Reads partitions one after another (one history process, one op at a time)."""

    def __init__(self, replicas: Replicas, history: HistoryWriter, *,
                 limits: FinalReadLimits | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.replicas = replicas
        self.history = history
        self.limits = limits or FinalReadLimits()
        self.clock = clock
        self.sleep = sleep

    async def read_all(self, keys: Sequence[PartitionKey],
                       targets: Mapping[PartitionKey, Target]) -> list[FinalRead]:
        deadline = self.clock() + self.limits.budget_s
        return [await self.read(key, targets.get(key, Target()), deadline) for key in keys]

    async def read(self, key: PartitionKey, target: Target, deadline: float) -> FinalRead:
        """Read `key` until complete or `deadline`. Every partition gets at least one
        round (a leader asked, a read tried), even when an earlier one used the budget."""
        progress = _Progress()
        while True:
            if await self._round(key, target, progress):
                return _result(key, target, progress, complete=True)
            if self.clock() >= deadline:
                return _result(key, target, progress, complete=False)
            await self.sleep(self.limits.retry_s)

    async def _round(self, key: PartitionKey, target: Target, progress: _Progress) -> bool:
        """Ask who leads, read from it up to its high watermark, ask again: True when
        that answer covers the target and the node still leads."""
        node = await self.replicas.leader(key)
        if node is None:
            progress.last_error = "no leader confirmed by a majority of replicas"
            return False
        answer = await self._read_to_hw(key, node, progress)
        if answer is None:
            return False
        progress.confirmed = await self.replicas.leader(key) == node
        return answer.high_watermark > target.offset and progress.confirmed

    async def _read_to_hw(self, key: PartitionKey, node: int, progress: _Progress) -> ReadAnswer | None:
        """Read on `node` from the position reached (on any node: committed entries are
        the same everywhere) until its own high watermark; None if it failed to answer."""
        while True:
            index = self.history.invoke_poll(FINAL_PROCESS, key, progress.position, final=True)
            try:
                answer = await self.replicas.read(key, node, progress.position)
            except ReadFailed as error:
                self.history.fail(index, error.code)
                progress.last_error = error.code
                return None
            self.history.ok_poll(index, answer.records, answer.high_watermark, node=self.replicas.label(node))
            progress.node, progress.reads = node, progress.reads + 1
            progress.high_watermark = max(progress.high_watermark, answer.high_watermark)
            moved = answer.next_offset > progress.position
            progress.position = max(progress.position, answer.next_offset)
            if not moved or progress.position >= answer.high_watermark:
                return answer


def _result(key: PartitionKey, target: Target, progress: _Progress, *, complete: bool) -> FinalRead:
    return FinalRead(key=key, target=target, complete=complete, node=progress.node,
                     high_watermark=progress.high_watermark, confirmed=progress.confirmed,
                     reads=progress.reads, last_error=progress.last_error)


def confirmed_leader(views: Mapping[int, Mapping[str, Any]]) -> int | None:
    """The leader of one partition, from each node's own view of it (`GET /v1/topics/{t}`,
    one partition's entry, keyed by the node that answered): the node that claims the
    highest term, if a majority of the partition's replicas (itself included) name it
    in that term. One node's word is not enough: a deposed leader that has not heard
    of its successor still names itself, and a follower may name a leader that lost."""
    claims = [(int(view["term"]), node) for node, view in views.items() if view.get("role") == "leader"]
    if not claims:
        return None
    term, node = max(claims)
    replicas = set(views[node]["replicas"])
    agree = sum(1 for voter, view in views.items()
                if voter in replicas and view.get("term") == term and view.get("leader") == node)
    return node if agree > len(replicas) // 2 else None


class ClusterReplicas:
    """`Replicas` over HTTP. The client makes one attempt per call: its retries move on
    to another server, and an answer must come from the node asked (its label goes
    into the history, and only the leader's high watermark is worth waiting for)."""

    def __init__(self, cluster: ChaosCluster, client: AsyncClient) -> None:
        assert client.attempts == 1, "an answer must come from the node asked"
        self.cluster = cluster
        self.client = client

    async def leader(self, key: PartitionKey) -> int | None:
        views: dict[int, dict[str, Any]] = {}
        for node in self.cluster.serving():
            try:
                described = await self.client.describe_topic(key.topic, server=self.cluster.http(node))
            except RaftlogError:
                continue
            views[node] = described["partitions"][key.partition]
        return confirmed_leader(views)

    async def read(self, key: PartitionKey, node: int, position: int) -> ReadAnswer:
        try:
            answer = await self.client.consume(key.topic, key.partition, position, max_records=READ_RECORDS_MAX,
                                               server=self.cluster.http(node))
        except RaftlogError as error:
            raise ReadFailed(error.code) from None
        records = tuple((int(r["offset"]), value_of(r)) for r in answer["records"])
        return ReadAnswer(records=records, next_offset=int(answer["next_offset"]),
                          high_watermark=int(answer["high_watermark"]))

    def label(self, node: int) -> str:
        return self.cluster.label(node)
