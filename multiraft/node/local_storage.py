"""A node's local storage: the state database, the cross-group flusher, the segment files.

Opened when the node starts, closed last when it stops (after its groups), so every
group's store and runtime is built over the same three pieces (and one budget for the
entries the stores keep in memory, storage/entry_cache.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multiraft.runtime.flusher import Flusher
from raftlog.storage import StorageError
from raftlog.types import GroupId
from storage.entry_cache import ENTRY_CACHE_BYTES_DEFAULT, EntryCacheBudget
from storage.files import Files, make_private_dirs
from storage.state_db import StateDatabase

if TYPE_CHECKING:
    from multiraft.node.faults import Faults
    from multiraft.runtime.histograms import NodeLatencies
    from storage.segments import SegmentStore


class LocalStorage:
    def __init__(self, data_dir: Path, faults: Faults, latencies: NodeLatencies, logger: Any,
                 entry_cache_bytes: int = ENTRY_CACHE_BYTES_DEFAULT) -> None:
        self.groups_directory = data_dir / "groups"
        self._database_path = data_dir / "state.db"
        self._faults = faults
        self._latencies = latencies
        self._logger = logger
        self.files: Files | None = None
        self.db: StateDatabase | None = None
        self.flusher: Flusher | None = None
        # Shared by every store of the node: one budget for their cached entries.
        self.entry_cache = EntryCacheBudget(entry_cache_bytes)

    def open(self) -> None:
        make_private_dirs(self.groups_directory)  # 0700, as every directory the node makes
        self.files = self._faults.files(str(self.groups_directory))
        self.db = StateDatabase(str(self._database_path))
        self.flusher = Flusher(self.db, self._logger)
        self.flusher.latency = self._latencies.fsync

    async def close(self, stores: Mapping[GroupId, SegmentStore]) -> None:
        """Sync and close `stores` (the groups are stopped), then the database."""
        if self.flusher is not None:
            await self.flusher.close()  # fsyncs under way finish before their files close
        for group_id, store in stores.items():
            try:
                store.sync()
            except (OSError, StorageError) as error:  # what it could not sync, a crash loses too
                self._logger.error("group_sync_failed_at_stop", group_id=group_id, error=repr(error))
            store.close()
        if self.db is not None:
            self.db.close()
            self.db = None
