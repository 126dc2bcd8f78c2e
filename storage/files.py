"""The one interface every storage file operation goes through.

Why an interface: a power failure loses whatever the OS had not fsynced, and
directory entries not yet made durable by a directory fsync. A real `kill -9`
loses nothing the OS holds. `storage.write_behind.WriteBehindFiles` keeps
unsynced bytes and directory changes in process memory, so that killing a
process that uses it loses exactly what a power failure would (CHAOS.md 3.3,
4A). `OsFiles` is the real implementation; the segment store cannot tell them
apart.

Contract of both implementations:
- `append` writes at the file's end. It may raise `OSError` after writing part
  of the buffers (ENOSPC); the caller truncates back to the old size.
- Reads see every write at once, synced or not.
- One thread at a time per handle, any thread: appends to a file no other thread
  touches meanwhile (a received segment, multiraft/node/catchup_follower.py) may run off
  the event loop (the double's `free_bytes` fault injection is then only approximate).
- Data is durable only after `fsync(handle)`; a created, renamed or unlinked
  name is durable only after `sync_dir` of its directory.
- Files are created readable by their owner only (`FILE_MODE`), directories
  likewise (`DIRECTORY_MODE`): a log holds users' records (docs/node.md
  "Secrets and files").
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# Linux caps a writev call at IOV_MAX (1024) buffers.
_IOV_MAX = 1024
# The owner's alone, set at creation (never a chmod after: no window where others may read).
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


@dataclass(slots=True)
class FileHandle:
    """An open file. `size` is the logical size the reader sees (synced or not)."""

    path: str
    fd: int
    size: int
    node: object = None  # implementation detail of the write-behind double


class Files(Protocol):
    def create(self, path: str) -> FileHandle: ...

    def open(self, path: str) -> FileHandle: ...

    def append(self, handle: FileHandle, buffers: Sequence[bytes | memoryview]) -> None: ...

    def read(self, handle: FileHandle, position: int, size: int) -> bytes: ...

    def truncate(self, handle: FileHandle, size: int) -> None: ...

    def fsync(self, handle: FileHandle) -> None: ...

    def to_os(self, handle: FileHandle) -> None:
        """What was appended reaches the OS file now (only the write-behind double holds
        appends back; the real thing wrote them already). May fail like a write."""
        ...

    def detached_fsync(self, handle: FileHandle) -> Callable[[], None]:
        """An fsync of `handle` to run later, on another thread; closing the handle
        meanwhile is harmless. Writes made after this call are not covered."""
        ...

    def direct_appender(self, handle: FileHandle) -> DirectAppender | None:
        """Appends to `handle` that bypass the page cache, for a file written once and
        read rarely soon after (a received segment); None where there are none (then
        `append`). Durable only after `fsync`, as any append."""
        ...

    def close(self, handle: FileHandle) -> None: ...

    def list_dir(self, directory: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def rename(self, source: str, target: str) -> None: ...

    def link(self, source: str, target: str) -> None:
        """A second name for an existing file whose bytes are durable and will not change
        (a closed segment); durable after `sync_dir` of the target's directory."""
        ...

    def unlink(self, path: str) -> None: ...

    def sync_dir(self, directory: str) -> None: ...

    def make_dirs(self, directory: str) -> None: ...

    def remove_tree(self, directory: str) -> None:
        """Delete `directory` and everything in it (a replica deleted); missing is fine.
        Through `Files`, not `shutil` beside it: a double that keeps names in memory
        must forget them, or a copy created later at the same path finds ghosts."""
        ...


def fsync_later(fd: int) -> Callable[[], None]:
    """An fsync of `fd`'s file to run later, on any thread. It holds a duplicate
    descriptor: the original may be closed (segment dropped, group closed) and its
    number reused before the fsync runs; the duplicate still names the same file."""
    duplicate = os.dup(fd)

    def fsync() -> None:
        try:
            os.fsync(duplicate)
        finally:
            os.close(duplicate)

    return fsync


def write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> int:
    """Write every buffer with as few `writev` calls as the kernel allows.

    Returns the number of bytes written. An `OSError` leaves a partial write on
    disk: callers truncate back.
    """
    total = 0
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        chunk = pending[:_IOV_MAX]
        written = os.writev(fd, chunk)
        total += written
        # Drop fully written buffers, keep the rest of a partly written one.
        consumed = 0
        while consumed < len(chunk) and written >= len(chunk[consumed]):
            written -= len(chunk[consumed])
            consumed += 1
        pending = pending[consumed:]
        if written:
            pending[0] = pending[0][written:]
    return total


DIRECT_ALIGNMENT = 4096  # O_DIRECT's: buffer address, file position and length (a page)


