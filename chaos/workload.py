"""The workloads, driven through the public HTTP API with the project's client.

- queue (CHAOS.md 5.2 W1): writers send 1-4 unique integer values to one
  partition (JSON produce, acks=quorum); pollers read partitions from positions
  they keep themselves, asking a chosen node so each read names the server
  incarnation that answered;
- idempotent (W2): producers with (producer id, epoch, sequence) that re-send an
  ambiguous batch unchanged until they get a definite answer, so the server must
  deduplicate;
- offsets (W3): one committer per consumer group commits offsets it has seen
  below the high watermark and fetches them back (a register per partition).

Every operation is recorded invoke-then-complete in the history; the outcome
follows the server's contract: an answer is `ok`, an error code that promises
nothing happened is `fail`, anything else (timeouts, lost answers, 5xx) is
`info`. Each client binds its connections to 127.0.0.100 so network faults can
single out client traffic.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey, ProducerStamp
from chaos.history_writer import HistoryWriter
from multiraft.client import AsyncClient, OutcomeUnknownError, RaftlogError, UnavailableError

CLIENT_HOST = "127.0.0.100"
OP_TIMEOUT_S = 5.0
RESEND_SHARE = 0.1  # acknowledged idempotent batches sent again on purpose
# Codes that promise the request changed nothing (the server refused before proposing).
DEFINITE = frozenset({
    "NOT_LEADER", "LEADER_NOT_AVAILABLE", "PROPOSAL_DROPPED", "NOT_ENOUGH_REPLICAS", "LEADERSHIP_TRANSFER_IN_PROGRESS",
    "INVALID_REQUEST", "INVALID_BATCH", "UNKNOWN_TOPIC", "INVALID_PRODUCER_EPOCH", "OUT_OF_ORDER_SEQUENCE",
    "OFFSET_OUT_OF_RANGE", "MESSAGE_TOO_LARGE", "REQUEST_TOO_LARGE", "UNAVAILABLE",
})


@dataclass
class Stats:
    """Per-second counts for the report's plots: (second, kind) -> count, latencies by second."""

    started: float = field(default_factory=time.monotonic)
    counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    latencies: dict[int, list[float]] = field(default_factory=dict)
    last_ok_send: float = 0.0

    def record(self, kind: str, began: float) -> None:
        now = time.monotonic()
        second = int(now - self.started)
        self.counts[(second, kind)] += 1
        if kind == "send-ok":
            self.latencies.setdefault(second, []).append((now - began) * 1000)
            self.last_ok_send = now


def outcome_of(error: Exception) -> str:
    """'fail' if the error promises the request did nothing, else 'info'."""
    if isinstance(error, OutcomeUnknownError):
        return "info"
    if isinstance(error, UnavailableError):
        return "fail"  # every attempt was refused or never connected (ambiguous ones raise above)
    if isinstance(error, RaftlogError) and error.code in DEFINITE:
        return "fail"
    return "info"


