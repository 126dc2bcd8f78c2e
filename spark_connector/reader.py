"""The executor side: read one planned range as Arrow record batches.

A `PartitionReader` fetches binary batches (`Accept: application/vnd.raftlog.batch`)
from the task's preferred replica and turns each answer into one Arrow record
batch (`spark_connector.decode`). It owns its failover, so a dead or paused
node costs one refused connection or one request timeout, not the task:

- a connection error or a retriable error moves it to the next server (the other
  replicas, then the other nodes, which forward) after a short backoff;
- a replica that is behind (it has not yet applied up to the range's end, which
  the driver took from the leader) long-polls, and after `STALLED_POLLS_MAX`
  empty polls the reader tries the next server;
- `OFFSET_OUT_OF_RANGE` from a server makes it ask every other server; only when
  every one refuses because its log now starts past the position is data lost:
  `DataLossError`, or with `failOnDataLoss=false` a `DataLossWarning` and a skip
  to the lowest log start any server still has.

Each wait is bounded: no progress for `pollTimeoutMs` raises `ReadTimeoutError`
naming the partition, the range and the servers tried.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from multiraft.client import AsyncClient, RaftlogError, UnavailableError
from spark_connector.decode import to_record_batch
from spark_connector.errors import ConnectorError, ReadTimeoutError
from spark_connector.options import ReadOptions
from spark_connector.planning import ReadTask, data_lost

FETCH_RECORDS_MAX = 100_000  # the server's MAX_RECORDS_MAX; fetchMaxBytes is the real bound
REQUEST_TIMEOUT_S = 15.0  # one fetch of at most 64 MiB on a LAN, with room for a loaded node
LONG_POLL_MS = 500  # a replica that is behind gets this long to catch up per poll
STALLED_POLLS_MAX = 4  # then the next server is tried
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0
PREFETCH_BATCHES = 2  # decoded batches waiting for Spark: bounds memory to ~3 x fetchMaxBytes
QUEUE_POLL_S = 0.2
_FATAL_CODES = {"UNKNOWN_TOPIC", "INVALID_REQUEST", "NOT_FOUND"}


class PartitionReader:
    """Reads `task.range` in order; `next_batch()` until it returns None."""

    def __init__(self, client: AsyncClient, task: ReadTask, options: ReadOptions) -> None:
        self.client = client
        self.task = task
        self.options = options
        self.position = task.range.start
        self.server_index = 0
        self.stalled_polls = 0
        self.backoff_s = BACKOFF_S
        self.last_progress = time.monotonic()
        self.last_problem = "none"
        self.records = 0

    @property
    def server(self) -> str:
        return self.task.servers[self.server_index]

    def _next_server(self, problem: str) -> None:
        self.last_problem = f"{self.server}: {problem}"
        self.server_index = (self.server_index + 1) % len(self.task.servers)
        self.stalled_polls = 0

    def _check_deadline(self) -> None:
        waited_ms = (time.monotonic() - self.last_progress) * 1000
        if waited_ms > self.options.poll_timeout_ms:
            r = self.task.range
            raise ReadTimeoutError(
                f"{r.topic}/{r.partition}: no server served offsets [{self.position}, {r.end}) within "
                f"pollTimeoutMs={self.options.poll_timeout_ms} (servers {', '.join(self.task.servers)}; "
                f"last problem: {self.last_problem})")

    async def next_batch(self) -> pa.RecordBatch | None:
        r = self.task.range
        while self.position < r.end:
            self._check_deadline()
            try:
                read = await self.client.consume_batches(
                    r.topic, r.partition, self.position, max_records=FETCH_RECORDS_MAX,
                    max_bytes=self.options.fetch_max_bytes, isolation=self.options.isolation,
                    wait_ms=LONG_POLL_MS if self.stalled_polls else 0, server=self.server)
            except RaftlogError as error:
                await self._failed(error)
                continue
            self.backoff_s = BACKOFF_S
            if read.next_offset <= self.position:
                self.stalled_polls += 1  # this replica has not applied up to here yet
                if self.stalled_polls > STALLED_POLLS_MAX:
                    self._next_server(f"behind: high watermark {read.high_watermark} <= {self.position}")
                continue
            batch = to_record_batch(r.topic, r.partition, read.batches, self.position, r.end,
                                    self.options.include_headers)
            self.position = read.next_offset
            self.stalled_polls = 0
            self.last_progress = time.monotonic()
            if batch is not None:  # None: only skipped (deduplicated) batches in this answer
                self.records += batch.num_rows
                return batch
        return None

    async def _failed(self, error: RaftlogError) -> None:
        r = self.task.range
        if error.code == "OFFSET_OUT_OF_RANGE":
            await self._out_of_range(error)
            return
        if error.code in _FATAL_CODES:
            raise ConnectorError(f"{r.topic}/{r.partition}: {self.server} refused the read: "
                                 f"{error.code}: {error.message}") from error
        if not isinstance(error, UnavailableError) and not error.retriable and error.status < 500:
            raise ConnectorError(f"{r.topic}/{r.partition}: {error.code}: {error.message}") from error
        self._next_server(f"{error.code}: {error.message}")
        await asyncio.sleep(self.backoff_s)
        self.backoff_s = min(self.backoff_s * 2, BACKOFF_MAX_S)

    async def _out_of_range(self, first: RaftlogError) -> None:
        """Ask every server; data is lost only if all of them start past the position."""
        r = self.task.range
        starts: list[int] = []
        for server in self.task.servers:
            try:
                read = await self.client.consume_batches(r.topic, r.partition, self.position, max_records=1,
                                                         max_bytes=1, isolation=self.options.isolation,
                                                         server=server)
            except RaftlogError as error:
                if error.code == "OFFSET_OUT_OF_RANGE":
                    start = await self._log_start(server)
                    if start is not None:
                        starts.append(start)
                continue
            if read.log_start_offset <= self.position:
                self.server_index = self.task.servers.index(server)  # it has the records: read there
                return
        if starts and min(starts) > self.position:
            self.position = data_lost(r.topic, r.partition, self.position, min(starts), r.end,
                                      self.options.fail_on_data_loss)
            self.last_progress = time.monotonic()
            return
        self._next_server(f"{first.code}: {first.message}")  # behind, not trimmed: wait for it
        await asyncio.sleep(self.backoff_s)
        self.backoff_s = min(self.backoff_s * 2, BACKOFF_MAX_S)

    async def _log_start(self, server: str) -> int | None:
        r = self.task.range
        try:
            described = await self.client.describe_topic(r.topic, server=server)
        except RaftlogError:
            return None
        view = next((p for p in described["partitions"] if p["partition"] == r.partition), None)
        return None if view is None else view.get("log_start_offset")


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


def read_task(task: ReadTask, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The generator behind `DataSourceReader.read`, fetching ahead on its own thread.

    While Spark takes one Arrow batch, the next fetch is already in flight (at most
    `PREFETCH_BATCHES` wait decoded), so the server's and the network's time overlap
    Spark's. The fetch thread runs a private event loop; its errors re-raise here,
    with their own type, and closing the generator stops it.
    """
    ready: queue.Queue[pa.RecordBatch | _Failed | None] = queue.Queue(maxsize=PREFETCH_BATCHES)
    stop = threading.Event()

    def put(item: pa.RecordBatch | _Failed | None) -> None:
        while not stop.is_set():
            try:
                ready.put(item, timeout=QUEUE_POLL_S)
                return
            except queue.Full:
                continue

    def fetch() -> None:
        loop = asyncio.new_event_loop()
        # attempts=1: failover across servers is the reader's, so it knows which server answered.
        client = AsyncClient(list(task.servers), timeout_s=REQUEST_TIMEOUT_S, attempts=1)
        try:
            reader = PartitionReader(client, task, options)
            while not stop.is_set():
                batch = loop.run_until_complete(reader.next_batch())
                put(batch)
                if batch is None:
                    return
        except BaseException as error:  # every failure reaches the consumer, none is lost with the thread
            put(_Failed(error))
        finally:
            loop.run_until_complete(client.close())
            loop.close()

    r = task.range
    fetcher = threading.Thread(target=fetch, name=f"raftlog-fetch-{r.topic}-{r.partition}-{r.start}", daemon=True)
    fetcher.start()
    try:
        while True:
            try:
                item = ready.get(timeout=QUEUE_POLL_S)
            except queue.Empty:
                if not fetcher.is_alive() and ready.empty():
                    raise ConnectorError(f"{r.topic}/{r.partition}: the fetch thread ended without a result") from None
                continue
            if item is None:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        fetcher.join(REQUEST_TIMEOUT_S + 5)
