"""The node's current catalog (and the consumer groups beside it), and the signal that it changed.

Group 0's state machine replaces or updates the catalog as it applies (a snapshot
restores a new one, a reopened metadata group starts from an empty one); every
other service reads `holder.catalog` at the moment it needs it, never a copy kept
from before, and the reconciler waits on `changed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from multiraft.consumer_groups import GroupsState
from multiraft.errors import UnknownTopic
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.features import SUPPORTED_LEVEL
from raftlog.types import GroupId


class CatalogHolder:
    def __init__(self, new_groups: Callable[[], GroupsState] = GroupsState,
                 supported_level: int = SUPPORTED_LEVEL) -> None:
        """`new_groups`: the consumer group state's class (a chaos control's, multiraft/node/faults.py);
        `supported_level`: the feature level this node reads (its build's; less for a test)."""
        self.catalog = Catalog()
        self.supported_level = supported_level
        self._new_groups = new_groups
        # Group 0 applies consumer group commands beside the catalog (multiraft/node/machines.py).
        self.groups = new_groups()
        # The log index of the last catalog command applied (or of the snapshot restored):
        # the version of the topics the groups' pattern matches are kept for.
        self.topics_index = 0
        self._changed = asyncio.Event()

    def replace(self, catalog: Catalog, groups: GroupsState | None = None) -> None:
        self.catalog = catalog
        self.groups = self._new_groups()
        if groups is not None:  # a restored snapshot's groups, in the state this node runs
            self.groups.groups = groups.groups
        self.topics_index = int(catalog.applied_index)
        self.changed()

    @property
    def readable(self) -> bool:
        """Whether this node's build reads every catalog command and snapshot field the cluster
        may now hold: false once the catalog is finalized above the level it supports (it was
        downgraded, or joined with an older build), when what it decoded may miss what it does
        not know (multiraft/node/features.py)."""
        return self.catalog.feature_level <= self.supported_level

    def changed(self) -> None:
        self._changed.set()

    async def wait_changed(self) -> None:
        """Return once the catalog changed since the last return (or ever, the first time)."""
        await self._changed.wait()
        self._changed.clear()

    def partition_group(self, topic: str, partition: int) -> GroupId:
        info = self.catalog.topic(topic)
        if not 0 <= partition < len(info.partitions):
            raise UnknownTopic(f"topic {topic!r} has no partition {partition}")
        return info.partitions[partition].group_id
