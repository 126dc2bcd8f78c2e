"""Blocking wrappers: the async client runs on a private event loop in one thread.

Scripts and the CLI call `Client(...).produce(...)` without asyncio; every
call is the async one, run to completion on the client's loop with a deadline.
One implementation, so the sync and async clients cannot behave differently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from multiraft.client.consumer import AsyncConsumer, ConsumedRecord
from multiraft.client.http import DEFAULT_SERVER, AsyncClient, BatchRead
from multiraft.client.member import AsyncGroupConsumer, Callback, TopicPartition
from multiraft.client.producer import AsyncProducer

T = TypeVar("T")
CALL_TIMEOUT_MARGIN_S = 5.0


class _Loop:
    """A daemon thread running one event loop until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="raftlog-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call_soon(self, function: Callable[[], Any]) -> None:
        """Run a plain function on the loop, from any thread or a signal handler."""
        self.loop.call_soon_threadsafe(function)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Client:
    """The blocking client. `with Client("127.0.0.1:8080") as client: client.list_topics()`."""

    def __init__(self, servers: str | Sequence[str] = DEFAULT_SERVER, **options: Any) -> None:
        self.aio = AsyncClient(servers, **options)  # first: bad options (a token file) leave no thread behind
        self._loop = _Loop()
        self._deadline_s = self.aio.timeout_s * self.aio.attempts + CALL_TIMEOUT_MARGIN_S

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coroutine, self._deadline_s)

    def call_soon(self, function: Callable[[], Any]) -> None:
        """Run a plain function on the client's loop, from any thread or a signal handler."""
        self._loop.call_soon(function)

    def close(self) -> None:
        self.run(self.aio.close())
        self._loop.close()

    def health(self, server: str | None = None, ready: str | None = None) -> dict[str, Any]:
        return self.run(self.aio.health(server, ready))

    def cluster(self, server: str | None = None) -> dict[str, Any]:
        return self.run(self.aio.cluster(server))

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int | None = None,
                     config: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.run(self.aio.create_topic(name, partitions, replication_factor, config))

    def list_topics(self) -> list[dict[str, Any]]:
        return self.run(self.aio.list_topics())

    def describe_topic(self, name: str, server: str | None = None) -> dict[str, Any]:
        return self.run(self.aio.describe_topic(name, server))

    def alter_topic_config(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self.run(self.aio.alter_topic_config(name, changes))

    def delete_topic(self, name: str) -> None:
        self.run(self.aio.delete_topic(name))

    def balance_leaders(self) -> dict[str, Any]:
        return self.run(self.aio.balance_leaders())

    def create_partitions(self, name: str, count: int) -> dict[str, Any]:
        return self.run(self.aio.create_partitions(name, count))

    def drain_node(self, node_id: int) -> dict[str, Any]:
        return self.run(self.aio.drain_node(node_id))

    def undrain_node(self, node_id: int) -> dict[str, Any]:
        return self.run(self.aio.undrain_node(node_id))

    def promote_node(self, node_id: int, replace: int | None = None) -> dict[str, Any]:
        return self.run(self.aio.promote_node(node_id, replace))

    def cluster_settings(self) -> dict[str, Any]:
        return self.run(self.aio.cluster_settings())

    def set_cluster_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return self.run(self.aio.set_cluster_settings(settings))

    def features(self) -> dict[str, Any]:
        return self.run(self.aio.features())

    def finalize_features(self, level: int | None = None) -> dict[str, Any]:
        return self.run(self.aio.finalize_features(level))

    def decommission_node(self, node_id: int) -> dict[str, Any]:
        return self.run(self.aio.decommission_node(node_id))

    def recommission_node(self, node_id: int) -> dict[str, Any]:
        return self.run(self.aio.recommission_node(node_id))

    def decommission_status(self, node_id: int) -> dict[str, Any]:
        return self.run(self.aio.decommission_status(node_id))

    def verify(self, topics: list[str] | None = None, start: int = 0, deep: bool = True) -> dict[str, Any]:
        return self.run(self.aio.verify(topics, start, deep))

    def create_token(self, name: str, rights: list[str]) -> dict[str, Any]:
        return self.run(self.aio.create_token(name, rights))

    def list_tokens(self) -> list[dict[str, Any]]:
        return self.run(self.aio.list_tokens())

    def delete_token(self, name: str) -> None:
        self.run(self.aio.delete_token(name))

    def create_mirror(self, name: str, sources: list[str], topics: str, priority: str = "normal",
                      token: str | None = None, verify_interval_s: int | None = None,
                      source_tls: bool = False, source_ca: str | None = None,
                      on_source_truncated: str | None = None,
                      record_filter: list[dict[str, str]] | None = None) -> dict[str, Any]:
        return self.run(self.aio.create_mirror(name, sources, topics, priority, token, verify_interval_s,
                                               source_tls, source_ca, on_source_truncated, record_filter))

    def alter_mirror(self, name: str, on_source_truncated: str) -> dict[str, Any]:
        return self.run(self.aio.alter_mirror(name, on_source_truncated))

    def list_mirrors(self) -> list[dict[str, Any]]:
        return self.run(self.aio.list_mirrors())

    def mirror_status(self, name: str) -> dict[str, Any]:
        return self.run(self.aio.mirror_status(name))

    def mirror_action(self, name: str, action: str, topic: str | None = None,
                      body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.run(self.aio.mirror_action(name, action, topic, body))

    def delete_mirror(self, name: str) -> None:
        self.run(self.aio.delete_mirror(name))

    def produce(self, topic: str, records: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
        return self.run(self.aio.produce(topic, records, **options))

    def produce_batch(self, topic: str, partition: int, batch: bytes, **options: Any) -> dict[str, Any]:
        return self.run(self.aio.produce_batch(topic, partition, batch, **options))

    def consume(self, topic: str, partition: int, offset: int, **options: Any) -> dict[str, Any]:
        return self.run(self.aio.consume(topic, partition, offset, **options))

    def consume_batches(self, topic: str, partition: int, offset: int, **options: Any) -> BatchRead:
        return self.run(self.aio.consume_batches(topic, partition, offset, **options))

    def allocate_producer(self) -> tuple[int, int]:
        return self.run(self.aio.allocate_producer())

    def commit_offsets(self, group: str, offsets: list[dict[str, Any]]) -> None:
        self.run(self.aio.commit_offsets(group, offsets))

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self.run(self.aio.fetch_offsets(group, topic))

    def delete_group(self, group: str) -> None:
        self.run(self.aio.delete_group(group))

    def partition_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        return self.run(self.aio.partition_offsets(topic))

    def list_groups(self) -> list[dict[str, Any]]:
        return self.run(self.aio.list_groups())

    def describe_group(self, group: str, topics: Sequence[str] = ()) -> dict[str, Any]:
        return self.run(self.aio.describe_group(group, topics))

    def reset_offsets(self, group: str, strategy: str, topics: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        return self.run(self.aio.reset_offsets(group, strategy, topics, **options))

    def group_consumer(self, group: str, **options: Any) -> GroupConsumer:
        """A member of `group` (topics= or topic_pattern=; AsyncGroupConsumer's options)."""
        return GroupConsumer(self, AsyncGroupConsumer(self.aio, group, **options))

    def producer(self, topic: str, **options: Any) -> Producer:
        return Producer(self, AsyncProducer(self.aio, topic, **options))

    def consumer(self, topic: str, **options: Any) -> Consumer:
        return Consumer(self, AsyncConsumer(self.aio, topic, **options))


class Producer:
    """Blocking batching producer: `send` queues, `flush` waits for every acknowledgement."""

    def __init__(self, client: Client, producer: AsyncProducer) -> None:
        self._client = client
        self.aio = producer
        client.run(producer.start())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, value: bytes | None, key: bytes | None = None, **options: Any) -> concurrent.futures.Future[Any]:
        """Queue a record; returns a future of (partition, offset)."""
        return self.send_many([value], key, **options)[0]

    def send_many(self, values: list[bytes | None], key: bytes | None = None,
                  **options: Any) -> list[concurrent.futures.Future[Any]]:
        """Queue records in one hop to the client's loop (the CLI's stdin path)."""

        async def queue() -> list[concurrent.futures.Future[Any]]:
            return [_bridge(await self.aio.send(value, key, **options)) for value in values]

        return self._client.run(queue())

    def flush(self) -> None:
        self._client.run(self.aio.flush())

    def close(self) -> None:
        self._client.run(self.aio.close())


def _bridge(inner: asyncio.Future[T]) -> concurrent.futures.Future[T]:
    """A thread-safe future completed from the loop's future (no extra task per record)."""
    outer: concurrent.futures.Future[T] = concurrent.futures.Future()

    def settle(done: asyncio.Future[T]) -> None:
        if done.cancelled():
            outer.cancel()
        elif done.exception() is not None:
            outer.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            outer.set_result(done.result())

    inner.add_done_callback(settle)
    return outer


class Consumer:
    """Blocking consumer: `poll()` returns records, `commit()` stores positions for the group."""

    def __init__(self, client: Client, consumer: AsyncConsumer) -> None:
        self._client = client
        self.aio = consumer
        client.run(consumer.start())

    def poll(self) -> list[ConsumedRecord]:
        return self._client.run(self.aio.poll())

    def commit(self) -> None:
        self._client.run(self.aio.commit())

    def seek(self, partition: int, offset: int) -> None:
        self.aio.seek(partition, offset)

    def wakeup(self) -> None:
        """Kafka's wakeup(): from another thread or a signal handler, end the long poll in
        progress (or the next one) early; it returns no records and moves no position."""
        self._client.call_soon(self.aio.wakeup)

    @property
    def positions(self) -> dict[int, int]:
        return dict(self.aio.positions)


def _in_a_thread(callback: Callback | None) -> Callback | None:
    """A blocking callback run off the client's loop (in a worker thread, while `poll`
    waits for it), so it may call the blocking consumer, say `commit()`, without
    waiting on the loop it would be holding."""
    if callback is None:
        return None

    async def run(partitions: set[TopicPartition]) -> None:
        await asyncio.to_thread(callback, partitions)

    return run


class GroupConsumer:
    """Blocking group member: `poll()` hands partitions over as the server asks (calling
    on_revoked / on_assigned / on_lost) and returns records; `close()` leaves the group."""

    def __init__(self, client: Client, consumer: AsyncGroupConsumer) -> None:
        self._client = client
        self.aio = consumer
        consumer.on_assigned = _in_a_thread(consumer.on_assigned)
        consumer.on_revoked = _in_a_thread(consumer.on_revoked)
        consumer.on_lost = _in_a_thread(consumer.on_lost)
        client.run(consumer.start())

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self) -> list[ConsumedRecord]:
        return self._client.run(self.aio.poll())

    def commit(self, partitions: list[TopicPartition] | None = None) -> None:
        self._client.run(self.aio.commit(partitions))

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._client.run(_now(self.aio.seek, topic, partition, offset))

    def wakeup(self) -> None:
        """Kafka's wakeup(): from another thread or a signal handler, end the long poll in
        progress (or the next one) early; it returns no records and moves no position."""
        self._client.call_soon(self.aio.wakeup)

    def close(self, commit: bool = True) -> None:
        self._client.run(self.aio.close(commit))

    @property
    def assignment(self) -> set[TopicPartition]:
        return set(self.aio.held)

    @property
    def member_id(self) -> str:
        return self.aio.member_id


async def _now(function: Callable[..., T], *args: Any) -> T:
    """Run a plain method on the client's loop (the consumer's state lives there)."""
    return function(*args)
