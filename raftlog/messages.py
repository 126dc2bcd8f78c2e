"""Typed entries, hard state, membership and the messages Raft cores exchange.

Everything here is a frozen dataclass: a message is a value, built once and then
only read. The core never sees bytes of a record batch: an entry's `payload` is
opaque except for NOOP (empty) and CONFIG (an encoded `ConfChange`, see
`encode_conf_change`). Wire encoding of messages lives apart (in the transport of
`multiraft/`), so the core stays free of codecs.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from raftlog.types import NO_NODE, Index, NodeId, Term


class EntryKind(enum.IntEnum):
    NOOP = 0  # appended by every new leader; commits the previous terms' entries
    CONFIG = 1  # a single-server membership change (payload: encoded ConfChange)
    DATA = 2  # one record batch (opaque to the core)
    META = 3  # partition metadata: consumer offsets, config changes (opaque to the core)


# Fixed per-entry overhead counted toward byte limits, so that empty entries still cost.
ENTRY_OVERHEAD_BYTES = 32


@dataclass(frozen=True, slots=True)
class Entry:
    index: Index
    term: Term
    kind: EntryKind
    payload: bytes = b""

    def size_bytes(self) -> int:
        return len(self.payload) + ENTRY_OVERHEAD_BYTES


def entries_size_bytes(entries: list[Entry] | tuple[Entry, ...]) -> int:
    return sum(len(e.payload) for e in entries) + ENTRY_OVERHEAD_BYTES * len(entries)


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before a node acts on it: a vote is never cast twice."""

    term: Term = Term(0)
    vote: NodeId = NO_NODE
    commit: Index = Index(0)


@dataclass(frozen=True, slots=True)
class Membership:
    """Who replicates a group. Learners receive the log but never vote or count."""

    voters: frozenset[NodeId] = frozenset()
    learners: frozenset[NodeId] = frozenset()

    def __post_init__(self) -> None:
        assert not (self.voters & self.learners), "a node is a voter or a learner, not both"
        assert NO_NODE not in self.voters and NO_NODE not in self.learners

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners

    def apply(self, change: ConfChange) -> Membership:
        """The membership after `change`; the caller has checked it is valid."""
        voters, learners = set(self.voters), set(self.learners)
        voters.discard(change.node_id)
        learners.discard(change.node_id)
        if change.op is ConfChangeOp.ADD_VOTER:
            voters.add(change.node_id)
        elif change.op is ConfChangeOp.ADD_LEARNER:
            learners.add(change.node_id)
        return Membership(voters=frozenset(voters), learners=frozenset(learners))


class ConfChangeOp(enum.IntEnum):
    ADD_VOTER = 0  # also promotes a learner
    ADD_LEARNER = 1
    REMOVE = 2


@dataclass(frozen=True, slots=True)
class ConfChange:
    op: ConfChangeOp
    node_id: NodeId

    def __post_init__(self) -> None:
        assert self.node_id != NO_NODE, "membership changes name a real node"


_CONF_CHANGE = struct.Struct(">BQ")


def encode_conf_change(change: ConfChange) -> bytes:
    return _CONF_CHANGE.pack(change.op, change.node_id)


def decode_conf_change(payload: bytes) -> ConfChange:
    op, node_id = _CONF_CHANGE.unpack(payload)
    return ConfChange(op=ConfChangeOp(op), node_id=NodeId(node_id))


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """The point a snapshot stands for: everything up to `index` (of `term`) applied."""

    index: Index
    term: Term
    membership: Membership


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot: metadata the core reads, and `data` it never does.

    For a partition `data` names the closed segments and the partition state to
    transfer (the driver moves the bytes); in the simulator it is the applied state.
    """

    meta: SnapshotMeta
    data: object = None


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the local applied index reaches `index`."""

    index: Index
    context: bytes


class MessageType(enum.IntEnum):
    APPEND = 1
    APPEND_RESPONSE = 2
    VOTE = 3
    VOTE_RESPONSE = 4
    PRE_VOTE = 5
    PRE_VOTE_RESPONSE = 6
    HEARTBEAT = 7
    HEARTBEAT_RESPONSE = 8
    SNAPSHOT = 9
    TIMEOUT_NOW = 10
    READ_INDEX = 11
    READ_INDEX_RESPONSE = 12
    PROPOSE = 13  # a follower forwarding proposals to its leader (not used by the core itself)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One Raft message. Fields unused by a type keep their defaults.

    - APPEND: `log_term`/`index` name the entry before `entries`; `commit` is the leader's.
    - APPEND_RESPONSE: `index` is the follower's last matching index, or with `reject`
      the index it rejected; `reject_hint`/`log_term` point the leader at the conflict.
      A rejection of index 0 (which no append draws) says the follower lost entries it
      had acknowledged; `reject_hint`/`log_term` name its last entry.
    - VOTE / PRE_VOTE: `index`/`log_term` describe the candidate's last entry; for
      PRE_VOTE, `term` is the term the candidate would campaign in; `commit` is the
      candidate's commit index (a voter holding its last entry learns it:
      `RaftCore._learn_commit_from_candidate`; 0 from older nodes).
    - VOTE_RESPONSE / PRE_VOTE_RESPONSE: with `reject`, and on a granted PRE_VOTE too,
      `commit`/`log_term` name the voter's commit index and that entry's term (a
      candidate holding it learns it is committed: `RaftCore._learn_commit`).
    - HEARTBEAT: `commit` is min(follower's match, leader's commit); `context` echoes ReadIndex.
    - SNAPSHOT: `snapshot` to install.
    """

    type: MessageType
    source: NodeId
    target: NodeId
    term: Term
    log_term: Term = Term(0)
    index: Index = Index(0)
    entries: tuple[Entry, ...] = ()
    commit: Index = Index(0)
    reject: bool = False
    reject_hint: Index = Index(0)
    context: bytes = b""
    snapshot: Snapshot | None = None
    transfer: bool = False  # a VOTE that comes from a leadership transfer (may break a lease)

    def __post_init__(self) -> None:
        assert self.source != NO_NODE and self.target != NO_NODE, "messages name both ends"
        assert self.term >= 0 and self.index >= 0


RESPONSE_TYPES = frozenset(
    {
        MessageType.APPEND_RESPONSE,
        MessageType.VOTE_RESPONSE,
        MessageType.PRE_VOTE_RESPONSE,
        MessageType.HEARTBEAT_RESPONSE,
        MessageType.READ_INDEX_RESPONSE,
    }
)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile role information; reported in a Ready when it changes."""

    leader: NodeId = NO_NODE
    role: Role = Role.FOLLOWER
