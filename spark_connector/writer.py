"""`df.write.format("raftlog")`: rows to records, batched per partition, idempotent per task attempt.

Columns, as Spark's Kafka sink takes them: `value` (binary or string,
required), `key` (binary or string), `partition` (integer; default: the key's
murmur2 partition, or round-robin without a key), `headers`
(`array<struct<key:string,value:binary>>`), and `topic` (string) when the
`topic` option is not given. Other columns are ignored, as Kafka's sink does.

Each task attempt takes its own producer id (`POST /v1/producers`) and numbers
its batches, so a batch whose answer is lost is retried with the same bytes and
stored once. A task that Spark re-runs is a new attempt with a new producer id:
its records can be stored twice (at-least-once, like Kafka's sink).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from multiraft.client import AsyncClient, AsyncProducer
from spark_connector.errors import ConnectorError, OptionError
from spark_connector.options import WriteOptions

BUFFER_RECORDS_MAX = 100_000
LINGER_MS = 50  # rows arrive as fast as Spark hands them over; batches fill by size first


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each known column sits in a row (None: absent), checked on the driver."""

    value: int
    key: int | None = None
    partition: int | None = None
    headers: int | None = None
    topic: int | None = None
    text: frozenset[str] = frozenset()  # key/value columns given as strings (sent as UTF-8)


def layout_of(fields: list[tuple[str, str]], options: WriteOptions) -> Layout:
    """Check the columns' types (as Spark simple strings); errors name the column."""
    types = {name: kind for name, kind in fields}
    index = {name: i for i, (name, _) in enumerate(fields)}
    if "value" not in types:
        raise OptionError("value", f"the DataFrame needs a 'value' column (binary or string); it has "
                                   f"{', '.join(types) or 'no columns'}")
    text = set()
    for name in ("key", "value"):
        if name in types and types[name] not in ("binary", "string"):
            raise OptionError(name, f"column {name!r} must be binary or string, not {types[name]}")
        if types.get(name) == "string":
            text.add(name)
    if "partition" in types and types["partition"] not in ("int", "bigint", "smallint", "tinyint"):
        raise OptionError("partition", f"column 'partition' must be an integer, not {types['partition']}")
    if "headers" in types and types["headers"] != "array<struct<key:string,value:binary>>":
        raise OptionError("headers", "column 'headers' must be array<struct<key:string,value:binary>>, "
                                     f"not {types['headers']}")
    if options.topic is None and types.get("topic") != "string":
        raise OptionError("topic", "give the option 'topic', or a string column 'topic' naming each row's topic")
    return Layout(index["value"], index.get("key"), index.get("partition"), index.get("headers"),
                  index.get("topic") if options.topic is None else None, frozenset(text))


@dataclass
class WriteResult:
    records: int = 0
    failed: int = 0
    first_error: BaseException | None = None
    by_topic: dict[str, int] = field(default_factory=dict)

    def settle(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            self.first_error = self.first_error or (future.exception() if not future.cancelled() else
                                                    ConnectorError("a send was cancelled"))


def _bytes(value: Any, text: bool) -> bytes | None:
    if value is None:
        return None
    return value.encode() if text else bytes(value)


async def write_rows(rows: Iterable[Any], layout: Layout, options: WriteOptions) -> WriteResult:
    """Send every row; raises if any record was not acknowledged (the task then fails)."""
    result = WriteResult()
    producers: dict[str, AsyncProducer] = {}
    async with AsyncClient(list(options.servers), timeout_s=30.0, attempts=6) as client:
        try:
            for row in rows:
                topic = options.topic if layout.topic is None else row[layout.topic]
                if topic is None:
                    raise ConnectorError("a row has a null 'topic'")
                producer = producers.get(topic)
                if producer is None:
                    producer = AsyncProducer(client, topic, idempotent=True, acks=options.acks,
                                             linger_ms=LINGER_MS, batch_records_max=options.batch_records,
                                             buffer_records_max=max(BUFFER_RECORDS_MAX, options.batch_records))
                    await producer.start()
                    producers[topic] = producer
                headers = () if layout.headers is None or row[layout.headers] is None else tuple(
                    (h[0], bytes(h[1]) if h[1] is not None else b"") for h in row[layout.headers])
                future = await producer.send(
                    _bytes(row[layout.value], "value" in layout.text),
                    _bytes(row[layout.key], "key" in layout.text) if layout.key is not None else None,
                    partition=None if layout.partition is None else row[layout.partition], headers=headers)
                future.add_done_callback(result.settle)
                result.records += 1
                result.by_topic[topic] = result.by_topic.get(topic, 0) + 1
                if result.records % options.batch_records == 0:
                    await asyncio.sleep(0)  # let the batches just drained go out while rows keep coming
            for producer in producers.values():
                await producer.flush()
        finally:
            for producer in producers.values():
                with contextlib.suppress(Exception):
                    await producer.close()
    if result.first_error is not None:
        raise ConnectorError(f"{result.failed} of {result.records} records were not acknowledged: "
                             f"{result.first_error}") from result.first_error
    return result
