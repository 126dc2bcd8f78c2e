"""How a group's writes become durable: the `Persistence` strategies, chosen once.

A group runtime gets one strategy when it is built (`choose_persistence`), never a
switch to look at per Ready: the Ready processor (`ready_processor.py`) asks it
which durability modes it may use and has it carry out the one it chose.

- `DirectSync`: the store syncs itself (a group that runs alone: tests, tools).
- `SharedFlush`: the node's flusher (`flusher.py`), one fsync for every group of
  the loop turn; a write that only moves the commit index is stored lazily.
- `BackgroundWrites`: around either, a leader's own appends are made durable in
  the background, within BACKGROUND_BYTES_MAX of unreported writes.
- `AckBeforeFsync`: the chaos runner's negative control, a faulty strategy that
  says a write is durable when it is not (as `storage.write_behind` is a faulty
  file system): injected by the node only when RAFTLOG_UNSAFE names it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from multiraft.runtime.group_types import GroupDeps
from multiraft.runtime.ready_processor import Durability, Persistence
from raftlog.core.ready import Ready
from raftlog.messages import entries_size_bytes
from raftlog.storage import RaftStorage
from raftlog.types import Index, Term

# A leader's own appends whose background fsync has not reported yet, in bytes: past
# this the leader waits for its next write's fsync, as every write did before. Why:
# its followers' answers commit entries without the leader's disk, so nothing else
# stops a leader whose disk stalls from holding more and more entries in memory (its
# log keeps them until they are durable) and queueing more and more fsyncs.
BACKGROUND_BYTES_MAX = 32 * 1024 * 1024
# The ack-before-fsync chaos control (multiraft/node/unsafe.py) syncs this long after it
# acknowledged: a kill -9 (with write-behind files) then loses up to this much
# acknowledged data on every replica, wide enough for the runner to catch.
UNSAFE_SYNC_DELAY_S = 2.0


class DirectSync:
    """No flusher: the store syncs at once, and the group lets the others run after it."""

    lazy_commit = False

    def __init__(self, store: RaftStorage) -> None:
        self._store = store

    def may_persist_later(self, ready: Ready) -> bool:
        return False

    def persist_lazily(self) -> None:
        self.start_sync()

    def persist_later(self, ready: Ready) -> None:
        raise AssertionError("DirectSync never persists later")

    def persist_now(self, ready: Ready) -> Any:
        self._store.sync()
        return asyncio.sleep(0)  # let other groups run between Readys

    def start_sync(self) -> None:
        """Make everything written durable; nobody waits for it."""
        self._store.sync()

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        pass

    def close(self) -> None:
        pass


class SharedFlush:
    """The node's flusher: one fsync for all groups of a loop turn (`Flusher.sync`)."""

    lazy_commit = True

    def __init__(
        self,
        store: Any,
        sync: Callable[[Any], Awaitable[None]],
        store_lazily: Callable[[Any], None] | None,
        write_states: Callable[[], None] | None,
    ) -> None:
        self._store = store
        self._sync = sync
        self._store_lazily = store_lazily
        self._write_states = write_states

    def may_persist_later(self, ready: Ready) -> bool:
        return False

    def persist_lazily(self) -> None:
        # Only the commit index moved: stored with the node's next flush; nothing waits.
        if self._store_lazily is not None:
            self._store_lazily(self._store)
        else:
            self.start_sync()

    def persist_later(self, ready: Ready) -> None:
        raise AssertionError("SharedFlush never persists later")

    def persist_now(self, ready: Ready) -> Any:
        return self._sync(self._store)  # shared with every group of this loop turn

    def start_sync(self) -> None:
        self._sync(self._store).add_done_callback(consume_outcome)  # type: ignore[attr-defined]

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        if mode is Durability.NOW and self._write_states is not None:
            self._write_states()  # the flush's state write: after the answers, before applying

    def close(self) -> None:
        pass


