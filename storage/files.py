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
- Data is durable only after `fsync(handle)`; a created, renamed or unlinked
  name is durable only after `sync_dir` of its directory.
- Files are created readable by their owner only (`FILE_MODE`), directories
  likewise (`DIRECTORY_MODE`): a log holds users' records (docs/node.md
  "Secrets and files").
"""

from __future__ import annotations

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
