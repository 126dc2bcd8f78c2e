"""A batching producer: records accumulate per partition and go as one binary batch.

A partition's buffer is sent when it holds `batch_records_max` records or
`batch_bytes_max` bytes, or `linger_ms` after its first record (aiokafka's
accumulator has the same two bounds). Each partition has at most one batch in
flight, which keeps its records in order without relying on the server, and
`buffer_records_max` bounds what waits in memory: `send` blocks past it.

A topic may gain partitions while a producer runs (`POST /v1/topics/{t}/partitions`):
the producer describes the topic again every `metadata_max_age_ms` (Kafka's
`metadata.max.age.ms`, 5 minutes by default), at once when a record names a partition
beyond the count it knows, or when asked (`refresh_partitions`). Keyed records then
map over the new count, so a key may land in another partition than before (as in
Kafka); unkeyed records spread over every partition.

Idempotent mode takes a producer id from `/v1/producers` and numbers each
partition's records with sequences; a send whose answer was lost is retried
with the same bytes (same sequence), so the cluster stores it once and answers
with the original offsets. Without it, a lost answer fails the records with
`OutcomeUnknownError` rather than risk storing them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field

from multiraft.client.http import AsyncClient, RaftlogError
from multiraft.state.partitioner import partition_for_key
from storage.batch import Record, encode_batch

SEQUENCE_MAX = 2**31 - 1


@dataclass
class _Buffer:
    records: list[Record] = field(default_factory=list)
    futures: list[asyncio.Future[tuple[int, int]]] = field(default_factory=list)
    first_ms: int = 0
    size_bytes: int = 0
    timer: asyncio.TimerHandle | None = None


class AsyncProducer:
    """Produces to one topic. `async with AsyncProducer(client, "t") as producer:`."""

    def __init__(self, client: AsyncClient, topic: str, *, linger_ms: int = 5, batch_records_max: int = 1000,
                 batch_bytes_max: int = 1 << 20, buffer_records_max: int = 100_000, acks: str = "quorum",
                 idempotent: bool = False, metadata_max_age_ms: int = 300_000) -> None:
        assert linger_ms >= 0 and metadata_max_age_ms >= 0 and batch_records_max >= 1 and batch_bytes_max >= 1
        assert buffer_records_max >= batch_records_max
        self.client = client
        self.topic = topic
        self.linger_ms = linger_ms
        self.batch_records_max = batch_records_max
        self.batch_bytes_max = batch_bytes_max
        self.buffer_records_max = buffer_records_max
        self.acks = acks
        self.idempotent = idempotent
        self.partitions = 0
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self._described_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences: dict[int, int] = {}
        self._buffers: dict[int, _Buffer] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._round_robin = itertools.count()
        self._inflight: set[asyncio.Task[None]] = set()
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._failed: Exception | None = None

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        await self.refresh_partitions()
        if self.idempotent:
            self.producer_id, self.producer_epoch = await self.client.allocate_producer()

    async def refresh_partitions(self) -> None:
        """Describe the topic again; a count that grew is taken (it never shrinks)."""
        described = await self.client.describe_topic(self.topic)
        self._described_at = time.monotonic()
        self.partitions = max(self.partitions, len(described["partitions"]))

    def _refresh_when_old(self) -> None:
        """In the background, once the count is older than `metadata_max_age_ms`."""
        if time.monotonic() - self._described_at < self.metadata_max_age_s:
            return
        if self._refreshing is None or self._refreshing.done():
            self._described_at = time.monotonic()  # one refresh per age, even if it fails
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(RaftlogError):  # the next age tries again; sends go on meanwhile
            await self.refresh_partitions()

    def _partition(self, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            if not 0 <= partition < self.partitions:
                raise ValueError(f"topic {self.topic} has no partition {partition}")
            return partition
        if key is not None:
            return partition_for_key(key, self.partitions)
        return next(self._round_robin) % self.partitions

    async def send(self, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
                   headers: tuple[tuple[str, bytes], ...] = ()) -> asyncio.Future[tuple[int, int]]:
        """Queue one record; the future resolves to (partition, offset) once acknowledged."""
        assert self.partitions, "start() the producer first"
        if self._failed is not None:
            raise RaftlogError("PRODUCER_FAILED", f"an earlier batch's outcome is unknown ({self._failed}); "
                               "create a new producer")
        while self._pending >= self.buffer_records_max:
            self._room.clear()
            await self._room.wait()
        if partition is not None and partition >= self.partitions:
            await self.refresh_partitions()  # the topic may have grown
        self._refresh_when_old()
        target = self._partition(key, partition)
        buffer = self._buffers.setdefault(target, _Buffer())
        if not buffer.records:
            buffer.first_ms = int(time.time() * 1000)
            if self.linger_ms:
                buffer.timer = asyncio.get_running_loop().call_later(self.linger_ms / 1000, self._drain, target)
        buffer.records.append(Record(key, value, headers, max(0, int(time.time() * 1000) - buffer.first_ms)))
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        buffer.futures.append(future)
        buffer.size_bytes += len(key or b"") + len(value or b"") + 12
        self._pending += 1
        if not self.linger_ms or len(buffer.records) >= self.batch_records_max or \
                buffer.size_bytes >= self.batch_bytes_max:
            self._drain(target)
        return future

    def _drain(self, partition: int) -> None:
        buffer = self._buffers.pop(partition, None)
        if buffer is None or not buffer.records:
            return
        if buffer.timer is not None:
            buffer.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._send_batch(partition, buffer))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _send_batch(self, partition: int, buffer: _Buffer) -> None:
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:  # one batch in flight per partition: order without server help
            fields = {}
            if self.idempotent:
                sequence = self._sequences.get(partition, 0)
                fields = {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                          "base_sequence": sequence}
            batch = encode_batch(buffer.records, first_timestamp_ms=buffer.first_ms, **fields)
            try:
                answer = await self.client.produce_batch(self.topic, partition, batch, acks=self.acks,
                                                         idempotent=self.idempotent)
            except Exception as error:  # every waiter learns of it
                definite = isinstance(error, RaftlogError) and 400 <= error.status < 500
                if self.idempotent and not definite:
                    # The batch may be stored under this sequence: reusing it for other records
                    # could be taken for a duplicate. Kafka makes this fatal for the producer too.
                    self._failed = error
                for future in buffer.futures:
                    if not future.done():
                        future.set_exception(error)
            else:
                if self.idempotent:
                    self._sequences[partition] = (sequence + len(buffer.records)) % (SEQUENCE_MAX + 1)
                base = int(answer["base_offset"])
                for i, future in enumerate(buffer.futures):
                    if not future.done():
                        future.set_result((partition, base + i if base >= 0 else -1))
            finally:
                self._pending -= len(buffer.records)
                self._room.set()

    async def flush(self) -> None:
        """Send every buffer now and wait until all batches are answered."""
        for partition in list(self._buffers):
            self._drain(partition)
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refreshing
        with contextlib.suppress(Exception):
            await self.flush()
