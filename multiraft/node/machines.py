"""The two kinds of state machine a node's groups apply their logs to.

`CatalogMachine` is group 0's (metadata commands into the node's `Catalog`, held by
its `CatalogHolder`, and consumer group commands into the `GroupsState` beside it);
`PartitionMachine` is every partition group's (record batches, producer table and
consumer offsets into a `PartitionState`). Both are thin: the logic lives in the
catalog and partition modules, which know nothing of Raft.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import (
    GroupResult,
    GroupsState,
    decode_group_command,
    decode_groups,
    encode_groups,
    is_group_command,
)
from multiraft.errors import InvalidRequest, SnapshotFormatError
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import CreatePartitions, GrowMirrorTopic, decode_command
from multiraft.state.partition import PartitionState
from multiraft.state.producers import NewProducerTable, ProducerTable
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder


# A snapshot of group 0 holding consumer groups: this prefix, the catalog's length (u64),
# the catalog snapshot, then the groups snapshot. Without groups a snapshot is the
# catalog's bytes alone, as before groups existed (so those still restore).
GROUPS_SNAPSHOT_MAGIC = b"\x00raftlog-metadata+groups-v1\n"
_LENGTH = struct.Struct(">Q")


class CatalogTopics:
    """The catalog's topics as the consumer group state reads them (`TopicsView`)."""

    def __init__(self, catalog: Catalog, version: int | None) -> None:
        """`version`: the index of the last catalog command applied (`CatalogHolder.topics_index`)."""
        self._topics = catalog.topics
        self.version = version

    def partition_count(self, topic: str) -> int | None:
        info = self._topics.get(topic)
        return None if info is None else len(info.partitions)

    def names(self) -> Iterable[str]:
        return self._topics.keys()


class CatalogMachine:
    """Group 0's state machine: metadata commands (META entries) applied to the catalog,
    and consumer group commands (their own prefix) to the groups beside it.

    Commands are META entries, not DATA: DATA entries hold record batches, which
    storage indexes by offset; a metadata command is not a record. A group command
    resolves its subscriptions against the catalog as of the same entry.
    """

    def __init__(self, holder: CatalogHolder) -> None:
        self.holder = holder

    def apply(self, entry: Entry) -> Any:
        catalog = self.holder.catalog
        if entry.kind is not EntryKind.META:
            catalog.skip(entry.index)
            return None
        if is_group_command(entry.payload):
            catalog.skip(entry.index)  # the catalog's applied index still follows the log
            try:
                command = decode_group_command(entry.payload)
            except InvalidRequest as error:  # a committed entry that does not decode changes nothing
                return GroupResult(entry.index, error=error)
            return self.holder.groups.apply(entry.index, command, CatalogTopics(catalog, self.holder.topics_index))
        command = decode_command(entry.payload)
        result = catalog.apply(entry.index, command)
        self.holder.topics_index = int(entry.index)  # the topics may have changed here
        # Subscribed groups take the new partitions now (added by hand, or a mirror following its source).
        if isinstance(command, CreatePartitions | GrowMirrorTopic) and result.ok:
            self.holder.groups.partitions_added(CatalogTopics(catalog, self.holder.topics_index))
        self.holder.changed()
        return result

    def snapshot(self) -> bytes:
        catalog = self.holder.catalog.snapshot()
        if not self.holder.groups.groups:
            return catalog
        return GROUPS_SNAPSHOT_MAGIC + _LENGTH.pack(len(catalog)) + catalog + encode_groups(self.holder.groups)

    def restore(self, data: object, index: Index) -> None:
        assert isinstance(data, bytes), "metadata snapshots are catalog bytes"
        if not data.startswith(GROUPS_SNAPSHOT_MAGIC):
            self.holder.replace(Catalog.restore(data))
            return
        start = len(GROUPS_SNAPSHOT_MAGIC) + _LENGTH.size
        if len(data) < start:
            raise SnapshotFormatError("metadata snapshot truncated")
        (length,) = _LENGTH.unpack_from(data, len(GROUPS_SNAPSHOT_MAGIC))
        if start + length > len(data):
            raise SnapshotFormatError("metadata snapshot truncated")
        catalog = Catalog.restore(data[start:start + length])
        groups: GroupsState = decode_groups(data[start + length:])
        self.holder.replace(catalog, groups)


class PartitionMachine:
    """A partition group's state machine (a thin adapter over `PartitionState`).

    `new_producers` builds its producer table, here and on every restore: the production
    `ProducerTable`, or the one the node's faults inject (multiraft/node/faults.py)."""

    def __init__(self, topic: str, partition: int, new_producers: NewProducerTable = ProducerTable) -> None:
        self._new_producers = new_producers
        self.state = PartitionState(topic=topic, partition=partition, new_producers=new_producers)
        self._changed = asyncio.Event()

    def apply(self, entry: Entry) -> Any:
        result = self.state.apply(entry)
        if entry.kind is EntryKind.DATA:
            # Wake long-polling readers; later waiters get a fresh event.
            self._changed.set()
            self._changed = asyncio.Event()
        return result

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    def close(self) -> None:
        """The replica is going away (topic deleted, replica moved): wake every waiting
        reader now, so it finds the partition gone instead of waiting out its wait_ms."""
        self._changed.set()

    def snapshot(self) -> bytes:
        return self.state.snapshot()

    @staticmethod
    def next_offset_of(data: object) -> Offset:
        """The offset after the last record a snapshot's state covers (where its log resumes)."""
        assert isinstance(data, bytes), "partition snapshots are state bytes"
        return PartitionState.restore(data).next_offset

    def restore(self, data: object, index: Index) -> None:
        assert isinstance(data, bytes), "partition snapshots are state bytes"
        self.state = PartitionState.restore(data, self._new_producers)
