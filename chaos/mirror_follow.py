"""`--mirror`, continued: a mirror following its source, a partition increase and a resync
after the source's retention truncated past it (docs/mirror.md "A mirror topic follows its
source's partition increase", "The source truncated past a mirror").

Both are replicated state of the sink that the workload's topics never exercise, so the
runner owns two topics of its own on the source, and writes to them itself (unique values,
one record a batch, every WRITE_PACE_S, round robin over their partitions; the writes are
not in the history: the checks compare the source's log with the sink's, whatever was
acknowledged):

- GROW_TOPIC (`chaos-grow`, one partition at first) is matched by the workload's link
  (`chaos-*`), so it takes that link's faults. The fault kind `source-grow` grows it by 1
  or 2 partitions (`POST /v1/topics/{topic}/partitions`), at most GROWS_MAX times a run,
  and writes HANDFUL records into each new partition at once. It is a topic of its own,
  not one of the workload's: the workload's keys (its writers, pollers, final reads and
  history checks) are fixed when the run starts, so a partition added to `chaos-a` would
  be one no check reads; and the consumer-group workload sizes its subscriptions from the
  run's topic list, whose partitions a growth would change under it.
- TRUNC_TOPIC (`trunc-a`, 4 KiB segments, no retention when the mirror is made: a mirror
  takes its source's settings when made, so the sink keeps everything) is mirrored by a
  second link, RESYNC_LINK (`chaos-resync`, pattern `trunc-*`, which `chaos-*` does not
  match, `on_source_truncated: resync`, naming every source node: a resync is confirmed
  by every replica). The fault kind `source-truncate` pauses that link, sets the topic's
  retention to 8 KiB and writes some BURST_BATCHES * 2 KB into each partition, past what
  retention keeps. Its heal waits (SETTLE_S at most) until every source replica's log
  starts past the first offset written after the pause (so past anything the mirror can
  have copied), turns retention off again and resumes the link: the mirror finds the
  source truncated past its position, confirms it (5 s apart, every replica) and resyncs.
  Retention goes off at the heal so the source's log start stands still from then on: a
  resync starts at the lowest log start the confirmation read, and with retention still
  deleting, the source could delete past the new incarnation while it refills (another
  resync: correct, but one truncation would no longer mean one resync, and the end's
  comparison would chase a moving start). At most TRUNCATIONS_MAX a run.

The nemesis draws both kinds like the others, within their limits, and owes each one a
slot (`due`): a grow early and one mid-run, a truncation early enough for the resync to
finish before the end, so every run exercises both.

At the end (`finish`, after the workload's mirror is checked): the source topic's
partition count against the sink's (waited for, bounded) and every partition's log
against the mirror's; the resync link's partitions `running` (waited for) and their logs
from the source's log start on (chaos/mirror_follow_checks.py). The sink nodes' logs give
the growths and resyncs that happened (`mirror_topic_grown`, `mirror_source_truncated_resync`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chaos.anomalies import Anomaly
from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy, PositionSample, positions_backwards
from chaos.mirror_follow_checks import check_grown, check_resynced, count_events
from chaos.mirror_reads import read_pair
from chaos.stopping import sleep_or_stop
from chaos.workload import CLIENT_HOST
from multiraft.client import AsyncClient, RaftlogError

GROW_TOPIC = "chaos-grow"
GROW_FROM = 1
GROWS_MAX = 3
TRUNC_TOPIC = "trunc-a"
TRUNC_PARTITIONS = 2
RESYNC_LINK = "chaos-resync"
RESYNC_PATTERN = "trunc-*"
SEGMENT = {"segment_bytes": 4096}  # the setting's floor: retention deletes whole closed segments
RETENTION_BYTES = 8192  # docs/mirror.md's example; the burst writes six times that a partition
TRUNCATIONS_MAX = 2
KINDS = ("source-grow", "source-truncate")
LIMITS = {"source-grow": GROWS_MAX, "source-truncate": TRUNCATIONS_MAX}
BURST_BATCHES = 24
BURST_RECORDS = 8
BURST_VALUE_BYTES = 250  # 8 records of 250 bytes: about 2 KB a batch, 48 KB a partition
PAUSE_SETTLE_S = 0.5  # a pull sees its link paused within a scan (0.2 s)
SETTLE_S = 30.0  # retention runs every 2 s on each replica
HANDFUL = 3
NEW_PARTITION_S = 10.0  # a new partition elects its leader within this
WRITE_PACE_S = 0.25
CATCH_UP_S = 60.0

Healer = Callable[[], Awaitable[None]]


@dataclass
class Truncation:
    at_s: float
    paused: str
    firsts: dict[int, int | None] = field(default_factory=dict)  # partition -> first offset written after the pause
    settled: bool | None = None  # every replica's log start past `firsts` before the resume (None: not healed)


class Follow:
    def __init__(self, sink: ChaosCluster, rng: random.Random, sink_client: Callable[..., AsyncClient],
                 action: Callable[[str, str], Awaitable[str]]) -> None:
        """`sink_client(attempts=, timeout_s=)`: a client of the sink; `action(link, what)`:
        pause or resume a link, answering "ok" or the error code."""
        self.sink = sink
        self.rng = rng
        self.sink_client = sink_client
        self.action = action
        self.source: ChaosCluster | None = None
        self.grow_count = GROW_FROM
        self.grows = 0  # growths the source took
        self.truncations: list[Truncation] = []
        self.retention_on = False
        self.written = 0
        self.write_errors = 0
        self._values: Iterator[int] = itertools.count(1)
        self.started = time.monotonic()

    def _source(self, attempts: int = 3, timeout_s: float = 5.0) -> AsyncClient:
        assert self.source is not None
        return AsyncClient([self.source.http(n) for n in self.source.ids], timeout_s=timeout_s, attempts=attempts,
                           local_host=CLIENT_HOST)

    @property
    def keys(self) -> list[PartitionKey]:
        return [PartitionKey(GROW_TOPIC, 0), *(PartitionKey(TRUNC_TOPIC, p) for p in range(TRUNC_PARTITIONS))]

    def due(self, duration_s: float) -> list[tuple[float, str]]:
        """The nemesis's owed slots: a grow early and one mid-run, a truncation early enough
        for its resync (5 s of confirmation, then the refill) to finish before the end."""
        return sorted([(duration_s * self.rng.uniform(0.1, 0.2), "source-grow"),
                       (duration_s * self.rng.uniform(0.2, 0.3), "source-truncate"),
                       (duration_s * self.rng.uniform(0.45, 0.6), "source-grow")])

    # -- set-up -----------------------------------------------------------------

    async def create_topics(self, source: ChaosCluster, replication_factor: int) -> None:
        """On the source, before any link exists (the mirrors are made from these settings)."""
        self.source = source
        async with self._source(attempts=20, timeout_s=30) as client:
            for topic, partitions, config in ((GROW_TOPIC, GROW_FROM, {}), (TRUNC_TOPIC, TRUNC_PARTITIONS, SEGMENT)):
                try:
                    await client.create_topic(topic, partitions, replication_factor, config)
                except RaftlogError as error:  # a create retried after a lost answer
                    if error.code != "TOPIC_EXISTS":
                        raise

    async def create_link(self, client: AsyncClient) -> None:
        assert self.source is not None
        await client.create_mirror(RESYNC_LINK, [self.source.http(n) for n in self.source.ids], RESYNC_PATTERN,
                                   priority="high", on_source_truncated="resync")

    # -- writes -----------------------------------------------------------------

    async def write(self, stop: asyncio.Event) -> None:
        """One unique record every WRITE_PACE_S, round robin over both topics' partitions."""
        async with self._source(attempts=1) as client:
            for turn in itertools.count():
                if stop.is_set():
                    return
                targets = [*(PartitionKey(GROW_TOPIC, p) for p in range(self.grow_count)), *self.keys[1:]]
                await self._write_one(client, targets[turn % len(targets)], "w")
                await sleep_or_stop(stop, WRITE_PACE_S)

    async def _write_one(self, client: AsyncClient, key: PartitionKey, tag: str, pad: int = 0) -> int | None:
        values = [f"{tag}-{key.partition}-{next(self._values)}" + "x" * pad for _ in range(BURST_RECORDS if pad else 1)]
        try:
            answer = await client.produce(key.topic, [{"value": v, "partition": key.partition} for v in values])
        except (RaftlogError, OSError, TimeoutError):
            self.write_errors += 1
            return None
        self.written += len(values)
        return int(answer[0]["offset"])

    # -- faults -------------------------------------------------------------------

    async def grow(self) -> tuple[str, Healer]:
        before = self.grow_count
        wanted = before + self.rng.randint(1, 2)
        async with self._source(attempts=5, timeout_s=10) as client:
            try:
                answer = await client.create_partitions(GROW_TOPIC, wanted)
                how = "ok"
            except RaftlogError as error:  # a repeat after a lost answer meets INVALID_PARTITIONS
                how = error.code
                answer = await _described(client, GROW_TOPIC)
            if answer is not None:
                self.grow_count = max(self.grow_count, len(answer["partitions"]))
            self.grows += self.grow_count > before
            written = 0
            for partition in range(before, self.grow_count):
                written += await self._handful(client, PartitionKey(GROW_TOPIC, partition))

        async def nothing() -> None:
            return None
        return (f"{GROW_TOPIC} {before} -> {self.grow_count} partitions (asked {wanted}: {how}), {written} records "
                f"written into the new ones"), nothing

    async def _handful(self, client: AsyncClient, key: PartitionKey) -> int:
        """HANDFUL records into a new partition, one a batch, while it elects its leader."""
        deadline = time.monotonic() + NEW_PARTITION_S
        written = 0
        while written < HANDFUL and time.monotonic() < deadline:
            if await self._write_one(client, key, "g") is None:
                await asyncio.sleep(0.2)
            else:
                written += 1
        return written

    async def truncate(self) -> tuple[str, Healer]:
        record = Truncation(time.monotonic() - self.started, await self.action(RESYNC_LINK, "pause"))
        self.truncations.append(record)
        await asyncio.sleep(PAUSE_SETTLE_S)
        async with self._source(attempts=5, timeout_s=10) as client:
            retention = await _alter(client, {"retention_bytes": RETENTION_BYTES})
            self.retention_on = True
            for partition in range(TRUNC_PARTITIONS):
                record.firsts[partition] = await self._burst(client, PartitionKey(TRUNC_TOPIC, partition))

        async def heal() -> None:
            record.settled = await self._settled(record.firsts)
            await self.retention_off()
            await self.action(RESYNC_LINK, "resume")
        return (f"{RESYNC_LINK} paused ({record.paused}), retention {RETENTION_BYTES} B ({retention}), "
                f"written past offsets {record.firsts}"), heal

    async def _burst(self, client: AsyncClient, key: PartitionKey) -> int | None:
        """BURST_BATCHES batches of BURST_RECORDS padded values; the first offset written."""
        offsets = [await self._write_one(client, key, "t", BURST_VALUE_BYTES) for _ in range(BURST_BATCHES)]
        return min((o for o in offsets if o is not None), default=None)

    async def _settled(self, firsts: dict[int, int | None]) -> bool:
        """Until every source replica of each partition starts past its first offset written
        after the pause (SETTLE_S at most): each replica applies retention on its own."""
        assert self.source is not None
        deadline = time.monotonic() + SETTLE_S
        async with self._source(attempts=1, timeout_s=3) as client:
            while True:
                views = {n: await _described(client, TRUNC_TOPIC, self.source.http(n)) for n in self.source.ids}
                if all(_past(views, partition, first) for partition, first in firsts.items() if first is not None):
                    return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(1.0)

    async def retention_off(self) -> None:
        if not self.retention_on:
            return
        async with self._source(attempts=5, timeout_s=10) as client:
            for _ in range(10):
                if await _alter(client, {"retention_bytes": None}) == "ok":
                    self.retention_on = False
                    return
                await asyncio.sleep(1.0)

    async def heal(self) -> None:
        """At the final heal: retention off, the resync link running (the nemesis healed
        its faults already; this is in case one was cut short)."""
        await self.retention_off()
        for _ in range(10):
            if await self.action(RESYNC_LINK, "resume") == "ok":
                return
            await asyncio.sleep(1.0)

    # -- the end ------------------------------------------------------------------

    async def finish(self, samples: Iterable[PositionSample] = ()) -> tuple[list[Anomaly], dict[str, Any]]:
        """The checks at the end; `samples`: the positions sampled of these topics' partitions."""
        assert self.source is not None
        began = time.monotonic()
        deadline = began + CATCH_UP_S
        sources = [self.source.http(n) for n in self.source.ids]
        sinks = [self.sink.http(n) for n in self.sink.ids]
        found: list[Anomaly] = []
        async with AsyncClient(sources, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as source_client, \
                AsyncClient(sinks, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as sink_client:
            source_count = await _partitions(source_client, GROW_TOPIC, sources, deadline)
            sink_count = await _partitions(sink_client, GROW_TOPIC, sinks, deadline, want=source_count)
            ends = await _ends(source_client, sources, GROW_TOPIC)
            grown_source: dict[PartitionKey, LogCopy] = {}
            unread: list[str] = []  # source partitions not read: not compared, which fails the run
            grown_sink: dict[PartitionKey, LogCopy | None] = {}
            for partition in range(min(source_count, sink_count)):
                key = PartitionKey(GROW_TOPIC, partition)
                ours, theirs = await read_pair(source_client, sources, sink_client, sinks, key,
                                               ends.get(partition, 0), deadline)
                if ours is None:
                    unread.append(str(key))
                else:
                    grown_source[key], grown_sink[key] = ours, theirs
            found += check_grown(GROW_TOPIC, source_count, sink_count, grown_source, grown_sink,
                                 time.monotonic() - began)
            caught_up = _caught_up(grown_source, grown_sink)
            states = await self._until_running(deadline)
            ends = await _ends(source_client, sources, TRUNC_TOPIC)
            identical, compared = 0, 0
            for key in self.keys[1:]:
                ours, theirs = await read_pair(source_client, sources, sink_client, sinks, key,
                                               ends.get(key.partition, 0), deadline)
                if ours is None:
                    unread.append(str(key))
                    continue
                state, last_error = states.get(key.partition, ("unknown", None))
                verdict = check_resynced(key, ours, theirs, state, last_error, time.monotonic() - began)
                caught_up |= _caught_up({key: ours}, {key: theirs})
                compared += 1
                identical += not verdict
                found += verdict
        found += positions_backwards(samples, caught_up)
        details = {"grow_topic": GROW_TOPIC, "grow_from": GROW_FROM, "grows": self.grows,
                   "source_partitions": source_count, "sink_partitions": sink_count,
                   "truncations": len(self.truncations), "settled": sum(t.settled is True for t in self.truncations),
                   "truncation_records": [vars(t) for t in self.truncations],
                   "resync_compared": compared, "resync_identical": identical, "source_unread": unread,
                   "resync_states": {str(p): s for p, (s, _) in states.items()},
                   "written": self.written, "write_errors": self.write_errors,
                   "events": count_events(self._sink_log_lines(), (GROW_TOPIC, TRUNC_TOPIC)),
                   "waited_s": round(time.monotonic() - began, 1)}
        return found, details

    async def _until_running(self, deadline: float) -> dict[int, tuple[str, str | None]]:
        """The resync link's partitions' (state, last_error), asked until all are `running`
        or `deadline`: the last answer."""
        states: dict[int, tuple[str, str | None]] = {}
        async with self.sink_client(attempts=1, timeout_s=4.0) as client:
            while True:
                try:
                    status = await client.mirror_status(RESYNC_LINK)
                    states = {int(pull["partition"]): (str(pull["state"]), pull.get("last_error"))
                              for topic in status.get("topics", []) if topic["topic"] == TRUNC_TOPIC
                              for pull in topic["partitions"]}
                except (RaftlogError, OSError, ValueError, KeyError):
                    pass
                done = len(states) == TRUNC_PARTITIONS and all(s == "running" for s, _ in states.values())
                if done or time.monotonic() > deadline:
                    return states
                await asyncio.sleep(0.5)

    def _sink_log_lines(self) -> Iterator[dict[str, Any]]:
        for node in self.sink.ids:
            path = self.sink.log_file(node)
            if not path.exists():
                continue
            with open(path, errors="replace") as lines:
                for line in lines:
                    if "mirror_topic_grown" not in line and "mirror_source_truncated_resync" not in line:
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill -9
                    if isinstance(entry, dict):
                        yield entry


def _caught_up(source: dict[PartitionKey, LogCopy], sink: dict[PartitionKey, LogCopy | None]) -> dict[PartitionKey, int]:
    """The sink's end of each partition that reached the source's: no position may pass it."""
    return {key: copy.high_watermark for key, copy in sink.items()
            if copy is not None and key in source and copy.high_watermark >= source[key].high_watermark}


async def _described(client: AsyncClient, topic: str, server: str | None = None) -> dict[str, Any] | None:
    try:
        return await client.describe_topic(topic, server=server)
    except (RaftlogError, OSError, TimeoutError):
        return None


async def _alter(client: AsyncClient, changes: dict[str, Any]) -> str:
    try:
        await client.alter_topic_config(TRUNC_TOPIC, changes)
        return "ok"
    except (RaftlogError, OSError, TimeoutError) as error:
        return getattr(error, "code", type(error).__name__)


def _past(views: dict[int, dict[str, Any] | None], partition: int, first: int) -> bool:
    """Every replica of `partition` (as any answer names them) starts past `first`, by its own node's view."""
    answered = [v for v in views.values() if v is not None]
    if not answered:
        return False
    replicas = {int(n) for v in answered for n in v["partitions"][partition]["replicas"]}
    for node in replicas:
        view = views.get(node)
        start = view["partitions"][partition].get("log_start_offset") if view is not None else None
        if start is None or int(start) <= first:
            return False
    return True


async def _partitions(client: AsyncClient, topic: str, servers: list[str], deadline: float, want: int = 0) -> int:
    """The topic's partition count, the most any server says: asked until one says `want`
    or more (or one answer, `want` 0), or `deadline`."""
    best = 0
    for turn in itertools.count():
        described = await _described(client, topic, servers[turn % len(servers)])
        if described is not None:
            best = max(best, len(described["partitions"]))
            if best >= want and (want or best):
                return best
        if time.monotonic() > deadline:
            return best
        await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def _ends(client: AsyncClient, servers: list[str], topic: str) -> dict[int, int]:
    """Each partition's highest high watermark any server's own replica reports."""
    ends: dict[int, int] = {}
    for server in servers:
        described = await _described(client, topic, server)
        for view in described["partitions"] if described is not None else ():
            if view.get("high_watermark") is not None:
                ends[int(view["partition"])] = max(ends.get(int(view["partition"]), 0), int(view["high_watermark"]))
    return ends
