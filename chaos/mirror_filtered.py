"""`--mirror`, continued: a filtered mirror (docs/mirror.md "Record filters").

The runner owns one more source topic, TOPIC (`filt-a`, PARTITIONS partitions; its name
matches neither `chaos-*` nor `trunc-*`, the other links' patterns), mirrored by a third
link, LINK (`chaos-filtered`, pattern `filt-*`, record filter FILTER). The runner writes
it itself at a low rate (one binary batch every WRITE_PACE_S, round robin over the
partitions; not in the history: the checks compare the two logs): 1..BATCH_MAX records
of unique values, each record's key and headers drawn so that some match the filter by
key, some by header, some not at all (a near miss: another key, `keep: no`, no key), so
most batches of several records are split into runs and gaps; a quarter of the batches
zlib-compressed (their runs are re-encoded compressed), timestamps with deltas.

The link takes the run's link and sink faults: `link-cut` cuts the address sets (every
link), `link-pause` pauses this link with the workload's (chaos/mirror.py), sink kills
and pauses hit its leaders too. Its status is sampled with the others' (positions).

At the end (`finish`): the source's and the sink's `/log` of every partition (the sink's
until it reaches the source's end, bounded), checked by chaos/mirror_filter_checks.py,
and one partition read through the sink's consume route (records, not `/log`), which
must return exactly the matching records at their source offsets.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

from chaos.anomalies import Anomaly, anomaly
from chaos.cluster import ChaosCluster
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy, PositionSample, positions_backwards
from chaos.mirror_filter_checks import Rec, check_consumed, check_filtered, consumed_record
from chaos.mirror_reads import read_pair
from chaos.stopping import sleep_or_stop
from chaos.workload import CLIENT_HOST
from multiraft.client import AsyncClient, RaftlogError
from storage.batch import Compression, Record, encode_batch, read_header

TOPIC = "filt-a"
PARTITIONS = 2
LINK = "chaos-filtered"
PATTERN = "filt-*"
FILTER = [{"key_prefix": "k1"}, {"header": "keep", "value": "yes"}]
BATCH_MAX = 6
WRITE_PACE_S = 0.25
CATCH_UP_S = 60.0
CONSUMED = PartitionKey(TOPIC, 0)  # read through the consume route too
CONSUME_RECORDS = 500

# (key, headers) shapes: the first three match the filter, the rest do not.
KEYS_MATCHING = ("k1-{n}", "k1{n}")
KEYS_OTHER = ("k2-{n}", "x-k1-{n}", "K1-{n}", None)
HEADERS_MATCHING = ((("keep", b"yes"),), (("trace", b"1"), ("keep", b"yes")))
HEADERS_OTHER = ((), (("keep", b"no"),), (("keep", b"yes!"),), (("kept", b"yes"),), (("trace", b"1"),))


class Filtered:
    def __init__(self, sink: ChaosCluster, rng: random.Random) -> None:
        self.sink = sink
        self.rng = rng
        self.source: ChaosCluster | None = None
        self.written = 0  # records acknowledged
        self.batches = 0
        self.write_errors = 0
        self._values = itertools.count(1)

    @property
    def keys(self) -> list[PartitionKey]:
        return [PartitionKey(TOPIC, p) for p in range(PARTITIONS)]

    def _source(self, attempts: int = 3, timeout_s: float = 5.0) -> AsyncClient:
        assert self.source is not None
        return AsyncClient([self.source.http(n) for n in self.source.ids], timeout_s=timeout_s, attempts=attempts,
                           local_host=CLIENT_HOST)

    async def create_topic(self, source: ChaosCluster, replication_factor: int) -> None:
        self.source = source
        async with self._source(attempts=20, timeout_s=30) as client:
            try:
                await client.create_topic(TOPIC, PARTITIONS, replication_factor, {})
            except RaftlogError as error:  # a create retried after a lost answer
                if error.code != "TOPIC_EXISTS":
                    raise

    async def create_link(self, client: AsyncClient) -> None:
        assert self.source is not None
        await client.create_mirror(LINK, [self.source.http(n) for n in self.source.ids], PATTERN, priority="high",
                                   record_filter=FILTER)

    # -- writes -----------------------------------------------------------------

    def _record(self, partition: int, delta: int) -> Record:
        n = next(self._values)
        roll = self.rng.random()
        if roll < 0.25:  # by key
            key: str | None = self.rng.choice(KEYS_MATCHING)
            headers = self.rng.choice(HEADERS_OTHER)
        elif roll < 0.45:  # by header
            key, headers = self.rng.choice(KEYS_OTHER), self.rng.choice(HEADERS_MATCHING)
        elif roll < 0.5:  # both
            key, headers = self.rng.choice(KEYS_MATCHING), self.rng.choice(HEADERS_MATCHING)
        else:  # neither
            key, headers = self.rng.choice(KEYS_OTHER), self.rng.choice(HEADERS_OTHER)
        return Record(None if key is None else key.format(n=n).encode(), f"f-{partition}-{n}".encode(),
                      tuple(headers), delta)

    def batch(self, partition: int) -> bytes:
        count = self.rng.randint(1, BATCH_MAX)
        deltas = sorted(self.rng.randint(0, 40) for _ in range(count))
        records = [self._record(partition, delta) for delta in deltas]
        compression = Compression.ZLIB if self.rng.random() < 0.25 else Compression.NONE
        return encode_batch(records, first_timestamp_ms=int(time.time() * 1000), compression=compression)

    async def write(self, stop: asyncio.Event) -> None:
        """One batch every WRITE_PACE_S, round robin over the partitions."""
        async with self._source(attempts=1) as client:
            for turn in itertools.count():
                if stop.is_set():
                    return
                partition = turn % PARTITIONS
                data = self.batch(partition)
                try:
                    await client.produce_batch(TOPIC, partition, data)
                    self.batches += 1
                    self.written += read_header(data).record_count
                except (RaftlogError, OSError, TimeoutError):
                    self.write_errors += 1
                await sleep_or_stop(stop, WRITE_PACE_S)

    # -- the end ------------------------------------------------------------------

    async def finish(self, samples: list[PositionSample], diverged: list[tuple[PartitionKey, str]]
                     ) -> tuple[list[Anomaly], dict[str, Any]]:
        """The checks at the end; `samples`: this link's positions sampled, `diverged`: its
        partitions a status reported `diverged` (with the last error)."""
        assert self.source is not None
        began = time.monotonic()
        deadline = began + CATCH_UP_S
        sources = [self.source.http(n) for n in self.source.ids]
        sinks = [self.sink.http(n) for n in self.sink.ids]
        found: list[Anomaly] = []
        totals = {"matching": 0, "gap_offsets": 0, "gap_batches": 0, "split": 0, "identical": 0}
        unread: list[str] = []
        caught_up: dict[PartitionKey, int] = {}
        consumed, consume_stop = 0, None
        async with AsyncClient(sources, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as source_client, \
                AsyncClient(sinks, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as sink_client:
            ends = await _ends(source_client, sources)
            for key in self.keys:
                ours, theirs = await read_pair(source_client, sources, sink_client, sinks, key,
                                               ends.get(key.partition, 0), deadline)
                if ours is None:
                    unread.append(str(key))
                    continue
                verdict = check_filtered(key, ours, theirs, FILTER, time.monotonic() - began)
                found += verdict.anomalies
                for name in ("matching", "gap_offsets", "gap_batches", "split"):
                    totals[name] += getattr(verdict, name)
                totals["identical"] += verdict.identical
                if theirs is not None and theirs.high_watermark >= ours.high_watermark:
                    caught_up[key] = theirs.high_watermark
                if key == CONSUMED and theirs is not None:
                    records, consume_stop = await _consume(sink_client, sinks, key, ours.log_start,
                                                           theirs.high_watermark, deadline)
                    consumed = len(records)
                    found += check_consumed(key, ours, records, min(consume_stop, theirs.high_watermark), FILTER)
                    if consume_stop < theirs.high_watermark:
                        found += _consume_short(key, consume_stop, theirs)
        found += positions_backwards(samples, caught_up)
        found += [anomaly("mirror-differs", key, f"the pull said diverged: {text}", ()) for key, text in diverged]
        return found, {"topic": TOPIC, "link": LINK, "filter": FILTER, "partitions": PARTITIONS,
                       "source_unread": unread, "consumed": consumed, "consume_key": str(CONSUMED),
                       "consume_stopped_at": consume_stop, "written": self.written, "batches": self.batches,
                       "write_errors": self.write_errors, "waited_s": round(time.monotonic() - began, 1), **totals}


def _consume_short(key: PartitionKey, stop: int, sink: LogCopy) -> list[Anomaly]:
    return [anomaly("mirror-incomplete", key, f"the consume route stopped at offset {stop}, below the sink's end "
                    f"{sink.high_watermark} (matching records past it not judged)", ())]


async def _consume(client: AsyncClient, servers: list[str], key: PartitionKey, start: int, end: int,
                   deadline: float) -> tuple[list[Rec], int]:
    """The consume route (binary format) from `start` until `next_offset` reaches `end`,
    rotating servers on errors; the records and where the read stopped."""
    records: list[Rec] = []
    offset, turn = start, 0
    while offset < end and time.monotonic() < deadline:
        server = servers[turn % len(servers)]
        try:
            answer = await client.consume(key.topic, key.partition, offset, max_records=CONSUME_RECORDS,
                                          format="binary", server=server)
        except (RaftlogError, OSError, TimeoutError, ValueError):
            turn += 1
            await asyncio.sleep(0.2)
            continue
        got = [consumed_record(item) for item in answer["records"]]
        records += [r for r in got if r.offset < end]
        next_offset = int(answer["next_offset"])
        if next_offset <= offset:  # no progress here: another node, or the deadline
            turn += 1
            await asyncio.sleep(0.2)
            continue
        offset = next_offset
    return records, offset


async def _ends(client: AsyncClient, servers: list[str]) -> dict[int, int]:
    """Each partition's highest high watermark any source server's replica reports."""
    ends: dict[int, int] = {}
    for server in servers:
        try:
            described = await client.describe_topic(TOPIC, server=server)
        except (RaftlogError, OSError, TimeoutError):
            continue
        for view in described["partitions"]:
            if view.get("high_watermark") is not None:
                ends[int(view["partition"])] = max(ends.get(int(view["partition"]), 0), int(view["high_watermark"]))
    return ends
