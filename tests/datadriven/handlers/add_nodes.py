"""`add-nodes N [voters=1,2,3] [learners=4] [pre-vote=true] [check-quorum=true]
[election-timeout=10] [heartbeat-interval=1] [max-msg-bytes=N] [max-inflight=N] [lag-ticks=N]`

Adds N nodes with the next free ids. Nodes named in `voters`/`learners` start
from the same bootstrapped log (`bootstrap_entries`, plus one committed
ADD_LEARNER entry per learner); the others start empty, as a node that is about
to join through a membership change does. With no `voters` the very first
`add-nodes` makes every new node a voter.

Each bootstrapped node's first Ready (applying the bootstrap entries) is handled
quietly and summarised in one line: it is the same for every script.

    add-nodes 3 pre-vote=false
    ----
    1: follower term=1 vote=0 leader=0 commit=3 applied=3 last=3 voters=(1,2,3)
    ...
"""

from __future__ import annotations

from raftlog.bootstrap import BOOTSTRAP_TERM, bootstrap_entries
from raftlog.core.config import Config
from raftlog.messages import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    encode_conf_change,
)
from raftlog.types import Index, NodeId
from storage.memory import MemoryStorage
from tests.datadriven.env import InteractionEnv, Node
from tests.datadriven.handlers.status import summary
from tests.datadriven.runner import Command, ScriptError

OPTIONS = (
    "voters",
    "learners",
    "pre-vote",
    "check-quorum",
    "election-timeout",
    "heartbeat-interval",
    "max-msg-bytes",
    "max-inflight",
    "lag-ticks",
)


def handle(env: InteractionEnv, command: Command) -> None:
    command.check_known(*OPTIONS)
    count = command.int_at(0)
    first = max(env.nodes, default=0) + 1
    new_ids = list(range(first, first + count))
    voters = command.ids_option("voters")
    if voters is None:
        voters = [] if env.nodes else new_ids
    learners = command.ids_option("learners") or []
    if not set(voters) | set(learners) <= set(new_ids):
        raise ScriptError(
            f"line {command.line}: voters and learners must be among the new ids {new_ids}"
        )
    log, hard_state = _bootstrap(voters, learners)
    defaults = Config(node_id=NodeId(1))
    for node_id in new_ids:
        storage = MemoryStorage()
        if node_id in voters or node_id in learners:
            storage.append(log)
            storage.set_hard_state(hard_state)
            storage.sync()
        config = Config(
            node_id=NodeId(node_id),
            pre_vote=command.bool_option("pre-vote", defaults.pre_vote),
            check_quorum=command.bool_option("check-quorum", defaults.check_quorum),
            election_timeout_ticks=command.int_option(
                "election-timeout", defaults.election_timeout_ticks
            ),
            heartbeat_interval_ticks=command.int_option(
                "heartbeat-interval", defaults.heartbeat_interval_ticks
            ),
            message_bytes_max=command.int_option("max-msg-bytes", defaults.message_bytes_max),
            inflight_messages_max=command.int_option(
                "max-inflight", defaults.inflight_messages_max
            ),
            replica_lag_time_max_ticks=command.int_option(
                "lag-ticks", defaults.replica_lag_time_max_ticks
            ),
        )
        node = Node(node_id, storage, config)
        env.nodes[node_id] = node
        with env.quiet():
            env.start(node)
            if node.core is not None and node.core.has_ready():
                env.process_ready(node_id)
        env.print(summary(env, node_id))


def _bootstrap(voters: list[int], learners: list[int]) -> tuple[list[Entry], HardState]:
    if not voters:
        if learners:
            raise ScriptError("learners need voters to bootstrap with")
        return [], HardState()
    log, hard_state = bootstrap_entries(NodeId(v) for v in voters)
    for learner in sorted(learners):
        change = ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(learner))
        log.append(
            Entry(Index(len(log) + 1), BOOTSTRAP_TERM, EntryKind.CONFIG, encode_conf_change(change))
        )
    return log, HardState(term=hard_state.term, commit=Index(len(log)))
