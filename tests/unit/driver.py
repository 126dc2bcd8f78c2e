"""The smallest synchronous driver of a `RaftCore`, shared by the unit tests.

It follows the Ready contract (write, sync, apply, advance) with everything
instantaneous; delivering the returned messages is the caller's business.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from raftlog.bootstrap import bootstrap_entries
from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, Message
from raftlog.types import NodeId
from storage.memory import MemoryStorage


def bootstrapped_core(node: int, voters: int, **config: object) -> RaftCore:
    entries, hard_state = bootstrap_entries([NodeId(i) for i in range(1, voters + 1)])
    storage = MemoryStorage()
    storage.append(entries)
    storage.set_hard_state(hard_state)
    storage.sync()
    return RaftCore(Config(node_id=NodeId(node), **config), storage, random.Random(node))  # type: ignore[arg-type]


def handle_ready(core: RaftCore, apply: Callable[[Entry], None]) -> list[Message]:
    """Handle one Ready; returns every message it sent (now and after the persist)."""
    ready = core.ready()
    storage = core.log.storage
    assert isinstance(storage, MemoryStorage)
    if ready.snapshot is not None:
        storage.apply_snapshot(ready.snapshot)
    storage.append(ready.entries)
    if ready.hard_state is not None:
        storage.set_hard_state(ready.hard_state)
    storage.sync()
    for entry in ready.committed_entries:
        apply(entry)
    core.advance(ready)
    return list(ready.messages + ready.persisted_messages)
