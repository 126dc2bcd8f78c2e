"""The `move` fault (issue 25): a live node is decommissioned mid-run, so its partition
replicas move to the other nodes while the workload writes and other faults strike,
and it is recommissioned later.

One move is one fault window, and it runs beside the other faults (the nemesis keeps
scheduling kills, pauses and partitions while it lasts; at most one move at a time):

- open: `POST /v1/admin/nodes/{n}/decommission`, asked of another serving node. The
  answer is recorded: `accepted`, `refused` (409 CLUSTER_TOO_SMALL: the other live
  nodes are fewer than a partition's replication factor, e.g. two of five are down;
  nothing was marked, so nothing is undone) or `unknown` (a timeout or a lost answer:
  the mark may be set, so the close recommissions all the same);
- follow: the status (`GET` the same path) every `POLL_S`, asked of a serving node
  other than the target (any node answers for any node, from its catalog), keeping
  every stage seen in order, until the stage is `done` plus a short hold, or
  `MOVE_BOUND_S` after the ask, or the end of the main phase;
- close: `DELETE` (recommission), retried until `RECOMMISSION_S`. Replicas already
  moved stay moved; a node already out of the metadata group is re-admitted as a
  learner by the controller. A target killed or paused meanwhile changes nothing
  here: the calls go to other nodes, and the close happens on time.

After the final heal the runner calls `settle`: every node a move touched must be
recommissioned (asked again if a close did not get through) and back in the
metadata group, within `SETTLE_S`, so the final reads and the replica comparison
see a normal cluster. One that is not is a finding.

On three nodes (replication factor 3) every decommission would be refused, so the
kind is not offered there at all (`unavailable_reason`), like a fault this machine
cannot inject.

`parse_status`, `choose_target`, `stages_seen` and `unavailable_reason` are pure;
`Mover` does the HTTP, with a timeout on every call and a bound on every wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.cluster import ChaosCluster
from chaos.stopping import sleep_or_stop
from chaos.workload import CLIENT_HOST
from multiraft.client import AsyncClient, RaftlogError

STAGES = ("moving_replicas", "leaving_metadata", "done")
METADATA_MEMBERS = ("voter", "learner", "none")
POLL_S = 0.5
# A decommission of one of five nodes moves about 5 of the run's 8 partitions (3 copies
# each over 5 nodes), small logs that a learner copies in a second or two; under kills
# and pauses it may take longer. 45 s bounds a window at half a 90 s run.
MOVE_BOUND_S = 45.0
DONE_HOLD_S = (1.0, 4.0)  # how long a finished decommission stays before its recommission
RECOMMISSION_S = 20.0  # the close's retries; what still fails is asked again in `settle`
SETTLE_S = 60.0  # after the final heal: recommissioned and back in the metadata group
CALL_TIMEOUT_S = 5.0


class StatusError(ValueError):
    """A decommission status that is not the documented shape."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveStatus:
    """`GET /v1/admin/nodes/{n}/decommission`, as the node asked sees it."""

    node_id: int
    decommissioning: bool
    stage: str | None  # one of STAGES; None when not decommissioning
    replicas: int  # partitions it still keeps a copy of
    partitions_led: int
    metadata_member: str  # one of METADATA_MEMBERS
    waiting_for: str


