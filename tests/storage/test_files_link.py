"""`Files.link`: a second name for a durable file (a closed segment kept by a mirror's resync).

Goal: over the real files and the chaos write-behind double alike, a link reads the same
bytes and survives the first name's deletion (its directory removed, as the old group's
is); in the double, the new name is durable only at `sync_dir` of its directory, as a
create is: a power failure before that (a new double, which sweeps what was not made
durable) leaves no name, after it the file; and only a durable file may be linked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.files import Files, OsFiles, make_private_dirs
from storage.write_behind import WriteBehindFiles


def _durable_file(files: Files, directory: Path) -> str:
    make_private_dirs(directory)
    path = str(directory / "a.seg")
    handle = files.create(path)
    files.append(handle, [b"closed segment bytes"])
    files.fsync(handle)
    files.close(handle)
    files.sync_dir(str(directory))
    return path


@pytest.mark.parametrize("double", [False, True])
def test_a_link_reads_the_same_bytes_and_outlives_the_first_name(tmp_path: Path, double: bool) -> None:
    files: Files = WriteBehindFiles(str(tmp_path)) if double else OsFiles()
    source = _durable_file(files, tmp_path / "old")
    make_private_dirs(tmp_path / "new")
    target = str(tmp_path / "new" / "a.seg.incoming")
    files.link(source, target)
    files.sync_dir(str(tmp_path / "new"))
    files.remove_tree(str(tmp_path / "old"))
    handle = files.open(target)
    assert files.read(handle, 0, 100) == b"closed segment bytes"
    files.close(handle)
    assert files.list_dir(str(tmp_path / "new")) == ["a.seg.incoming"]


def test_in_the_double_a_link_is_durable_at_the_sync_of_its_directory(tmp_path: Path) -> None:
    files = WriteBehindFiles(str(tmp_path))
    source = _durable_file(files, tmp_path / "old")
    make_private_dirs(tmp_path / "new")
    files.link(source, str(tmp_path / "new" / "lost"))
    assert files.exists(str(tmp_path / "new" / "lost"))
    WriteBehindFiles(str(tmp_path))  # a power failure: the name never reached the disk
    assert os.listdir(tmp_path / "new") == []
    files = WriteBehindFiles(str(tmp_path))
    files.link(source, str(tmp_path / "new" / "kept"))
    files.sync_dir(str(tmp_path / "new"))
    WriteBehindFiles(str(tmp_path))
    assert os.listdir(tmp_path / "new") == ["kept"]
    assert (tmp_path / "new" / "kept").read_bytes() == b"closed segment bytes"


def test_in_the_double_only_a_durable_file_is_linked(tmp_path: Path) -> None:
    files = WriteBehindFiles(str(tmp_path))
    source = _durable_file(files, tmp_path / "old")
    handle = files.open(source)
    files.append(handle, [b"unsynced"])
    files.close(handle)
    with pytest.raises(AssertionError):
        files.link(source, str(tmp_path / "old" / "b.seg"))
