"""The Ready processor (multiraft/runtime/ready_processor.py) and the persistence strategies.

Goal: the processor's choice of durability mode, table-driven; the order of its
steps with a recording host; that it yields exactly when the strategy hands it
something to wait for; and that the faulty ack-before-fsync strategy defers every
sync but a snapshot's and a term or vote change's, and never more than one timer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from multiraft.runtime import persistence as persistence_module
from multiraft.runtime.persistence import AckBeforeFsync, DirectSync
from multiraft.runtime.ready_processor import Durability, choose_durability, process_ready
from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.core.ready import Ready
from raftlog.messages import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    ReadState,
    Role,
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import Index, NodeId, Term
from storage.memory import MemoryStorage


class FakeCore:
    def __init__(self, later: bool) -> None:
        self.later = later

    def may_persist_later(self, ready: Ready) -> bool:
        return self.later


class FakePersistence:
    def __init__(self, lazy: bool = False, later: bool = False, wait: Any = None) -> None:
        self.lazy_commit = lazy
        self.later = later
        self.wait = wait
        self.calls: list[str] = []

    def may_persist_later(self, ready: Ready) -> bool:
        return self.later

    def persist_lazily(self) -> None:
        self.calls.append("lazy")

    def persist_later(self, ready: Ready) -> None:
        self.calls.append("later")

    def persist_now(self, ready: Ready) -> Any:
        self.calls.append("now")
        return self.wait

    def before_apply(self, ready: Ready, mode: Durability) -> None:
        self.calls.append(f"before_apply:{mode.value}")


ENTRY = Entry(Index(5), Term(2), EntryKind.DATA, b"x")


def ready(*, entries: bool = False, hard: HardState | None = None, must_sync: bool = False,
          snapshot: Snapshot | None = None) -> Ready:
    return Ready(number=1, hard_state=hard, soft_state=None, entries=(ENTRY,) if entries else (),
                 snapshot=snapshot, messages=(), persisted_messages=(), committed_entries=(), read_states=(),
                 must_sync=must_sync)


COMMIT_ONLY = HardState(term=2, vote=1, commit=4)


@pytest.mark.parametrize(
    ("case", "core_later", "lazy", "strategy_later", "expected"),
    [
        (ready(), True, True, True, Durability.NONE),
        (ready(hard=COMMIT_ONLY), False, True, False, Durability.LAZY),
        (ready(hard=COMMIT_ONLY), False, False, False, Durability.NOW),  # no flusher: sync it
        (ready(entries=True, must_sync=True), True, True, True, Durability.LATER),
        (ready(entries=True, must_sync=True), True, True, False, Durability.NOW),  # background full
        (ready(entries=True, must_sync=True), False, True, True, Durability.NOW),  # the core says no
        (ready(hard=COMMIT_ONLY, must_sync=True), False, True, True, Durability.NOW),  # a term or vote
    ],
)
def test_the_durability_mode(case: Ready, core_later: bool, lazy: bool, strategy_later: bool,
                             expected: Durability) -> None:
    # Goal: one table says which mode each kind of Ready gets under each strategy.
    chosen = choose_durability(FakeCore(core_later), case, FakePersistence(lazy, strategy_later))  # type: ignore[arg-type]
    assert chosen is expected


class RecordingHost:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def send_message(self, message: Message) -> None:
        self.steps.append(f"send:{message.type.name}")

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.steps.append("snapshot")

    def append_entries(self, entries: tuple[Entry, ...]) -> None:
        self.steps.append(f"append:{entries[0].index}-{entries[-1].index}")

    def store_hard_state(self, hard_state: HardState) -> None:
        self.steps.append("hard_state")

    def entries_durable(self, index: Index) -> None:
        self.steps.append(f"durable:{index}")

    def apply_committed(self, entries: Iterator[tuple[Entry, Membership]]) -> None:
        for entry, membership in entries:
            self.steps.append(f"apply:{entry.index}:{sorted(membership.voters)}")

    def hand_over_reads(self, read_states: tuple[ReadState, ...]) -> None:
        self.steps.append("reads")


def follower_core() -> RaftCore:
    """Node 2 of three, its bootstrap applied."""
    storage = MemoryStorage()
    entries, hard_state = bootstrap_entries([NodeId(1), NodeId(2), NodeId(3)])
    storage.append(entries)
    storage.set_hard_state(hard_state)
    storage.sync()
    core = RaftCore(Config(node_id=NodeId(2)), storage, random.Random(1))
    drive(core, RecordingHost(), FakePersistence(lazy=True))
    return core


def drive(core: RaftCore, host: RecordingHost, persistence: FakePersistence) -> list[Any]:
    waits = []
    while core.has_ready():
        waits.extend(process_ready(core, core.ready(), host, persistence))  # type: ignore[arg-type]
    return waits


def test_the_steps_run_in_the_order_the_core_requires() -> None:
    # Goal: write, then durability, then answers, then apply (with the membership in
    # force), then advance; the processor yields exactly what the strategy hands it.
    core = follower_core()
    last = core.log.last_index()
    new = Entry(Index(last + 1), Term(2), EntryKind.DATA, b"x")
    core.step(Message(type=MessageType.APPEND, source=NodeId(1), target=NodeId(2), term=Term(2),
                      log_term=core.log.last_term(), index=last, entries=(new,), commit=new.index))
    host, persistence = RecordingHost(), FakePersistence(lazy=True, wait="disk")
    steps = process_ready(core, core.ready(), host, persistence)  # type: ignore[arg-type]
    assert next(steps) == "disk"
    assert host.steps == [f"append:{new.index}-{new.index}", "hard_state"], "written, not yet answered"
    assert next(steps, None) is None
    assert host.steps[2:] == [f"durable:{new.index}", "send:APPEND_RESPONSE", f"apply:{new.index}:[1, 2, 3]"]
    assert persistence.calls == ["now", "before_apply:now"]
    assert core.applied_index == new.index and not core.has_ready()


def test_a_ready_with_nothing_to_wait_for_runs_through() -> None:
    # Goal: no wait handed over, no yield: the driver resumes nothing.
    core = follower_core()
    core.campaign()
    assert drive(core, RecordingHost(), FakePersistence(lazy=True, wait=None)) == []
    assert core.role is not Role.FOLLOWER


class Inner(DirectSync):
    def __init__(self) -> None:
        self.synced: list[str] = []

    def persist_now(self, ready: Ready) -> Any:
        self.synced.append("now")
        return None

    def start_sync(self) -> None:
        self.synced.append("later")


@pytest.mark.asyncio
async def test_ack_before_fsync_defers_all_but_snapshots_and_term_or_vote_changes(monkeypatch) -> None:
    # Goal: the chaos control's faulty strategy lies about durability for exactly what it
    # names, syncs what it deferred UNSAFE_SYNC_DELAY_S later (one timer at a time), and
    # is never lazy nor in the background, so every write passes through its lie.
    monkeypatch.setattr(persistence_module, "UNSAFE_SYNC_DELAY_S", 0.01)
    inner = Inner()
    unsafe = AckBeforeFsync(inner, (2, 1))
    assert not unsafe.lazy_commit and not unsafe.may_persist_later(ready(entries=True))
    assert unsafe.persist_now(ready(entries=True, must_sync=True, hard=COMMIT_ONLY)) is None
    assert unsafe.persist_now(ready(hard=COMMIT_ONLY)) is None
    assert inner.synced == []
    snapshot = Snapshot(meta=SnapshotMeta(index=Index(3), term=Term(1), membership=Membership()))
    unsafe.persist_now(ready(snapshot=snapshot, must_sync=True))
    unsafe.persist_now(ready(hard=HardState(term=3, vote=0, commit=4), must_sync=True))
    assert inner.synced == ["now", "now"], "a snapshot and a new term are synced first"
    await asyncio.sleep(0.05)
    assert inner.synced == ["now", "now", "later"], "the deferred syncs ran, once"
    unsafe.close()