class Workload:
    def __init__(self, cluster: ChaosCluster, history: HistoryWriter, keys: list[PartitionKey],
                 rng: random.Random, stats: Stats, *, writers: int = 4, pollers: int = 2,
                 idempotent: int = 1, committers: int = 1, pace_s: float = 0.02) -> None:
        self.cluster = cluster
        self.history = history
        self.keys = keys
        self.rng = rng
        self.stats = stats
        self.counts = (writers, pollers, idempotent, committers)
        self.pace_s = pace_s
        self._values = itertools.count(1)
        self._processes = itertools.count(1)
        self.positions: dict[PartitionKey, int] = dict.fromkeys(keys, 0)  # offsets known committed
        self.stop = asyncio.Event()

    def _client(self, attempts: int = 3) -> AsyncClient:
        servers = [self.cluster.http(n) for n in self.cluster.ids]
        return AsyncClient(servers, timeout_s=OP_TIMEOUT_S, attempts=attempts, backoff_s=0.05,
                           backoff_max_s=0.2, local_host=CLIENT_HOST)

    async def run(self) -> None:
        writers, pollers, idempotent, committers = self.counts
        tasks = [*(self._writer(next(self._processes)) for _ in range(writers)),
                 *(self._poller(next(self._processes)) for _ in range(pollers)),
                 *(self._idempotent(next(self._processes)) for _ in range(idempotent)),
                 *(self._committer(next(self._processes), f"g{i}") for i in range(committers))]
        await asyncio.gather(*tasks)

    async def _pause(self) -> None:
        await asyncio.sleep(self.rng.uniform(0, 2 * self.pace_s))

    # -- W1 queue ------------------------------------------------------------------

    async def _writer(self, process: int) -> None:
        async with self._client() as client:
            while not self.stop.is_set():
                key = self.rng.choice(self.keys)
                values = [next(self._values) for _ in range(self.rng.randint(1, 4))]
                index = self.history.invoke_send(process, key, values)
                began = time.monotonic()
                try:
                    answer = await client.produce(key.topic, [{"value": v, "partition": key.partition}
                                                              for v in values])
                except (RaftlogError, TimeoutError, OSError) as error:
                    self._complete_error(index, error, "send")
                else:
                    self.history.ok_send(index, [int(o["offset"]) for o in answer])
                    self.stats.record("send-ok", began)
                await self._pause()

    def _complete_error(self, index: int, error: Exception, kind: str) -> None:
        code = getattr(error, "code", type(error).__name__)
        if outcome_of(error) == "fail":
            self.history.fail(index, code)
            self.stats.record(f"{kind}-fail", time.monotonic())
        else:
            self.history.info(index, code)
            self.stats.record(f"{kind}-info", time.monotonic())

    async def _poller(self, process: int) -> None:
        positions: dict[PartitionKey, int] = dict.fromkeys(self.keys, 0)
        async with self._client(attempts=1) as client:
            while not self.stop.is_set():
                key = self.rng.choice(self.keys)
                if self.rng.random() < 0.02:
                    positions[key] = 0  # seek to the beginning now and then
                serving = self.cluster.serving()
                if not serving:
                    await asyncio.sleep(0.1)
                    continue
                node = self.rng.choice(serving)
                label = self.cluster.label(node)
                index = self.history.invoke_poll(process, key, positions[key])
                began = time.monotonic()
                try:
                    answer = await client.consume(key.topic, key.partition, positions[key], max_records=200,
                                                  server=self.cluster.http(node))
                except (RaftlogError, TimeoutError, OSError) as error:
                    self._complete_error(index, error, "poll")  # a read changes nothing either way
                else:
                    records = [(int(r["offset"]), value_of(r)) for r in answer["records"]]
                    self.history.ok_poll(index, records, int(answer["high_watermark"]), node=label)
                    self.stats.record("poll-ok", began)
                    positions[key] = int(answer["next_offset"])
                    self.positions[key] = max(self.positions[key], int(answer["next_offset"]))
                await self._pause()

    # -- W2 idempotent -------------------------------------------------------------

    async def _idempotent(self, process: int) -> None:
        async with self._client(attempts=1) as client:
            stamp: tuple[int, int] | None = None
            sequences: dict[PartitionKey, int] = {}
            while not self.stop.is_set():
                if stamp is None:
                    try:
                        stamp = await client.allocate_producer()
                    except (RaftlogError, TimeoutError, OSError):
                        await asyncio.sleep(0.2)
                        continue
                    sequences = dict.fromkeys(self.keys, 0)
                key = self.rng.choice(self.keys)
                values = [next(self._values) for _ in range(self.rng.randint(1, 3))]
                producer = ProducerStamp(producer_id=stamp[0], epoch=stamp[1], sequence=sequences[key])
                definite = await self._send_until_definite(client, process, key, values, producer)
                if definite == "ok" and self.rng.random() < RESEND_SHARE:
                    # A producer that lost the answer sends the batch again: the cluster must
                    # answer with the original offsets (duplicate=true), never store it twice.
                    await self._send_until_definite(client, process, key, values, producer)
                if definite == "ok":
                    sequences[key] += len(values)
                elif definite != "not-written":
                    # Fenced, a sequence gap, or still unknown after every retry: this sequence
                    # may be taken by a batch we cannot name, so start over as a new producer
                    # (a client restart). Reusing it for other values would be our bug.
                    stamp = None
                await self._pause()

    async def _send_until_definite(self, client: AsyncClient, process: int, key: PartitionKey,
                                   values: list[int], producer: ProducerStamp) -> str:
        body = {"format": "json", "records": [{"value": v} for v in values], "producer_id": producer.producer_id,
                "producer_epoch": producer.epoch, "base_sequence": producer.sequence}
        path = f"/v1/topics/{key.topic}/partitions/{key.partition}/records"
        ambiguous = False  # once an attempt may have been written, only the cluster can tell
        for _ in range(20):  # the same bytes again until the cluster says yes or a definite no
            index = self.history.invoke_send(process, key, values, producer=producer)
            began = time.monotonic()
            try:
                _, raw, _ = await client.request("POST", path, json_body=body, ambiguous_retry=False)
            except (RaftlogError, TimeoutError, OSError) as error:
                self._complete_error(index, error, "send")
                code = getattr(error, "code", "")
                if code in ("INVALID_PRODUCER_EPOCH", "OUT_OF_ORDER_SEQUENCE"):
                    return "fenced-or-gap"
                if outcome_of(error) == "info":
                    ambiguous = True
                elif not ambiguous and code != "UNAVAILABLE":
                    return "not-written"  # refused, and no earlier attempt can have landed
                await asyncio.sleep(0.1)
                continue
            answer = _json(raw)
            count = int(answer["count"])
            base = int(answer["base_offset"])
            self.history.ok_send(index, [base + i for i in range(count)], duplicate=bool(answer["duplicate"]))
            self.stats.record("send-ok", began)
            return "ok"
        return "gave-up"  # the values stay ambiguous; the next batch uses a new sequence

    # -- W3 offsets ------------------------------------------------------------------

    async def _committer(self, process: int, group: str) -> None:
        async with self._client(attempts=1) as client:
            while not self.stop.is_set():
                key = self.rng.choice(self.keys)
                if self.rng.random() < 0.5 and self.positions[key] > 0:
                    offset = self.rng.randint(0, self.positions[key])
                    index = self.history.invoke_commit(process, group, key, offset)
                    try:
                        await client.request("POST", f"/v1/groups/{group}/offsets", json_body={"offsets": [
                            {"topic": key.topic, "partition": key.partition, "offset": offset}]},
                            ambiguous_retry=False)
                    except (RaftlogError, TimeoutError, OSError) as error:
                        self._complete_error(index, error, "commit")
                    else:
                        self.history.ok_commit(index)
                        self.stats.record("commit-ok", time.monotonic())
                else:
                    index = self.history.invoke_fetch(process, group, key)
                    try:
                        found = await client.fetch_offsets(group, key.topic)
                    except (RaftlogError, TimeoutError, OSError) as error:
                        self._complete_error(index, error, "fetch")
                    else:
                        self.history.ok_fetch(index, found.get(key.partition))
                await self._pause()


def _json(raw: bytes) -> Any:
    import json

    return json.loads(raw)


def value_of(record: dict[str, Any]) -> str:
    """A polled record's value. The server sends bytes that are not UTF-8 as `value_b64`;
    nothing the workload writes is such, so it is kept, marked, as the value read (the
    checker then reports a value nobody wrote) instead of failing the poller."""
    if "value" in record:
        return record["value"]
    return "b64:" + str(record.get("value_b64"))
