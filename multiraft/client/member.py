"""A consumer that is a member of a consumer group: the server splits the partitions.

KIP-848 semantics over HTTP (docs/http.md "Consumer group members"). The member:

- joins with an id it draws itself (so a retried join is the same member), then
  heartbeats on its own task every third of the session timeout (at most 5 s) to
  stay alive: a bounded task, owned by the consumer, cancelled and awaited by
  `close()`; it outlives the cluster's errors (the next beat tries again), and
  anything else that ends it is raised by the next `poll()`;
- fetches records of its partitions with `poll()`, from its own positions (else the
  group's committed offsets, else `auto_offset_reset`), as stored batches (the binary
  answer: values come back exactly as produced, and nothing is rendered as JSON); with `auto_commit` (the
  default), a poll first commits what earlier polls returned, at most every
  `auto_commit_interval_ms` (Kafka's enable.auto.commit, 5 s);
- hands partitions over only inside `poll()` (and `close()`), never from the
  heartbeat task, as a Kafka consumer runs its rebalance listener inside poll: when
  the server revokes partitions, `on_revoked(partitions)` runs first (commit there,
  or let `auto_commit` commit the positions), then the member heartbeats without
  them, which gives them to their next owner; partitions it gets run
  `on_assigned(partitions)` before their first read. Until a revoked partition is
  given back, the heartbeat task still reports it as owned, so the hand-over waits
  for the callback whatever the timing;
- when fenced (a stale epoch) or removed (silent past the session timeout), its
  partitions are lost: `on_lost` (default: `on_revoked`) runs, nothing is committed
  (the commit would be refused), and it joins again as the same member id.

Callbacks may be plain functions or coroutine functions. Answers are applied in the
order their requests were sent, so a heartbeat answer that arrives late (say after
the hand-over) cannot bring back a partition already given away.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from multiraft.client.consumer import ConsumedRecord
from multiraft.client.http import AsyncClient, RaftlogError
from multiraft.client.wakeup import Wakeup
from storage.batch import decode_batch

TopicPartition = tuple[str, int]
Callback = Callable[[set[TopicPartition]], Any]
FENCED_CODES = frozenset({"FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"})
HEARTBEAT_INTERVAL_MAX_S = 5.0
HEARTBEAT_INTERVAL_MIN_S = 0.1


def _pairs(listed: Iterable[dict[str, Any]]) -> set[TopicPartition]:
    return {(item["topic"], p) for item in listed for p in item["partitions"]}


def _listing(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


async def _call(callback: Callback | None, partitions: set[TopicPartition]) -> None:
    if callback is None or not partitions:
        return
    result = callback(set(partitions))
    if inspect.isawaitable(result):
        await result


class AsyncGroupConsumer:
    """`async with AsyncGroupConsumer(client, "billing", topics=["orders"]) as consumer:
    records = await consumer.poll()`."""

    def __init__(self, client: AsyncClient, group: str, *, topics: list[str] | None = None,
                 topic_pattern: str | None = None, auto_offset_reset: str = "latest", auto_commit: bool = True,
                 session_timeout_ms: int | None = None, rebalance_timeout_ms: int | None = None,
                 assignor: str | None = None, max_records: int = 500, wait_ms: int = 500,
                 on_assigned: Callback | None = None, on_revoked: Callback | None = None,
                 on_lost: Callback | None = None, member_id: str | None = None,
                 auto_commit_interval_ms: int = 5000) -> None:
        if (topics is None) == (topic_pattern is None):
            raise ValueError("give topics or a topic_pattern (exactly one)")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset is earliest or latest")
        self.client = client
        self.group = group
        self._subscription = {"topics": sorted(set(topics)) if topics is not None else None,
                              "topic_pattern": topic_pattern}
        self._settings = {"session_timeout_ms": session_timeout_ms, "rebalance_timeout_ms": rebalance_timeout_ms,
                          "assignor": assignor}
        self.auto_offset_reset = auto_offset_reset
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._committed_at = 0.0  # loop time of the last commit poll made
        self.max_records = max_records
        self.wait_ms = wait_ms
        self.on_assigned, self.on_revoked, self.on_lost = on_assigned, on_revoked, on_lost or on_revoked
        self.member_id = member_id or uuid.uuid4().hex
        self.epoch = 0
        self.session_timeout_ms = 0
        self.held: set[TopicPartition] = set()  # ours to read and commit (given back only in poll)
        self.positions: dict[TopicPartition, int] = {}  # the next offset to read, once known
        self.view: dict[str, Any] = {}  # the freshest member view the server gave
        self._sent = 0  # requests sent; an answer applies only if sent after the one applied last
        self._applied = 0
        self._fenced = False
        self._wakeup = Wakeup()
        self._failure: BaseException | None = None
        self._heartbeats: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._join()
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat_loop(),
                                                                  name=f"raftlog-heartbeat-{self.group}")
        self._heartbeats.add_done_callback(self._heartbeats_ended)

    async def close(self, commit: bool = True) -> None:
        """Leave cleanly: revoke everything (callback, commit), then leave, so the others
        take the partitions over at once instead of after the session timeout."""
        await self._stop_heartbeats()
        try:
            if self.held and not self._fenced:
                partitions = set(self.held)
                await _call(self.on_revoked, partitions)
                ours = _pairs(self.view.get("assignment", [])) | _pairs(self.view.get("revoking", []))
                if commit and self.auto_commit:
                    await self.commit(partitions & ours)
        finally:
            self.held.clear()
            self.positions.clear()
            if not self._fenced and self.view:
                await self.client.leave_group(self.group, self.member_id, self.epoch)

    async def _stop_heartbeats(self) -> None:
        task, self._heartbeats = self._heartbeats, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _heartbeats_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()  # raised by the next poll: never lost silently

    # ------------------------------------------------------------------ the member's calls

    def _ticket(self) -> int:
        self._sent += 1
        return self._sent

    def _apply(self, ticket: int, view: dict[str, Any]) -> None:
        if ticket <= self._applied:
            return  # an older request's answer, overtaken by a newer one
        self._applied = ticket
        self.view = view
        self.epoch = view["member_epoch"]
        self.session_timeout_ms = view["session_timeout_ms"]

    async def _join(self) -> None:
        ticket = self._ticket()
        view = await self.client.join_group(self.group, self.member_id, **self._subscription, **self._settings)
        self._fenced = False
        self._apply(ticket, view)

    async def _heartbeat(self, owned: set[TopicPartition]) -> None:
        ticket = self._ticket()
        try:
            view = await self.client.group_heartbeat(self.group, self.member_id, self.epoch, _listing(owned))
        except RaftlogError as error:
            if error.code in FENCED_CODES:
                self._fenced = True
                return
            raise
        self._apply(ticket, view)

    async def _heartbeat_loop(self) -> None:
        while True:
            interval_s = min(HEARTBEAT_INTERVAL_MAX_S, max(HEARTBEAT_INTERVAL_MIN_S, self.session_timeout_ms / 3000))
            await asyncio.sleep(interval_s)
            if self._fenced:
                continue  # poll joins again; until then there is no member to keep alive
            try:
                await self._heartbeat(self.held)  # still holding what poll has not given back
            except RaftlogError:
                # Unreachable, busy, a cluster timeout: the next beat tries again (a session
                # spans several beats). An error that persists (rights taken away) comes out
                # of poll's fetch, which makes the same call; only a bug ends this task.
                continue

    # ------------------------------------------------------------------ rebalance (inside poll)

    async def rebalance(self) -> None:
        """Hand partitions over as the server asks, with the callbacks (poll calls this)."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._fenced:
            await self._lose()
        revoking = _pairs(self.view.get("revoking", []))
        assigned = _pairs(self.view.get("assignment", []))
        gone = self.held - assigned  # revoking (may still commit), or no longer ours at all
        if gone:
            await self.give_back(gone, commit=gone & revoking if self.auto_commit else set())
        new = assigned - self.held
        if new:
            self.take(new)
            await _call(self.on_assigned, new)

    async def _lose(self) -> None:
        lost = set(self.held)
        self.held.clear()
        self.positions.clear()
        await _call(self.on_lost, lost)
        await self._join()

    async def give_back(self, partitions: set[TopicPartition], *, commit: set[TopicPartition],
                        callback: bool = True) -> None:
        """on_revoked, commit the positions of `commit`, then a heartbeat without them all
        (the hand-over: their next owner starts at those commits)."""
        if callback:
            await _call(self.on_revoked, partitions)
        if commit:
            await self.commit(commit)
        self.held -= partitions
        for tp in partitions:
            self.positions.pop(tp, None)
        await self._heartbeat(self.held)

    def take(self, partitions: set[TopicPartition]) -> None:
        self.held |= partitions

    # ------------------------------------------------------------------ records

    async def poll(self) -> list[ConsumedRecord]:
        """Hand over what the server asks, then the next records of the member's partitions
        (long-polls up to `wait_ms` when none are ready)."""
        await self.rebalance()
        await self._commit_when_due()
        records = await self.fetch()
        if self._fenced:
            await self.rebalance()  # lost: on_lost, and join again now rather than at the next poll
        return records

    async def _commit_when_due(self) -> None:
        """With `auto_commit`, Kafka's enable.auto.commit: at most every interval, poll first
        commits what earlier polls returned (at least once: a crash re-reads at most that)."""
        now = asyncio.get_running_loop().time()
        if not self.auto_commit or now - self._committed_at < self.auto_commit_interval_s:
            return
        self._committed_at = now
        try:
            await self.commit()
        except RaftlogError as error:
            if error.code not in FENCED_CODES:
                raise  # fenced: the fetch says so too, and poll loses the partitions

    async def fetch(self) -> list[ConsumedRecord]:
        if self._fenced:
            return []
        positions = [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.positions.items())
                     if (t, p) in self.held]
        body = {"member_epoch": self.epoch, "positions": positions, "auto_offset_reset": self.auto_offset_reset,
                "max_records": self.max_records, "wait_ms": self.wait_ms}
        ticket = self._ticket()
        try:
            got = await self._wakeup.wait_for(self.client.group_fetch_batches(self.group, self.member_id, body))
        except RaftlogError as error:
            if error.code in FENCED_CODES:
                self._fenced = True
                return []
            raise
        if got is None:
            return []  # woken during the long poll: nothing read, nothing moved
        header, batches = got
        self._apply(ticket, header["member"])
        starts = {(p["topic"], p["partition"]): p["offset"] for p in header["positions"]}
        for position in header["positions"]:
            tp = (position["topic"], position["partition"])
            if tp in self.held:
                self.positions[tp] = position["next_offset"]
        records = []
        for topic, partition, base, batch in batches:
            if (topic, partition) not in self.held:
                continue  # assigned since the last hand-over: read again once taken
            start = starts[(topic, partition)]
            batch_header, decoded = decode_batch(batch)
            records.extend(ConsumedRecord(topic, partition, base + i, batch_header.first_timestamp_ms
                                          + record.timestamp_delta_ms, record.key, record.value, record.headers)
                           for i, record in enumerate(decoded) if base + i >= start)
        return records

    def wakeup(self) -> None:
        """End the long poll in progress (or the next one) early: that poll returns no
        records and moves no position (wakeup.py). Call on the client's loop."""
        self._wakeup.set()

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read `partition` from `offset` next (e.g. to give back records not processed)."""
        if (topic, partition) not in self.held or offset < 0:
            raise ValueError(f"{topic}/{partition} is not this member's (or the offset is negative)")
        self.positions[(topic, partition)] = offset

    async def commit(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Commit the positions (next offsets to read) of `partitions` (default: all held)."""
        chosen = sorted((set(partitions) if partitions is not None else self.held) & set(self.positions))
        if not chosen:
            return
        offsets = [{"topic": t, "partition": p, "offset": self.positions[(t, p)]} for t, p in chosen]
        try:
            await self.client.commit_offsets(self.group, offsets, member_id=self.member_id,
                                             member_epoch=self.epoch)
        except RaftlogError as error:
            if error.code in FENCED_CODES:
                self._fenced = True
            raise
