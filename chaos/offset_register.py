"""Committed offsets as registers: is every group's commit/fetch history linearizable?

One register per (group, partition), searched with Wing and Gong's algorithm and
Lowe's memo, as Porcupine does; `CheckLimits` bounds the search, which is
exponential in the worst case (the class `committed-offset-nonlinearizable`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.anomalies import Anomaly, anomaly
from chaos.history import OffsetCommit, OffsetFetch, Outcome, PartitionKey


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckLimits:
    """Bounds on the linearizability search, which is exponential in the worst case.

    A per-key register history is mostly sequential (one consumer commits, then
    fetches), where the search takes about two steps per op; the bounds only cut
    off pathological concurrency, which is reported as unchecked, not as passed.
    """

    register_ops_max: int = 10_000
    register_steps_max: int = 1_000_000
    register_memo_bytes_max: int = 256 << 20

    def __post_init__(self) -> None:
        assert self.register_ops_max > 0
        assert self.register_steps_max > 0
        assert self.register_memo_bytes_max > 0




@dataclass(frozen=True, slots=True)
class _RegisterOp:
    op: int
    invoke_s: float
    complete_s: float  # inf for an ambiguous commit: it may take effect at any later time
    is_write: bool
    value: int | None


def committed_offsets(
    commits: list[OffsetCommit], fetches: list[OffsetFetch], limits: CheckLimits
) -> tuple[list[Anomaly], list[str]]:
    """One register per (group, partition); linearizability is local, so checking
    each alone checks the whole (Herlihy and Wing's locality, Porcupine's
    P-compositionality)."""
    anomalies: list[Anomaly] = []
    unchecked: list[str] = []
    for (group, key), register in _registers(commits, fetches).items():
        if all(register_op.is_write for register_op in register):
            continue  # writes alone always linearize
        where = f"group {group} {key}"
        if len(register) > limits.register_ops_max:
            unchecked.append(f"{where}: {len(register)} offset ops, over {limits.register_ops_max}")
            continue
        # Each memo entry holds a bitmask of the ops: bound the memory, not only the time.
        memo_entry_bytes = len(register) // 8 + 64
        steps_max = min(
            limits.register_steps_max, limits.register_memo_bytes_max // memo_entry_bytes
        )
        linearizable, stuck = _linearizable(register, steps_max)
        if linearizable is None:
            unchecked.append(f"{where}: search over {steps_max} steps")
        elif not linearizable:
            explanation = (
                f"group {group}: no linearization of {len(register)} commits/fetches; "
                f"stuck at op {stuck}"
            )
            anomalies.append(
                anomaly("committed-offset-nonlinearizable", key, explanation, (stuck,))
            )
    return anomalies, unchecked


def _registers(
    commits: list[OffsetCommit], fetches: list[OffsetFetch]
) -> dict[tuple[str, PartitionKey], list[_RegisterOp]]:
    """The ops that constrain each register. A failed commit did nothing and an
    ambiguous fetch says nothing. An ambiguous commit may take effect at any time
    after its invocation (it completes at infinity); if no fetch ever returned its
    offset it constrains nothing either (taking effect last is always possible),
    and dropping it keeps it from multiplying the search."""
    fetched = {(op.group, op.key, op.offset) for op in fetches if op.outcome is Outcome.OK}
    registers: dict[tuple[str, PartitionKey], list[_RegisterOp]] = defaultdict(list)
    for op in commits:
        if op.outcome is Outcome.FAIL:
            continue
        complete_s = op.complete_s
        if op.outcome is Outcome.INFO:
            if (op.group, op.key, op.offset) not in fetched:
                continue
            complete_s = math.inf
        registers[op.group, op.key].append(
            _RegisterOp(op.index, op.invoke_s, complete_s, True, op.offset)
        )
    for op in fetches:
        if op.outcome is Outcome.OK:
            registers[op.group, op.key].append(
                _RegisterOp(op.index, op.invoke_s, op.complete_s, False, op.offset)
            )
    return registers


class _EventList:
    """The invoke and complete events of a register history, in time order, as a
    doubly linked list that ops can be lifted out of and put back (WGL's core).
    Node 0 is the head; nodes 1..2n are events; `end` follows the last."""

    __slots__ = ("end", "is_call", "next", "op_of", "previous", "return_of")

    def __init__(self, register: Sequence[_RegisterOp]) -> None:
        count = len(register)
        # Calls sort before returns at equal times: touching ops count as concurrent.
        events = sorted(
            [(op.invoke_s, 0, i) for i, op in enumerate(register)]
            + [(op.complete_s, 1, i) for i, op in enumerate(register)]
        )
        self.end = 2 * count + 1
        self.next = list(range(1, self.end + 1))
        self.previous = list(range(-1, self.end))
        self.op_of = [0] * (self.end + 1)
        self.is_call = [False] * (self.end + 1)
        self.return_of = [0] * count
        for node, (_, kind, i) in enumerate(events, start=1):
            self.op_of[node], self.is_call[node] = i, kind == 0
            if kind == 1:
                self.return_of[i] = node

    def lift(self, call: int) -> None:
        """Take a call and its return out (the op is linearized)."""
        for node in (call, self.return_of[self.op_of[call]]):
            self.next[self.previous[node]] = self.next[node]
            self.previous[self.next[node]] = self.previous[node]

    def unlift(self, call: int) -> None:
        """Put them back, return first: the exact reverse of `lift`."""
        for node in (self.return_of[self.op_of[call]], call):
            self.next[self.previous[node]] = node
            self.previous[self.next[node]] = node


def _linearizable(register: Sequence[_RegisterOp], steps_max: int) -> tuple[bool | None, int]:
    """Wing and Gong's search with Lowe's cache, as Porcupine does it.

    Walk the events in time order; linearize the first pending call the model
    accepts (lift it out) and start over from the head; reaching a return whose
    call is still there is a dead end: undo the last choice and try the next call.
    A (linearized set, state) pair already tried is skipped, which keeps the
    search near linear on mostly sequential histories. Returns (True, -1),
    (False, the op stuck at the deepest dead end) or (None, -1) past the budget.
    """
    events = _EventList(register)
    state: int | None = None  # no committed offset yet
    linearized = 0  # bit i: register[i] is linearized
    tried: set[tuple[int, int | None]] = set()
    calls: list[tuple[int, int | None]] = []  # (call node, state before it)
    deepest, stuck = -1, -1
    node = events.next[0]
    for _ in range(steps_max):
        if events.next[0] == events.end:
            return True, -1
        i = events.op_of[node]
        if events.is_call[node]:
            op = register[i]
            if op.is_write or op.value == state:
                mark = (linearized | 1 << i, op.value)
                if mark not in tried:
                    tried.add(mark)
                    calls.append((node, state))
                    linearized, state = mark
                    events.lift(node)
                    node = events.next[0]
                    continue
            node = events.next[node]
            continue
        if len(calls) > deepest:
            deepest, stuck = len(calls), register[i].op
        if not calls:
            return False, stuck
        node, state = calls.pop()
        linearized &= ~(1 << events.op_of[node])
        events.unlift(node)
        node = events.next[node]
    return (True, -1) if events.next[0] == events.end else (None, -1)


