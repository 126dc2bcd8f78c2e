"""Goal: what the store writes is its owner's alone, whatever the umask lets through:
segment files 0600 and every directory it makes 0700 (docs/node.md "Secrets and
files"), through both the real files and the chaos runner's write-behind double,
and a received segment (transfer) as well."""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.types import Index, Offset
from storage.segment import segment_name
from storage.transfer import SegmentDescriptor, install_segment
from tests.storage.helpers import SegmentHarness, entries


@pytest.fixture(autouse=True)
def _permissive_umask() -> Iterator[None]:
    """The commonest umask (022) would let group and others read what a 0644 default makes."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("durable_files", [False, True], ids=["os-files", "write-behind"])
def test_segments_are_0600_and_directories_0700(tmp_path: Path, durable_files: bool) -> None:
    root = tmp_path / "data" / "node1"  # none of it exists yet
    harness = SegmentHarness(str(root), durable_files=durable_files)
    harness.store.append(entries(1, 20))
    assert harness.store.sync().durable_index == 19
    harness.close()

    groups = root / "groups"
    segments = sorted((groups / "7").iterdir())
    assert segments, "the store wrote a segment"
    assert {p.name: _mode(p) for p in segments} == {p.name: 0o600 for p in segments}
    for directory in (tmp_path / "data", root, groups, groups / "7", root / "state"):
        assert _mode(directory) == 0o700, directory


def test_a_received_segment_is_0600(tmp_path: Path) -> None:
    harness = SegmentHarness(str(tmp_path), durable_files=False)
    chunk = b"x" * 100
    descriptor = SegmentDescriptor(first_index=Index(1), last_index=Index(1), size_bytes=len(chunk),
                                   crc=zlib.crc32(chunk), first_offset=Offset(0), next_offset=Offset(1))
    path = install_segment(harness.files, str(tmp_path), descriptor, [chunk])
    harness.close()
    assert Path(path).name == segment_name(Index(1)) and _mode(Path(path)) == 0o600
