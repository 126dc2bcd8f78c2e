"""A replica deleted, then created again at the same path: `Files.remove_tree`.

Goal: a decommission moves a replica off a node (its directory deleted), a
recommission lets the controller place a copy of the same group there again; the
new store at the same path must open empty and take appends, over the real files
and over the chaos write-behind double alike. The double keeps file names in
memory: deleted with `shutil.rmtree` beside it, its ghosts made every open of the
new copy fail with FileNotFoundError (the negative control below shows it).
"""

from __future__ import annotations

import os
import shutil

import pytest

from raftlog.messages import HardState
from raftlog.types import Index, Term
from storage.config import StoreConfig
from storage.files import make_private_dirs
from storage.segments import SegmentStore
from tests.storage.helpers import GROUP, SegmentHarness, data_entry

_CONFIG = StoreConfig(segment_bytes_max=4096)


def _fill(harness: SegmentHarness) -> str:
    """Synced segments, then an unsynced tail; the store closed. Its directory."""
    store = harness.store
    for first in range(1, 31, 5):
        store.append([data_entry(i, 1, count=3, value_bytes=50) for i in range(first, first + 5)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(20)))
    store.sync()
    store.append([data_entry(31, 1)])
    directory = os.path.join(harness.root, "groups", str(GROUP))
    assert len(harness.files.list_dir(directory)) > 1
    store.close()
    return directory


def _reopen(harness: SegmentHarness, directory: str) -> SegmentStore:
    make_private_dirs(directory)
    return SegmentStore(GROUP, directory, harness.db, harness.files, _CONFIG)


@pytest.mark.parametrize("durable_files", [True, False], ids=["write-behind", "os"])
def test_a_store_created_again_where_one_was_removed_starts_empty(tmp_path, durable_files: bool) -> None:
    harness = SegmentHarness(str(tmp_path), config=_CONFIG, durable_files=durable_files)
    directory = _fill(harness)
    harness.files.remove_tree(directory)
    assert not os.path.exists(directory)
    harness.files.remove_tree(directory)  # missing is fine
    store = _reopen(harness, directory)
    try:
        assert store.last_index() == 0
        store.append([data_entry(1, 2)])
        store.sync()
        assert store.last_index() == 1
    finally:
        store.close()
        harness.db.close()


def test_the_double_deleted_beside_its_back_finds_ghosts(tmp_path) -> None:
    # Negative control: what the runs met before `remove_tree`.
    harness = SegmentHarness(str(tmp_path), config=_CONFIG)
    directory = _fill(harness)
    shutil.rmtree(directory)
    make_private_dirs(directory)
    assert harness.files.list_dir(directory), "the double still names the deleted segments"
    with pytest.raises(FileNotFoundError):
        SegmentStore(GROUP, directory, harness.db, harness.files, _CONFIG)
    harness.db.close()
