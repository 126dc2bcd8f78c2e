"""The interaction environment: N Raft cores, their storage, and a hand-driven network.

Nothing happens on its own here. Time moves only when a script ticks a node, a
message moves only when a script delivers it, and a Ready is handled only when a
script says `process-ready` (or `stabilize`). That is what lets a script stop the
world between any two protocol steps and show, or break, exactly one of them.

Each node is driven the way the real driver drives its core (see
`raftlog/core/ready.py`): `ready()`, queue `messages`, write the snapshot,
entries and hard state to its `MemoryStorage`, sync when `must_sync`, queue
`persisted_messages`, apply `committed_entries`, `advance()`. Each core gets its
own `random.Random` with a fixed seed, so a script replays identically.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.messages import Entry, EntryKind, Message, Snapshot, SnapshotMeta
from raftlog.types import Index
from storage.memory import MemoryStorage
from tests.datadriven import render
from tests.datadriven.runner import ScriptError

LOG_LEVELS = {"none": 0, "info": 1, "debug": 2}
# An applied entry as the toy state machine keeps it (and as snapshots carry it).
AppliedEntry = tuple[int, int, EntryKind, bytes]


class CaptureLogger:
    """A structlog-shaped logger that prints core log events into the script output.

    etcd's interaction tests print the core's log lines too: they say *why* a
    node changed role ("stepped_down_no_quorum"), which messages alone do not.
    """

    def __init__(self, env: InteractionEnv, fields: dict[str, Any] | None = None) -> None:
        self._env = env
        self._fields = fields or {}

    def bind(self, **fields: Any) -> CaptureLogger:
        return CaptureLogger(self._env, {**self._fields, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(2, "DEBUG", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(1, "INFO", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(1, "WARN", event, fields)

    def _emit(self, level: int, name: str, event: str, fields: dict[str, Any]) -> None:
        if self._env.log_level < level:
            return
        merged = {**self._fields, **fields}
        node = merged.pop("node_id", "?")
        detail = " ".join(f"{key}={value}" for key, value in merged.items())
        self._env.print(f"{name} {node} {event} {detail}".rstrip())


@dataclass(slots=True)
class Node:
    id: int
    storage: MemoryStorage
    config: Config
    core: RaftCore | None = None
    incarnation: int = 0
    # The toy state machine: every applied entry, starting after the snapshot's data.
    applied: list[AppliedEntry] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.core is not None


class InteractionEnv:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.nodes: dict[int, Node] = {}
        self.queue: list[Message] = []
        self.log_level = LOG_LEVELS["debug"]
        # Partition groups: node -> group number; unlisted nodes share group -1.
        self._groups: dict[int, int] | None = None
        self._out: list[str] = []
        self._indent = ""

    # ------------------------------------------------------------------ output

    def print(self, line: str) -> None:
        self._out.append(self._indent + line)

    @contextmanager
    def indented(self, prefix: str = "  ") -> Iterator[None]:
        saved = self._indent
        self._indent = saved + prefix
        try:
            yield
        finally:
            self._indent = saved

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Discard output (for setup steps that are the same in every script)."""
        saved = self._out
        self._out = []
        try:
            yield
        finally:
            self._out = saved

    def take_output(self) -> list[str]:
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ nodes

    def start(self, node: Node) -> None:
        """Build a core over the node's storage (first start or restart after a crash)."""
        snapshot = node.storage.snapshot()
        node.incarnation += 1
        config = dataclasses.replace(node.config, applied=Index(snapshot.meta.index))
        rng = random.Random(self.seed * 1_000_000 + node.id * 1_000 + node.incarnation)
        node.core = RaftCore(config, node.storage, rng, CaptureLogger(self))
        node.applied = list(snapshot.data or ())

    def node(self, node_id: int) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ScriptError(f"no node {node_id}") from None

    def core(self, node_id: int) -> RaftCore:
        core = self.node(node_id).core
        if core is None:
            raise ScriptError(f"node {node_id} is down")
        return core

    def up_ids(self, scope: Iterable[int] | None = None) -> list[int]:
        chosen = self.nodes if scope is None else scope
        return sorted(node_id for node_id in chosen if self.node(node_id).up)

    # ------------------------------------------------------------------ the driver

    def process_ready(self, node_id: int) -> bool:
        """Handle one Ready of `node_id` in the driver's order; False if it had none."""
        node = self.node(node_id)
        core = self.core(node_id)
        if not core.has_ready():
            self.print("no Ready")
            return False
        ready = core.ready()
        for line in render.ready(ready):
            self.print(line)
        self.queue.extend(ready.messages)
        storage = node.storage
        if ready.snapshot is not None:
            storage.apply_snapshot(ready.snapshot)
            node.applied = list(ready.snapshot.data or ())
        if ready.entries:
            storage.append(ready.entries)
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)
        if ready.must_sync:
            storage.sync()
        self.queue.extend(ready.persisted_messages)
        for entry in ready.committed_entries:
            self._apply(node, entry)
        core.advance(ready)
        return True

    def _apply(self, node: Node, entry: Entry) -> None:
        last = node.applied[-1][0] if node.applied else node.storage.snapshot().meta.index
        assert entry.index == last + 1, f"node {node.id} applied {entry.index} after {last}"
        node.applied.append((entry.index, entry.term, entry.kind, entry.payload))

    # ------------------------------------------------------------------ the network

    def partition(self, groups: list[list[int]]) -> None:
        self._groups = {node: number for number, group in enumerate(groups) for node in group}

    def heal(self) -> None:
        self._groups = None

    def blocked(self, source: int, target: int) -> bool:
        if self._groups is None:
            return False
        return self._groups.get(source, -1) != self._groups.get(target, -1)

    def pending_targets(self, scope: Iterable[int] | None = None) -> list[int]:
        allowed = None if scope is None else set(scope)
        return sorted({m.target for m in self.queue if allowed is None or m.target in allowed})

    def deliver(
        self,
        targets: Iterable[int],
        drop: frozenset[int] = frozenset(),
        types: frozenset[str] | None = None,
    ) -> int:
        """Deliver queued messages to `targets` (in queue order per target); returns the count.

        A message to a node in `drop`, to a down node, or across a partition is lost
        (printed as dropped), as a real network loses it.
        """
        handled = 0
        for target in sorted(set(targets)):
            chosen = [
                m
                for m in self.queue
                if m.target == target and (types is None or m.type.name in types)
            ]
            if not chosen:
                continue
            taken = set(map(id, chosen))
            self.queue = [m for m in self.queue if id(m) not in taken]
            for message in chosen:
                handled += 1
                reason = self._loss_reason(message, drop)
                if reason:
                    self.print(f"dropped ({reason}): {render.message(message)}")
                    continue
                self.print(render.message(message))
                self.core(target).step(message)
        return handled

    def _loss_reason(self, message: Message, drop: frozenset[int]) -> str:
        if message.target in drop:
            return "drop"
        if message.target not in self.nodes or not self.nodes[message.target].up:
            return "down"
        if self.blocked(message.source, message.target):
            return "partition"
        return ""

    # ------------------------------------------------------------------ faults

    def crash(self, node_id: int) -> None:
        """Lose everything not synced (`MemoryStorage.crash`) and the in-memory core."""
        node = self.node(node_id)
        if not node.up:
            raise ScriptError(f"node {node_id} is already down")
        node.storage.crash()
        node.core = None
        node.applied = []

    def compact(self, node_id: int, index: int) -> None:
        """Compact the log through `index` and record the state machine's snapshot there."""
        node = self.node(node_id)
        core = self.core(node_id)
        if index > core.applied_index:
            raise ScriptError(
                f"node {node_id} applied only {core.applied_index}, cannot compact {index}"
            )
        if any(entry[0] > index and entry[2] is EntryKind.CONFIG for entry in node.applied):
            raise ScriptError(
                "a membership change was applied after that index; compact at it or later"
            )
        storage = node.storage
        at = Index(index)
        term = storage.term(at)
        storage.compact(at)
        data = tuple(entry for entry in node.applied if entry[0] <= index)
        meta = SnapshotMeta(index=at, term=term, membership=core.membership)
        storage.set_snapshot(Snapshot(meta=meta, data=data))
        storage.sync()