def parse_status(answer: Mapping[str, Any]) -> MoveStatus:
    """The status answer, checked field by field (a changed server shape must not be
    read as 'not done yet' forever)."""
    try:
        status = MoveStatus(node_id=answer["node_id"], decommissioning=answer["decommissioning"],
                            stage=answer["stage"], replicas=answer["replicas"],
                            partitions_led=answer["partitions_led"], metadata_member=answer["metadata_member"],
                            waiting_for=answer["waiting_for"])
    except (KeyError, TypeError) as error:
        raise StatusError(f"decommission status without {error}: {dict(answer)!r:.200}") from None
    for name in ("node_id", "replicas", "partitions_led"):
        value = getattr(status, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StatusError(f"decommission status: {name} {value!r} is no count")
    if not isinstance(status.decommissioning, bool):
        raise StatusError(f"decommission status: decommissioning {status.decommissioning!r}")
    if status.stage is not None and status.stage not in STAGES:
        raise StatusError(f"decommission status: unknown stage {status.stage!r}")
    if (status.stage is None) == status.decommissioning:
        raise StatusError(f"decommission status: stage {status.stage!r} with decommissioning "
                          f"{status.decommissioning}")
    if status.metadata_member not in METADATA_MEMBERS:
        raise StatusError(f"decommission status: metadata_member {status.metadata_member!r}")
    if not isinstance(status.waiting_for, str):
        raise StatusError(f"decommission status: waiting_for {status.waiting_for!r}")
    return status


def stages_seen(seen: Sequence[str], status: MoveStatus) -> list[str]:
    """`seen` with the status's stage appended when it differs from the last one."""
    if status.stage is None or (seen and seen[-1] == status.stage):
        return list(seen)
    return [*seen, status.stage]


def unavailable_reason(nodes: int, replication_factor: int) -> str | None:
    """Why `move` cannot run on this cluster, or None. The server refuses a decommission
    when the other live nodes are fewer than the replication factor of a partition the
    node holds: with `nodes` == the factor, every one."""
    if nodes - 1 < replication_factor:
        return (f"{nodes} nodes, replication factor {replication_factor}: its replicas would have nowhere "
                f"to go (409 CLUSTER_TOO_SMALL); needs {replication_factor + 1}+ nodes")
    return None


def choose_target(rng: random.Random, serving: Sequence[int], held: Mapping[int, int]) -> int | None:
    """A serving node to decommission: one that holds replicas (a move then moves
    something) when there is one, else any serving node (it only leaves the metadata
    group). None when nothing serves."""
    if not serving:
        return None
    holders = [n for n in sorted(serving) if held.get(n, 0) > 0]
    return rng.choice(holders or sorted(serving))


def replicas_by_node(topics: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Node -> partitions whose replicas (catalog) list it, from `GET /v1/topics/{t}` answers."""
    held: dict[int, int] = {}
    for topic in topics:
        for partition in topic["partitions"]:
            for node in partition["replicas"]:
                held[int(node)] = held.get(int(node), 0) + 1
    return held


@dataclass
class MoveRecord:
    """What one move did, for details.json, the window's label and the summary."""

    node: int
    asked_s: float  # since the nemesis started
    answer: str = ""  # accepted | refused CODE | unknown CODE
    replicas_at_start: int | None = None
    stages: list[str] = field(default_factory=list)
    done_after_s: float | None = None  # from the ask to the first `done` seen
    recommissioned: bool = False
    closed_after_s: float | None = None  # from the ask to the recommission's answer
    last_error: str | None = None

    @property
    def refused(self) -> bool:
        return self.answer.startswith("refused")

    def describe(self) -> str:
        if self.refused:
            return f"n{self.node}: {self.answer}"
        stages = " -> ".join(self.stages) or "no stage seen"
        done = f", done in {self.done_after_s:.1f} s" if self.done_after_s is not None else ", not done"
        closed = (f", recommissioned at {self.closed_after_s:.1f} s" if self.recommissioned
                  else ", recommission pending")
        replicas = f" ({self.replicas_at_start} replicas)" if self.replicas_at_start is not None else ""
        return f"n{self.node}{replicas}: {self.answer}; {stages}{done}{closed}"


def summarize(records: Sequence[MoveRecord]) -> str:
    """`3 asked (2 done, 1 refused), longest 14.2 s` for the summary line."""
    done = sum(r.done_after_s is not None for r in records)
    refused = sum(r.refused for r in records)
    longest = max((r.done_after_s for r in records if r.done_after_s is not None), default=None)
    text = f"{len(records)} asked ({done} done, {refused} refused)"
    return text + (f", longest to done {longest:.1f} s" if longest is not None else "")


def http_client(servers: list[str]) -> AsyncClient:
    """Three attempts, each bounded, moving on to the next server: any node answers."""
    return AsyncClient(servers, timeout_s=CALL_TIMEOUT_S, attempts=3, local_host=CLIENT_HOST)


class Mover:
    """The HTTP side of moves on a `ChaosCluster`; `started` is the nemesis's clock origin.
    `client` makes a client over some servers (tests pass a fake)."""

    def __init__(self, cluster: ChaosCluster, rng: random.Random, started: float,
                 clock: Callable[[], float] = time.monotonic,
                 client: Callable[[list[str]], Any] = http_client) -> None:
        self.cluster = cluster
        self.rng = rng
        self.started = started
        self.clock = clock
        self.client = client
        self.records: list[MoveRecord] = []
        self.touched: set[int] = set()  # nodes a move asked about; `settle` checks them all

    def _servers(self, avoid: int | None) -> list[str]:
        nodes = [n for n in self.cluster.serving() if n != avoid] or [n for n in self.cluster.ids if n != avoid]
        return [self.cluster.http(n) for n in nodes]

    def _client(self, avoid: int | None) -> Any:
        return self.client(self._servers(avoid))

    async def pick(self, topics: Sequence[str]) -> int | None:
        held: dict[int, int] = {}
        async with self._client(None) as client:
            with contextlib.suppress(RaftlogError, KeyError, TypeError, ValueError):  # any serving node will do
                held = replicas_by_node([await client.describe_topic(t) for t in topics])
        return choose_target(self.rng, self.cluster.serving(), held)

    async def run(self, node: int, stop: asyncio.Event, on_close: Callable[[MoveRecord], None]) -> MoveRecord:
        """One move of `node`: ask, follow, close. Bounded by MOVE_BOUND_S + RECOMMISSION_S
        plus the calls' timeouts."""
        began = self.clock()
        record = MoveRecord(node=node, asked_s=began - self.started)
        self.records.append(record)
        self.touched.add(node)
        try:
            await self._ask(record)
            if not record.refused:
                await self._follow(record, began, stop)
                await self._recommission(record, began)
        finally:
            on_close(record)
        return record

    async def _ask(self, record: MoveRecord) -> None:
        async with self._client(record.node) as client:
            try:
                status = parse_status(await client.decommission_node(record.node))
            except RaftlogError as error:
                kind = "refused" if error.code == "CLUSTER_TOO_SMALL" else "unknown"
                record.answer = f"{kind} {error.code}"
                return
            except StatusError as error:
                record.answer, record.last_error = "accepted", str(error)
                return
        record.answer = "accepted"
        record.replicas_at_start = status.replicas
        record.stages = stages_seen(record.stages, status)

    async def _follow(self, record: MoveRecord, began: float, stop: asyncio.Event) -> None:
        deadline = began + MOVE_BOUND_S
        hold_until: float | None = None
        async with self._client(record.node) as client:
            while not stop.is_set() and self.clock() < deadline:
                if hold_until is not None and self.clock() >= hold_until:
                    return
                try:
                    status = parse_status(await client.decommission_status(record.node))
                except (RaftlogError, StatusError) as error:
                    record.last_error = f"{type(error).__name__}: {error}"[:200]
                else:
                    record.stages = stages_seen(record.stages, status)
                    if status.stage == "done" and record.done_after_s is None:
                        record.done_after_s = self.clock() - began
                        hold_until = self.clock() + self.rng.uniform(*DONE_HOLD_S)
                await sleep_or_stop(stop, POLL_S)

    async def _recommission(self, record: MoveRecord, began: float) -> None:
        if await self.recommission(record.node, RECOMMISSION_S, record):
            record.recommissioned = True
            record.closed_after_s = self.clock() - began

    async def recommission(self, node: int, budget_s: float, record: MoveRecord | None = None) -> bool:
        """DELETE until an answer says the node is not decommissioning, or `budget_s`."""
        deadline = self.clock() + budget_s
        while True:
            async with self._client(node) as client:
                try:
                    status = parse_status(await client.recommission_node(node))
                    if not status.decommissioning:
                        return True
                except (RaftlogError, StatusError) as error:
                    if record is not None:
                        record.last_error = f"recommission: {type(error).__name__}: {error}"[:200]
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(POLL_S)

    async def settle(self, budget_s: float = SETTLE_S) -> dict[int, str]:
        """After the final heal: every node a move touched recommissioned and a metadata
        member again, asked of every other node in turn. Node -> what is still wrong."""
        deadline = self.clock() + budget_s
        wrong: dict[int, str] = {}
        for node in sorted(self.touched):
            if not await self.recommission(node, max(0.0, deadline - self.clock())):
                wrong[node] = "still decommissioning"
                continue
            problem = await self._until_member(node, deadline)
            if problem:
                wrong[node] = problem
        return wrong

    async def _until_member(self, node: int, deadline: float) -> str:
        problem = "no status"
        while True:
            async with self._client(node) as client:
                try:
                    status = parse_status(await client.decommission_status(node))
                except (RaftlogError, StatusError) as error:
                    problem = f"no status: {error}"[:200]
                else:
                    if status.decommissioning:
                        problem = f"decommissioning again (stage {status.stage})"
                    elif status.metadata_member == "none":
                        problem = "not back in the metadata group"
                    else:
                        return ""
            if self.clock() >= deadline:
                return problem
            await asyncio.sleep(POLL_S)
