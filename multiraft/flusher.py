"""Cross-group group commit: one database write per event-loop turn for every group.

Each group's Ready loop writes its entries and hard state to its own store, then
asks the flusher to make them durable and waits. The flusher runs once per
event-loop turn for everyone who asked: it fsyncs each touched segment file once
and writes all the groups' hard states in *one* rocksdict batch, synced only if
some group's term or vote changed (a vote must be durable before it is sent).

Why it matters: a synced rocksdict write holds the GIL for about a millisecond
(../shared/DEPS.md). With a thousand groups electing at once, one synced write
per group would block the event loop for a second per round, answers would
arrive after the election timeout, and elections would never settle. Batched,
the round costs one write.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from multiraft.histograms import Histogram
from storage.config import FlushMode
from storage.segments import SegmentStore
from storage.state_db import StateDatabase


class Flusher:
    def __init__(self, db: StateDatabase, logger: Any) -> None:
        self._db = db
        self._logger = logger
        self._waiting: list[tuple[SegmentStore, asyncio.Future[None]]] = []
        self._scheduled = False
        self.flushes = 0
        self.synced_writes = 0
        self.latency: Histogram | None = None

    def sync(self, store: SegmentStore) -> asyncio.Future[None]:
        """A future resolved once everything `store` was given so far is durable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append((store, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        began = time.perf_counter()
        try:
            batch = self._db.batch()
            must_sync = False
            seen: set[int] = set()
            for store, _ in waiting:
                if id(store) in seen:
                    continue
                seen.add(id(store))
                fsyncs = store.sync_files()
                vote_changed = store.stage_state(batch)
                lazy_policy = store.config.flush.mode is not FlushMode.FSYNC
                must_sync = must_sync or vote_changed or (fsyncs > 0 and lazy_policy)
            self._db.write(batch, sync=must_sync)
        except Exception as error:  # every waiter learns of it; the groups fail, never hang
            for _, future in waiting:
                if not future.done():
                    future.set_exception(error)
            return
        self.flushes += 1
        self.synced_writes += int(must_sync)
        if self.latency is not None:
            self.latency.observe(time.perf_counter() - began)
        for _, future in waiting:
            if not future.done():
                future.set_result(None)