class DirectAppender:
    """Appends through a second descriptor opened with O_DIRECT: the bytes go from the
    caller's buffer to the device, not through the page cache.

    Why: a follower receiving a gigabyte of segment files (far-horizon catch-up) wrote
    them into the page cache, which had to find a gigabyte of fresh pages first; on this
    project's VMs a page the guest freed a while ago goes back to the host (virtio-balloon
    free page reporting), and getting it again costs more than the copy: 2.2-3.0 s per GiB
    buffered and fsynced against 0.6 s direct (docs/node.md, far-horizon catch-up).

    O_DIRECT wants the buffer's address, the file position and the length aligned
    (DIRECT_ALIGNMENT): the aligned part of an append at an aligned position goes
    direct, the rest (a file's last partial page) through the handle as usual, and every
    append after it too. A buffer that is not page-aligned (EINVAL: use `mmap` buffers),
    or a file system without O_DIRECT (tmpfs), turns it into plain appends. Either way
    the handle's size is kept, and `fsync` of the handle makes all of it durable.
    Any thread, one at a time; `close` it before the handle."""

    def __init__(self, files: Files, handle: FileHandle) -> None:
        self._files = files
        self._handle = handle
        self._fd = -1
        direct = getattr(os, "O_DIRECT", 0)  # Linux's; elsewhere plain appends
        if direct:
            with contextlib.suppress(OSError):  # EINVAL: a file system without it
                self._fd = os.open(handle.path, os.O_WRONLY | os.O_CLOEXEC | direct)

    def append(self, buffer: memoryview) -> None:
        handle = self._handle
        aligned = len(buffer) - len(buffer) % DIRECT_ALIGNMENT
        if self._fd != -1 and aligned and handle.size % DIRECT_ALIGNMENT == 0:
            try:
                written = os.pwrite(self._fd, buffer[:aligned], handle.size)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    handle.size = os.fstat(handle.fd).st_size  # a partial write moved the end
                    raise
                self.close()  # not aligned after all: plain appends from here
                written = 0
            handle.size += written
            buffer = buffer[written:]
        if len(buffer):
            self._files.append(handle, [buffer])

    def close(self) -> None:
        if self._fd != -1:
            os.close(self._fd)
            self._fd = -1


class OsFiles:
    """The real thing: `O_APPEND` writes, `pread` reads, explicit fsyncs."""

    def create(self, path: str) -> FileHandle:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        return FileHandle(path=path, fd=os.open(path, flags, FILE_MODE), size=0)

    def open(self, path: str) -> FileHandle:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        return FileHandle(path=path, fd=fd, size=os.fstat(fd).st_size)

    def append(self, handle: FileHandle, buffers: Sequence[bytes | memoryview]) -> None:
        try:
            handle.size += write_all(handle.fd, buffers)
        except OSError:
            # Re-read the size: a partial write moved the end.
            handle.size = os.fstat(handle.fd).st_size
            raise

    def read(self, handle: FileHandle, position: int, size: int) -> bytes:
        assert position >= 0 and size >= 0
        return os.pread(handle.fd, size, position)

    def truncate(self, handle: FileHandle, size: int) -> None:
        assert 0 <= size <= handle.size, "truncate only shortens"
        os.ftruncate(handle.fd, size)
        handle.size = size

    def fsync(self, handle: FileHandle) -> None:
        os.fsync(handle.fd)

    def to_os(self, handle: FileHandle) -> None:
        pass  # O_APPEND writes went to the OS as they were made

    def detached_fsync(self, handle: FileHandle) -> Callable[[], None]:
        return fsync_later(handle.fd)

    def direct_appender(self, handle: FileHandle) -> DirectAppender | None:
        return DirectAppender(self, handle)

    def close(self, handle: FileHandle) -> None:
        os.close(handle.fd)
        handle.fd = -1

    def list_dir(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def link(self, source: str, target: str) -> None:
        os.link(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def sync_dir(self, directory: str) -> None:
        fsync_directory(directory)

    def remove_tree(self, directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)

    def make_dirs(self, directory: str) -> None:
        """Create `directory` and its parents (each `DIRECTORY_MODE`), making each new name durable."""
        for path in _missing_directories(directory):
            os.mkdir(path, DIRECTORY_MODE)
            self.sync_dir(os.path.dirname(path))


def _missing_directories(directory: str) -> list[str]:
    """The components of `directory` that do not exist yet, outermost first."""
    missing: list[str] = []
    current = os.path.abspath(directory)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    return missing[::-1]


def make_private_dirs(directory: str | os.PathLike[str]) -> None:
    """`mkdir -p` whose every new directory is `DIRECTORY_MODE` (`os.makedirs` gives its
    mode to the last one only). Directories that exist keep their modes. No directory
    fsync: for names that need not survive a power failure (the store syncs its own)."""
    for path in _missing_directories(os.fspath(directory)):
        try:
            os.mkdir(path, DIRECTORY_MODE)
        except FileExistsError:  # made meanwhile (another node's start, a racing group)
            if not os.path.isdir(path):
                raise


def fsync_directory(directory: str) -> None:
    """Make the names in `directory` (created, renamed, unlinked files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
