"""`check ID key=value ...`: assert a node's state; a false condition fails the test.

Unlike output, which REWRITE would silently regenerate, a `check` states what
the scenario must show and keeps failing until the core does it again. Keys:
role, term, vote, leader, commit, applied, last, voters, learners (ids as
`1,2,3`), and for a leader `match.N` (follower N's match index).

    check 1 role=leader term=2 commit=4
    ----
    ok
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.core.raft import RaftCore
from raftlog.types import NodeId
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command, ScriptError


def _ids(nodes: frozenset[NodeId]) -> str:
    return ",".join(str(node) for node in sorted(nodes))


def _match(core: RaftCore, peer: int) -> str:
    progress = core.progress(NodeId(peer))
    return "none" if progress is None else str(progress.match)


GETTERS: dict[str, Callable[[RaftCore], str]] = {
    "role": lambda core: core.role.value,
    "term": lambda core: str(core.term),
    "vote": lambda core: str(core.vote),
    "leader": lambda core: str(core.leader),
    "commit": lambda core: str(core.commit_index),
    "applied": lambda core: str(core.applied_index),
    "last": lambda core: str(core.log.last_index()),
    "voters": lambda core: _ids(core.membership.voters),
    "learners": lambda core: _ids(core.membership.learners),
}


def handle(env: InteractionEnv, command: Command) -> None:
    node_id = command.int_at(0)
    core = env.core(node_id)
    if not command.options:
        raise ScriptError(f"line {command.line}: check wants key=value conditions")
    failures = []
    for key, expected in command.options.items():
        if key.startswith("match."):
            actual = _match(core, int(key.removeprefix("match.")))
        elif key in GETTERS:
            actual = GETTERS[key](core)
        else:
            raise ScriptError(f"line {command.line}: check has no key {key!r}")
        if actual != expected:
            failures.append(f"{key}: expected {expected}, got {actual}")
    if failures:
        raise AssertionError(f"line {command.line}: check {node_id} failed: " + "; ".join(failures))
