"""The catalog's records: nodes, topics, partitions, tokens, and what a command returns.

Frozen values the catalog (multiraft/metadata/catalog.py) holds and hands out, and
its snapshot codec (multiraft/metadata/catalog_snapshot.py) writes and reads; both
import them from here, so the codec need not import the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from multiraft.metadata.commands import ConfigValue, NodeStatus
from multiraft.metadata.mirror_commands import MirrorLink
from raftlog.errors import ClientError
from raftlog.types import GroupId, Index, NodeId

METADATA_GROUP = GroupId(0)
FIRST_PARTITION_GROUP = GroupId(1)
ID_MAX = 2**63 - 1  # ids travel as u64/i64 in frames and batch headers


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: NodeId
    raft_addr: str
    http_addr: str
    rack: str | None
    status: NodeStatus
    drained: bool = False  # leads nothing (SetNodeDrained); survives restarts and re-registration
    # Leaving the cluster (SetNodeDecommissioning): leads nothing, takes no new replica,
    # its replicas move away, then it leaves the metadata group. Survives restarts too.
    decommissioning: bool = False

    @property
    def leads_nothing(self) -> bool:
        return self.drained or self.decommissioning


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: its Raft group and replicas (preferred leader first).

    `initial`: the replicas it was created with, the voters a new group's log is
    bootstrapped with (empty: the same as `replicas`, never moved). `leaving`: nodes
    whose replica moved elsewhere (`ReplaceReplica`) and which keep their copy until
    the group has removed them (`ReplicaLeft`).
    """

    partition: int
    group_id: GroupId
    replicas: tuple[NodeId, ...]
    initial: tuple[NodeId, ...] = ()
    leaving: tuple[NodeId, ...] = ()
    # Where a new replica's log starts (a mirror partition starts at its source's log
    # start offset, docs/mirror.md); 0 for every other partition.
    start_offset: int = 0
    # A mirror partition resynced keeping its identical prefix (docs/mirror.md "Repair"):
    # (the incarnation replaced, the index, term and next offset of its last entry kept);
    # each host builds this incarnation's first log from its own copy of that one, or starts
    # as a new replica would. Empty: none kept.
    prefix: tuple[int, int, int, int] = ()
    # A mirror partition's identity at its source: the source partition's group id when the
    # mirror was made or grown with it (`CreateMirrorTopic.source_groups`,
    # `GrowMirrorTopic.source_groups`; kept across resyncs, which copy the same source
    # partition). A resync after the source truncated past the mirror needs it equal to the
    # source's (multiraft/node/mirror_truncated.py). None: not recorded (a mirror made or
    # grown before it was, or not a mirror).
    source_group: int | None = None

    @property
    def bootstrap_voters(self) -> tuple[NodeId, ...]:
        return self.initial or self.replicas

    @property
    def hosts(self) -> tuple[NodeId, ...]:
        """The nodes that keep a copy: the replicas and the leaving ones."""
        return self.replicas + self.leaving


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A bearer token: its name, SHA-256 digest (never the token) and rights."""

    name: str
    digest: str
    rights: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    replication_factor: int
    config: dict[str, ConfigValue]
    partitions: tuple[PartitionInfo, ...]
    # A mirror of a source topic over this link: read-only until promoted. The link's name
    # stays after the promotion (its partitions' logs began as mirrors, which a replica
    # created late must know to replay them as the others did).
    mirror_link: str | None = None
    mirror_promoted: bool = False
    # The partitions the mirror was made or grown with (0 for a plain topic; GrowMirrorTopic
    # raises it as the source grows, before any promotion): only those began as mirrors
    # (mirror_bootstrap.py); partitions added after the promotion are plain.
    mirror_partitions: int = 0

    @property
    def is_mirror(self) -> bool:
        """Still copying its source (not promoted): read-only to producers."""
        return self.mirror_link is not None and not self.mirror_promoted


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Producer ids `first .. first + count - 1`, reserved for the proposer."""

    first: int
    count: int


@dataclass(frozen=True, slots=True)
class CatalogResult:
    """Outcome of one command: `value` on success, else `error` (catalog unchanged)."""

    index: Index
    value: NodeInfo | TopicInfo | ProducerIdBlock | MirrorLink | None = None
    error: ClientError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class LocalGroup(NamedTuple):
    topic: str
    partition: int
    replicas: tuple[NodeId, ...]
    bootstrap_voters: tuple[NodeId, ...] = ()  # empty: the same as `replicas`