class BackgroundWrites:
    """A leader's own appends: start their fsync and go on without waiting for it.

    Why: the leader's own write promises nothing to anyone, and two followers'
    answers are a majority without it. Waiting for it, a busy leader left the
    answers and the next requests unread for the length of its fsync (produce
    throughput rose 6-32 % without the wait; docs/node.md). The core counts the
    leader toward the quorum only once the driver reports the entries durable
    (`RaftCore.persisted`, from `take_reports`), so nothing is committed on the
    strength of a write a crash could lose. Everything else goes to `inner`."""

    def __init__(
        self,
        inner: DirectSync | SharedFlush,
        store: Any,
        sync_in_background: Callable[[Any], asyncio.Future[None]],
        wake: Callable[[], None],
    ) -> None:
        self._inner = inner
        self.lazy_commit = inner.lazy_commit
        self._store = store
        self._sync_in_background = sync_in_background
        self._wake = wake  # the group's task takes the reports on its next turn
        self._reports: list[tuple[Index, Term]] = []
        self._failure: BaseException | None = None
        self._bytes = 0  # appends handed to sync_in_background, not reported yet

    @property
    def reported(self) -> bool:
        return bool(self._reports) or self._failure is not None

    def take_reports(self) -> list[tuple[Index, Term]]:
        """The background writes found durable since the last call (last index, term
        each); raises what a failed one raised: the group fails, as on any failed flush."""
        if self._failure is not None:
            raise self._failure
        reports, self._reports = self._reports, []
        return reports

    def may_persist_later(self, ready: Ready) -> bool:
        return self._bytes < BACKGROUND_BYTES_MAX

    def persist_lazily(self) -> None:
        self._inner.persist_lazily()

    def persist_later(self, ready: Ready) -> None:
        last = ready.entries[-1]
        size = entries_size_bytes(ready.entries)
        self._bytes += size
        done = self._sync_in_background(self._store)

        def report(future: asyncio.Future[None]) -> None:
            self._bytes -= size
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                self._failure = error
            else:
                self._reports.append((last.index, last.term))
            self._wake()

        done.add_done_callback(report)

    def persist_now(self, ready: Ready) -> Any:
        return self._inner.persist_now(ready)

    def start_sync(self) -> None:
        self._inner.start_sync()

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        self._inner.before_apply(ready, mode)

    def close(self) -> None:
        # The wake is the group's bound method and the group holds this object: the cycle
        # would keep a closed group alive until a full collection, which a node that froze
        # its heap no longer runs (multiraft/runtime/heap.py). A write that ends later
        # wakes nobody.
        self._wake = _nobody
        forget_frames(self._failure)
        self._inner.close()


def _nobody() -> None:
    pass


def forget_frames(error: BaseException | None) -> None:
    """Drop the tracebacks a kept failure holds (and those it was raised from): a
    traceback holds the frames that raised it, the group's own among them, so a closed
    group that keeps its failure would be a reference cycle, never freed once its
    objects are frozen (multiraft/runtime/heap.py). The failure's type and message,
    all that is read of it afterwards, stay."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


class AckBeforeFsync:
    """UNSAFE, the chaos runner's ack-before-fsync control (multiraft/node/unsafe.py).

    Says every write is durable at once and syncs it UNSAFE_SYNC_DELAY_S later, so
    append acknowledgements, the leader's own count (`advance`) and acks=leader
    answers go out before the fsync. A snapshot's write and a term or vote change
    still sync first: this control breaks only what it names. Never lazy, never in
    the background: every write goes through `persist_now`, which lies."""

    lazy_commit = False

    def __init__(self, inner: DirectSync | SharedFlush | BackgroundWrites, term_vote: tuple[int, int]) -> None:
        self._inner = inner
        self._term_vote = term_vote  # the last synced term and vote
        self._deferred = False  # the current Ready's sync was deferred
        self._timer: asyncio.TimerHandle | None = None

    def may_persist_later(self, ready: Ready) -> bool:
        return False

    def persist_lazily(self) -> None:
        raise AssertionError("AckBeforeFsync is never lazy")

    def persist_later(self, ready: Ready) -> None:
        raise AssertionError("AckBeforeFsync never persists later")

    def persist_now(self, ready: Ready) -> Any:
        self._deferred = self._may_defer(ready)
        if not self._deferred:
            return self._inner.persist_now(ready)
        if self._timer is None:  # UNSAFE: acknowledged before it is durable
            self._timer = asyncio.get_running_loop().call_later(UNSAFE_SYNC_DELAY_S, self._sync_now)
        return None

    def _may_defer(self, ready: Ready) -> bool:
        if ready.snapshot is not None:
            return False
        hard_state = ready.hard_state
        if hard_state is not None and (hard_state.term, hard_state.vote) != self._term_vote:
            self._term_vote = (hard_state.term, hard_state.vote)
            return False
        return True

    def _sync_now(self) -> None:
        self._timer = None
        self._inner.start_sync()

    def start_sync(self) -> None:
        self._inner.start_sync()

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        if not self._deferred:
            self._inner.before_apply(ready, mode)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._inner.close()


def choose_persistence(
    store: RaftStorage, deps: GroupDeps, term_vote: tuple[int, int], wake: Callable[[], None]
) -> tuple[Persistence, BackgroundWrites | None]:
    """The strategy a group's collaborators make, once: the node's flusher if it has one,
    with background writes for a leader if it may, inside the faulty strategy the node
    injects, if any. Also the background part, whose reports the group takes."""
    base: DirectSync | SharedFlush = (
        DirectSync(store) if deps.sync is None
        else SharedFlush(store, deps.sync, deps.store_lazily, deps.write_states)
    )
    real: DirectSync | SharedFlush | BackgroundWrites = base
    background = None
    if deps.sync_in_background is not None:
        real = background = BackgroundWrites(base, store, deps.sync_in_background, wake)
    if deps.persistence_fault is None:
        return real, background
    return deps.persistence_fault(real, term_vote), background


def consume_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
