"""storage/files.py DirectAppender: appends past the page cache, with the file's bytes and
size exactly those of plain appends.

Goal: whatever the buffers (page-aligned or not) and lengths (whole pages or not), the
file ends as plain appends would leave it: the aligned part of an append at an aligned
position goes by O_DIRECT, the rest through the handle; an unaligned buffer (EINVAL)
turns it into plain appends without losing a byte; the double (write_behind.py) has none.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

import pytest

from storage.files import DIRECT_ALIGNMENT, OsFiles
from storage.write_behind import WriteBehindFiles


def _aligned(data: bytes) -> memoryview:
    buffer = mmap.mmap(-1, len(data) + DIRECT_ALIGNMENT)
    buffer[:len(data)] = data
    return memoryview(buffer)[:len(data)]


def test_pages_go_direct_and_the_tail_through_the_handle(tmp_path: Path) -> None:
    files = OsFiles()
    handle = files.create(str(tmp_path / "segment"))
    appender = files.direct_appender(handle)
    assert appender is not None
    pieces = [os.urandom(4 * DIRECT_ALIGNMENT), os.urandom(3 * DIRECT_ALIGNMENT + 100), os.urandom(5000)]
    for piece in pieces:
        appender.append(_aligned(piece))
    appender.close()
    files.fsync(handle)
    assert handle.size == sum(map(len, pieces))
    files.close(handle)
    assert (tmp_path / "segment").read_bytes() == b"".join(pieces)


def test_an_unaligned_buffer_falls_back_to_plain_appends(tmp_path: Path) -> None:
    files = OsFiles()
    handle = files.create(str(tmp_path / "segment"))
    appender = files.direct_appender(handle)
    assert appender is not None
    data = os.urandom(2 * DIRECT_ALIGNMENT + 1)
    unaligned = memoryview(mmap.mmap(-1, len(data) + 1))[1:]  # one byte past a page: EINVAL
    unaligned[:] = data
    appender.append(unaligned[:2 * DIRECT_ALIGNMENT])
    appender.append(_aligned(data[2 * DIRECT_ALIGNMENT:]))
    appender.close()
    assert handle.size == len(data)
    files.close(handle)
    assert (tmp_path / "segment").read_bytes() == data


def test_the_write_behind_double_has_none(tmp_path: Path) -> None:
    files = WriteBehindFiles(str(tmp_path))
    handle = files.create(str(tmp_path / "segment"))
    assert files.direct_appender(handle) is None
    files.close(handle)


def _direct_supported(directory: Path) -> bool:
    """Whether `directory`'s file system takes an aligned O_DIRECT write (not tmpfs)."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return False
    probe = directory / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | direct, 0o600)
    except OSError:
        return False
    try:
        os.pwrite(fd, _aligned(b"x" * DIRECT_ALIGNMENT), 0)
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()
    return True


def test_o_direct_is_used_where_the_file_system_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: the appender's pages really go by an O_DIRECT descriptor (not a silent fallback
    # to plain appends) wherever the file system supports it; skipped where it does not.
    if not _direct_supported(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    files = OsFiles()
    handle = files.create(str(tmp_path / "segment"))
    appender = files.direct_appender(handle)
    assert appender is not None and appender._fd != -1
    assert fcntl.fcntl(appender._fd, fcntl.F_GETFL) & os.O_DIRECT
    direct_writes: list[int] = []
    real_pwrite = os.pwrite

    def counting(fd: int, data: memoryview, position: int) -> int:
        if fd == appender._fd:
            direct_writes.append(len(data))
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", counting)
    data = os.urandom(8 * DIRECT_ALIGNMENT + 10)
    appender.append(_aligned(data))
    assert direct_writes == [8 * DIRECT_ALIGNMENT] and appender._fd != -1, "the pages went direct"
    appender.close()
    files.fsync(handle)
    files.close(handle)
    assert (tmp_path / "segment").read_bytes() == data
