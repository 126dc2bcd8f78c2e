"""The groups a node hosts: one place owns the runtime, store and state machine of each.

`GroupRegistry` is the only writer of the three tables (multiraft/node/replicas.py
adds and removes through it); everyone else reads them through read-only views.
A partition group has all three; the metadata group has no `PartitionMachine`.

Beside them it keeps, incrementally, what the node's periodic work would otherwise
find by walking every group (issue 26: each walk cost 2-26 % of an idle node at
2,000 quiet groups, and grows with the groups):
- `awake`: the groups that are not quiesced, the only ones the ticker ticks. A
  `TrackedRuntime` reports each change of its `quiesced` flag here;
- `led`: the groups this node's replica leads, with their term, kept from role
  changes, for the leaders list the pings carry; `led_version` counts its changes
  (and every add and remove), for caches of what is derived from it;
- `with_captures`: groups holding captured states for retention (compaction.py),
  the only ones a compaction pass looks at.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from multiraft.runtime.group import GroupRuntime
from raftlog.messages import Role
from raftlog.types import GroupId

if TYPE_CHECKING:
    from multiraft.node.machines import PartitionMachine
    from multiraft.runtime.group import GroupDeps, GroupStatus
    from storage.segments import SegmentStore

METADATA_GROUP = GroupId(0)


class TrackedRuntime(GroupRuntime):
    """A `GroupRuntime` whose quiet/awake changes its registry sees as they happen.

    The runtime flips `quiesced` in many places (a message, a proposal, a quiesce
    request, a hold, `sleep_again`); a property here sees them all, so the registry's
    set of awake groups is never stale and the ticker needs no pass over quiet ones.
    (A callback in `GroupDeps` would say the same from inside the runtime.)"""

    def __init__(self, registry: GroupRegistry, group_id: GroupId, core: Any, store: Any, machine: Any,
                 deps: GroupDeps) -> None:
        self._registry = registry
        self._quiet = False  # the runtime's constructor sets `quiesced` to False: no change
        super().__init__(group_id, core, store, machine, deps)

    @property  # type: ignore[override]
    def quiesced(self) -> bool:
        return self._quiet

    @quiesced.setter
    def quiesced(self, quiet: bool) -> None:
        if quiet != self._quiet:
            self._quiet = quiet
            self._registry.note_quiet(self, quiet)


class GroupRegistry:
    def __init__(self) -> None:
        self._groups: dict[GroupId, GroupRuntime] = {}
        self._stores: dict[GroupId, SegmentStore] = {}
        self._partitions: dict[GroupId, PartitionMachine] = {}
        self._awake: dict[GroupId, GroupRuntime] = {}
        self._led: dict[GroupId, int] = {}
        # Read-only views of the live tables (they follow every add and remove).
        self.groups: Mapping[GroupId, GroupRuntime] = MappingProxyType(self._groups)
        self.stores: Mapping[GroupId, SegmentStore] = MappingProxyType(self._stores)
        self.partitions: Mapping[GroupId, PartitionMachine] = MappingProxyType(self._partitions)
        self.awake: Mapping[GroupId, GroupRuntime] = MappingProxyType(self._awake)
        self.led: Mapping[GroupId, int] = MappingProxyType(self._led)  # group -> term led in
        self.led_version = 0
        self.with_captures: set[GroupId] = set()  # written by compaction.Boundaries

    def add(self, group_id: GroupId, runtime: GroupRuntime, store: SegmentStore,
            machine: PartitionMachine | None) -> None:
        assert group_id not in self._groups, f"group {group_id} is open already"
        self._groups[group_id] = runtime
        self._stores[group_id] = store
        if machine is not None:
            self._partitions[group_id] = machine
        if not runtime.quiesced:
            self._awake[group_id] = runtime
        if runtime.core.role is Role.LEADER:
            self._led[group_id] = runtime.core.term
        self.led_version += 1

    def remove(self, group_id: GroupId) -> tuple[GroupRuntime, SegmentStore, PartitionMachine | None]:
        self._awake.pop(group_id, None)
        self._led.pop(group_id, None)
        self.with_captures.discard(group_id)
        self.led_version += 1
        return self._groups.pop(group_id), self._stores.pop(group_id), self._partitions.pop(group_id, None)

    def clear(self) -> None:
        self._groups.clear()
        self._stores.clear()
        self._partitions.clear()
        self._awake.clear()
        self._led.clear()
        self.with_captures.clear()
        self.led_version += 1

    def note_quiet(self, runtime: GroupRuntime, quiet: bool) -> None:
        """`runtime` went quiet or woke (a runtime not, or no longer, registered is ignored:
        a hold's release timer may fire after its group closed)."""
        group_id = runtime.group_id
        if self._groups.get(group_id) is not runtime:
            return
        if quiet:
            self._awake.pop(group_id, None)
        else:
            self._awake[group_id] = runtime

    def note_role(self, group_id: GroupId, role: Role, term: int) -> None:
        """This node's replica of `group_id` changed role (GroupRuntime's on_role_change)."""
        if group_id not in self._groups:
            return
        if role is Role.LEADER:
            self._led[group_id] = term
        elif self._led.pop(group_id, None) is None:
            return
        self.led_version += 1

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
        return len(self._groups) - len(self._awake)
