"""storage/files.py DirectAppender: appends past the page cache, with the file's bytes and
size exactly those of plain appends.

Goal: whatever the buffers (page-aligned or not) and lengths (whole pages or not), the
file ends as plain appends would leave it: the aligned part of an append at an aligned
position goes by O_DIRECT, the rest through the handle; an unaligned buffer (EINVAL)
turns it into plain appends without losing a byte; the double (write_behind.py) has none.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

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
