"""`write_behind_until_fsync`: a `Files` double that loses what a power failure would.

Unsynced appends stay in this process's memory and reach the OS file only at
`fsync`; created, renamed and unlinked names reach the OS only at `sync_dir` of
their directory. So a real `kill -9` of a process using this double leaves on
disk exactly what a power failure at that instant could leave (the
conservative case: nothing unsynced survives). Reads see everything at once,
as the page cache would.

A file created and not yet made durable by `sync_dir` lives on the OS under a
hidden temporary name; a new instance sweeps those names away on start, which
is what losing the directory entry means.

Fault injection: `free_bytes` makes appends fail with ENOSPC once exhausted
(after writing the part that fit, as a real partial write does).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

from storage.files import (
    FILE_MODE,
    FileHandle,
    fsync_directory,
    fsync_later,
    make_private_dirs,
    write_all,
)

PENDING_PREFIX = ".wbpending-"


@dataclass(slots=True)
class _Node:
    """One file: OS bytes `[0, cut)` are visible, then `tail` (unsynced)."""

    os_path: str | None  # None once an unlink reached the OS
    os_size: int
    cut: int
    tail: bytearray = field(default_factory=bytearray)

    @property
    def size(self) -> int:
        return self.cut + len(self.tail)


@dataclass(slots=True)
class _DirOp:
    kind: str  # "link" | "rename" | "unlink"
    node: _Node
    target: str = ""


class WriteBehindFiles:
    def __init__(self, root: str) -> None:
        self.free_bytes: int | None = None
        # Logical namespace overlay: path -> node, or None when unlinked but not synced.
        self._names: dict[str, _Node | None] = {}
        self._pending_ops: dict[str, list[_DirOp]] = {}
        self._temporary_names = count()
        self._sweep(root)

    @staticmethod
    def _sweep(root: str) -> None:
        for directory, _, names in os.walk(root):
            for name in names:
                if name.startswith(PENDING_PREFIX):
                    os.unlink(os.path.join(directory, name))

    def _lookup(self, path: str) -> _Node | None:
        if path in self._names:
            return self._names[path]
        if not os.path.isfile(path):
            return None
        size = os.path.getsize(path)
        node = _Node(os_path=path, os_size=size, cut=size)
        self._names[path] = node
        return node

    def _record(self, path: str, op: _DirOp) -> None:
        self._pending_ops.setdefault(os.path.dirname(path), []).append(op)

    # -- files -------------------------------------------------------------------

    def create(self, path: str) -> FileHandle:
        assert self._lookup(path) is None, f"{path} exists"
        directory, name = os.path.split(path)
        temporary = os.path.join(directory, f"{PENDING_PREFIX}{next(self._temporary_names)}-{name}")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(temporary, flags, FILE_MODE)
        node = _Node(os_path=temporary, os_size=0, cut=0)
        self._names[path] = node
        self._record(path, _DirOp("link", node, path))
        return FileHandle(path=path, fd=fd, size=0, node=node)

    def open(self, path: str) -> FileHandle:
        node = self._lookup(path)
        if node is None or node.os_path is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        fd = os.open(node.os_path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        return FileHandle(path=path, fd=fd, size=node.size, node=node)

    def append(self, handle: FileHandle, buffers: Sequence[bytes | memoryview]) -> None:
        node = handle.node
        assert isinstance(node, _Node)
        data = b"".join(buffers)
        if self.free_bytes is not None and len(data) > self.free_bytes:
            fitting = self.free_bytes
            node.tail += data[:fitting]
            self.free_bytes = 0
            handle.size = node.size
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), handle.path)
        if self.free_bytes is not None:
            self.free_bytes -= len(data)
        node.tail += data
        handle.size = node.size

    def read(self, handle: FileHandle, position: int, size: int) -> bytes:
        node = handle.node
        assert isinstance(node, _Node)
        assert position >= 0 and size >= 0
        end = min(position + size, node.size)
        if position >= end:
            return b""
        parts = []
        if position < node.cut:
            parts.append(os.pread(handle.fd, min(end, node.cut) - position, position))
        if end > node.cut:
            parts.append(bytes(node.tail[max(position - node.cut, 0) : end - node.cut]))
        return b"".join(parts)

    def truncate(self, handle: FileHandle, size: int) -> None:
        node = handle.node
        assert isinstance(node, _Node)
        assert 0 <= size <= node.size, "truncate only shortens"
        if size >= node.cut:
            del node.tail[size - node.cut :]
        else:
            node.cut = size
            node.tail.clear()
        handle.size = size

    def fsync(self, handle: FileHandle) -> None:
        self.to_os(handle)
        os.fsync(handle.fd)

    def detached_fsync(self, handle: FileHandle) -> Callable[[], None]:
        """The unsynced tail reaches the OS file now (this thread owns it); only the
        fsync runs later. A kill -9 before that fsync keeps those bytes, which is still
        what a power failure may leave: the store acknowledges nothing before it ends."""
        self.to_os(handle)
        return fsync_later(handle.fd)

    def direct_appender(self, handle: FileHandle) -> None:
        """None: unsynced bytes stay in memory here, so every append goes through `append`."""
        return None

    def to_os(self, handle: FileHandle) -> None:
        node = handle.node
        assert isinstance(node, _Node)
        if node.cut < node.os_size:
            os.ftruncate(handle.fd, node.cut)
            node.os_size = node.cut
        if node.tail:
            # A copy: if the write fails (ENOSPC), its traceback keeps views of what it was
            # given, and views of `tail` itself would forbid every later append to it.
            try:
                write_all(handle.fd, [bytes(node.tail)])
            except OSError:
                # Part of the tail may have reached the file: cut it, or the retry
                # appends after it and the file holds garbage in the middle.
                os.ftruncate(handle.fd, node.os_size)
                raise
            node.os_size += len(node.tail)
            node.cut = node.os_size
            node.tail = bytearray()

    def close(self, handle: FileHandle) -> None:
        # The node (and its unsynced tail) outlives the handle, as the page cache would.
        os.close(handle.fd)
        handle.fd = -1

    # -- directories -------------------------------------------------------------

    def list_dir(self, directory: str) -> list[str]:
        names = {n for n in os.listdir(directory) if not n.startswith(PENDING_PREFIX)}
        for path, node in self._names.items():
            parent, name = os.path.split(path)
            if parent != directory:
                continue
            if node is None:
                names.discard(name)
            else:
                names.add(name)
        return sorted(names)

    def exists(self, path: str) -> bool:
        if path in self._names:
            return self._names[path] is not None
        return os.path.exists(path)

    def rename(self, source: str, target: str) -> None:
        assert os.path.dirname(source) == os.path.dirname(target), "renames stay in one directory"
        node = self._lookup(source)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", source)
        self._names[source] = None
        self._names[target] = node
        self._record(target, _DirOp("rename", node, target))

    def link(self, source: str, target: str) -> None:
        """The OS link is made at once under a hidden name, renamed to `target` at `sync_dir`
        (as a create is). `source` must be durable: a link shares its OS bytes only."""
        node = self._lookup(source)
        if node is None or node.os_path is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", source)
        assert not node.tail and node.cut == node.os_size, "only a durable file is linked"
        assert self._lookup(target) is None, f"{target} exists"
        directory, name = os.path.split(target)
        temporary = os.path.join(directory, f"{PENDING_PREFIX}{next(self._temporary_names)}-{name}")
        os.link(node.os_path, temporary)
        linked = _Node(os_path=temporary, os_size=node.os_size, cut=node.os_size)
        self._names[target] = linked
        self._record(target, _DirOp("link", linked, target))

    def unlink(self, path: str) -> None:
        node = self._lookup(path)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        self._names[path] = None
        self._record(path, _DirOp("unlink", node))

    def sync_dir(self, directory: str) -> None:
        """Make the directory's pending creates, renames and unlinks reach the OS, in order."""
        for op in self._pending_ops.pop(directory, []):
            assert op.node.os_path is not None, "an unlinked file has no name to change"
            if op.kind == "unlink":
                os.unlink(op.node.os_path)
                op.node.os_path = None
            else:
                os.rename(op.node.os_path, op.target)
                op.node.os_path = op.target
        fsync_directory(directory)

    def remove_tree(self, directory: str) -> None:
        """Forget every name under `directory` (and its pending directory operations), then
        delete it on the OS at once: a deletion is taken as durable when made, as before
        this method existed. Forgetting is the point: a replica deleted, then created
        again at the same path (moved away by a decommission, back after a recommission),
        found its old segment names here, pointing at deleted files, and every open of
        the new copy failed with FileNotFoundError (chaos run, seed 1, `--nodes 5
        --faults move,kill,pause`)."""
        root = os.path.join(directory, "")
        for path in [p for p in self._names if p.startswith(root)]:
            del self._names[path]
        for parent in [d for d in self._pending_ops if d == directory or d.startswith(root)]:
            del self._pending_ops[parent]
        shutil.rmtree(directory, ignore_errors=True)

    def make_dirs(self, directory: str) -> None:
        """Directories are made durable at once (a simplification: the store never
        relies on a new directory's entry before its first segment's `sync_dir`)."""
        make_private_dirs(directory)
