"""The groups a node hosts: one place owns the runtime, store and state machine of each.

`GroupRegistry` is the only writer of the three tables (multiraft/node/replicas.py
adds and removes through it); everyone else reads them through read-only views.
A partition group has all three; the metadata group has no `PartitionMachine`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from raftlog.messages import Role
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.machines import PartitionMachine
    from multiraft.runtime.group import GroupRuntime, GroupStatus
    from storage.segments import SegmentStore

METADATA_GROUP = GroupId(0)


class GroupRegistry:
    def __init__(self) -> None:
        self._groups: dict[GroupId, GroupRuntime] = {}
        self._stores: dict[GroupId, SegmentStore] = {}
        self._partitions: dict[GroupId, PartitionMachine] = {}
        # Read-only views of the live tables (they follow every add and remove).
        self.groups: Mapping[GroupId, GroupRuntime] = MappingProxyType(self._groups)
        self.stores: Mapping[GroupId, SegmentStore] = MappingProxyType(self._stores)
        self.partitions: Mapping[GroupId, PartitionMachine] = MappingProxyType(self._partitions)

    def add(self, group_id: GroupId, runtime: GroupRuntime, store: SegmentStore,
            machine: PartitionMachine | None) -> None:
        assert group_id not in self._groups, f"group {group_id} is open already"
        self._groups[group_id] = runtime
        self._stores[group_id] = store
        if machine is not None:
            self._partitions[group_id] = machine

    def remove(self, group_id: GroupId) -> tuple[GroupRuntime, SegmentStore, PartitionMachine | None]:
        return self._groups.pop(group_id), self._stores.pop(group_id), self._partitions.pop(group_id, None)

    def clear(self) -> None:
        self._groups.clear()
        self._stores.clear()
        self._partitions.clear()

    def leading(self, group_id: GroupId) -> GroupRuntime | None:
        """The group's runtime when this node's replica leads it, else None."""
        runtime = self._groups.get(group_id)
        return runtime if runtime is not None and runtime.core.role is Role.LEADER else None

    def local_leader(self, group_id: GroupId) -> int:
        """The leader this node's replica knows (0: none known, or no replica here)."""
        runtime = self._groups.get(group_id)
        return runtime.core.leader if runtime is not None else 0

    def status(self, group_id: GroupId) -> GroupStatus | None:
        """The group's status as the edge sees it (None: no replica here)."""
        runtime = self._groups.get(group_id)
        return runtime.status() if runtime is not None else None

    def statuses(self) -> list[GroupStatus]:
        """Every hosted group's status, in group order."""
        return [runtime.status() for _, runtime in sorted(self._groups.items())]

    def quiesced(self) -> int:
        return sum(1 for runtime in self._groups.values() if runtime.quiesced)
