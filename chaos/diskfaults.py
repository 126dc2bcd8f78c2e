"""Disk faults: a full disk on a node's own tmpfs, and a damaged log tail on a stopped node.

Disk full: each node's data directory is the mount point of a small tmpfs in
the runner's private mount namespace; `fill` writes a ballast file until the
kernel answers ENOSPC and keeps it, `free` deletes it. tmpfs is RAM: keep the
sizes small. Expected: produce requests fail cleanly, never acknowledged, and
the node recovers once space returns.

Tail corruption (`corrupt_tail`) works on a stopped node's files: it picks one
group at random, takes that group's newest segment, the tail of its log, and
cuts it inside a frame, appends garbage, or flips one bit near its end.
Expected: the node finds the damage by CRC, truncates to its last valid frame
and catches up from its peers; it never votes or leads on suspect state.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from chaos.namespace import FaultError, require_namespace, run_command
from storage.batch import HEADER_BYTES as BATCH_HEADER_BYTES
from storage.frames import FRAME_HEADER_BYTES
from storage.segment import parse_segment_name

BALLAST_NAME = ".chaos-ballast"
TMPFS_BYTES_MIN = 1 << 20
TMPFS_BYTES_MAX = 2 << 30  # RAM-backed: a few nodes at this size already cost gigabytes
_FILL_CHUNK_BYTES = (1 << 20, 4096)  # large writes, then page-sized ones for the last pages
_FILL_WRITES_MAX = TMPFS_BYTES_MAX // 4096 + 1024

CorruptMode = Literal["truncate", "garbage", "bitflip"]
CORRUPT_MODES: tuple[CorruptMode, ...] = ("truncate", "garbage", "bitflip")
BITFLIP_WINDOW_BYTES = 4096
GARBAGE_BYTES_MAX = 4096
_LENGTH = struct.Struct(">I")  # a frame's first field: its bytes after this field


class Disk:
    """Per-node tmpfs mounts and their ballast. `fill` and `free` accept only mounts made here."""

    def __init__(self) -> None:
        self._mounts: dict[Path, int] = {}  # mount point -> size in bytes

    def mount_tmpfs(self, path: str | os.PathLike[str], size_bytes: int) -> None:
        """Mount a fresh tmpfs of `size_bytes` on the existing, empty directory `path`."""
        require_namespace()
        mount_point = Path(path).resolve()
        if not TMPFS_BYTES_MIN <= size_bytes <= TMPFS_BYTES_MAX:
            raise ValueError(f"tmpfs size {size_bytes} outside [{TMPFS_BYTES_MIN}, {TMPFS_BYTES_MAX}]")
        if mount_point in self._mounts:
            raise FaultError(f"{mount_point} is already a chaos tmpfs")
        if not mount_point.is_dir():
            raise FaultError(f"{mount_point} is not a directory")
        if any(mount_point.iterdir()):
            # Mounting over files would hide them from the node: a silent data loss, not a fault.
            raise FaultError(f"{mount_point} is not empty; mount before the node writes")
        run_command(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(mount_point)])
        self._mounts[mount_point] = size_bytes

    def unmount(self, path: str | os.PathLike[str]) -> None:
        require_namespace()
        mount_point = self._mount_of(path)
        run_command(["umount", str(mount_point)])
        del self._mounts[mount_point]

    def mounts(self) -> list[str]:
        return [str(path) for path in sorted(self._mounts)]

    def fill(self, path: str | os.PathLike[str]) -> int:
        """Grow the ballast file until ENOSPC and keep it; returns the bytes this call wrote."""
        require_namespace()
        ballast = self._mount_of(path) / BALLAST_NAME
        descriptor = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        written = 0
        try:
            for chunk_bytes in _FILL_CHUNK_BYTES:
                chunk = bytes(chunk_bytes)
                for _ in range(_FILL_WRITES_MAX):
                    try:
                        written += os.write(descriptor, chunk)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        break
                else:
                    raise FaultError(f"{ballast}: no ENOSPC after {_FILL_WRITES_MAX} writes")
        finally:
            os.close(descriptor)
        return written

    def free(self, path: str | os.PathLike[str]) -> int:
        """Delete the ballast (a no-op without one); returns the bytes freed."""
        require_namespace()
        ballast = self._mount_of(path) / BALLAST_NAME
        try:
            size = ballast.lstat().st_size
            ballast.unlink()
        except FileNotFoundError:
            return 0
        return size

    def _mount_of(self, path: str | os.PathLike[str]) -> Path:
        mount_point = Path(path).resolve()
        if mount_point not in self._mounts:
            raise FaultError(f"{mount_point} is not a tmpfs mounted by this Disk: refusing to fill it")
        return mount_point


@dataclass(frozen=True, slots=True)
class Corruption:
    """What `corrupt_tail` did; `str()` is the line for the report."""

    mode: CorruptMode
    path: str  # the damaged segment file
    size_before: int
    size_after: int
    position: int  # truncate: the new end; garbage: where it starts; bitflip: the byte
    detail: str

    def __str__(self) -> str:
        return f"{self.mode} {self.path}: {self.detail}"


class NothingToCorrupt(LookupError):
    """The data directory holds no segment to damage (a node that never wrote)."""


def corrupt_tail(data_dir: str | os.PathLike[str], mode: CorruptMode, rng: random.Random,
                 spare_groups: frozenset[str] = frozenset()) -> Corruption:
    """Damage the newest segment of a random group under `<data_dir>/groups/*/`, except
    the groups named in `spare_groups` (directory names).

    The node must be stopped. Touches exactly one regular file inside `data_dir`
    (symbolic links are never followed). Raises `NothingToCorrupt` when no group
    has a segment to damage.
    """
    if mode not in CORRUPT_MODES:
        raise ValueError(f"unknown corruption mode {mode!r}; one of {CORRUPT_MODES}")
    root = Path(data_dir).resolve()
    candidates = [path for path in _newest_segments(root, need_bytes=mode != "garbage")
                  if path.parent.name not in spare_groups]
    if not candidates:
        raise NothingToCorrupt(f"no segment to {mode} under {root / 'groups'}")
    segment = candidates[rng.randrange(len(candidates))]
    if mode == "truncate":
        return _truncate(segment, rng)
    if mode == "garbage":
        return _append_garbage(segment, rng)
    return _flip_bit(segment, rng)


def _newest_segments(root: Path, need_bytes: bool) -> list[Path]:
    """Per group, its newest segment file (highest first index); groups in name order."""
    groups = root / "groups"
    if not groups.is_dir() or groups.is_symlink():
        return []
    newest: list[Path] = []
    for group in sorted(groups.iterdir()):
        if group.is_symlink() or not group.is_dir():
            continue
        segments = []
        for entry in group.iterdir():
            first_index = parse_segment_name(entry.name)
            if first_index is not None and stat.S_ISREG(entry.lstat().st_mode):
                segments.append((first_index, entry))
        if not segments:
            continue
        _, path = max(segments)
        if need_bytes and path.lstat().st_size == 0:
            continue  # a freshly rolled, empty segment: its log tail has no bytes to damage
        if not path.resolve().is_relative_to(root):
            raise FaultError(f"{path} resolves outside {root}: refusing to touch it")
        newest.append(path)
    return newest


def _open(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _truncate(path: Path, rng: random.Random) -> Corruption:
    size = path.lstat().st_size
    start, end = _last_frame(path, size)
    if end > start + 1:
        cut = rng.randrange(start + 1, end)
        where = f"inside the frame at [{start}, {end})"
    else:
        cut = rng.randrange(1, size) if size > 1 else 0
        where = "no whole frame found; cut at random"
    descriptor = _open(path, os.O_WRONLY)
    try:
        os.ftruncate(descriptor, cut)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    detail = f"cut from {size} to {cut} bytes ({where})"
    return Corruption("truncate", str(path), size, cut, cut, detail)


def _last_frame(path: Path, size: int) -> tuple[int, int]:
    """[start, end) of the last whole frame, walking the length fields; (0, 0) if none."""
    last = (0, 0)
    position = 0
    with open(_open(path, os.O_RDONLY), "rb") as handle:
        while position + FRAME_HEADER_BYTES <= size:
            handle.seek(position)
            (length,) = _LENGTH.unpack(handle.read(_LENGTH.size))
            end = position + _LENGTH.size + length
            if length < FRAME_HEADER_BYTES - _LENGTH.size or end > size:
                break
            last = (position, end)
            position = end
    return last


def _append_garbage(path: Path, rng: random.Random) -> Corruption:
    size = path.lstat().st_size
    garbage = rng.randbytes(rng.randint(1, GARBAGE_BYTES_MAX))
    descriptor = _open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(descriptor, garbage)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    detail = f"appended {len(garbage)} random bytes at {size}"
    return Corruption("garbage", str(path), size, size + len(garbage), size, detail)


def _flip_bit(path: Path, rng: random.Random) -> Corruption:
    """One bit of the last frame's records (past its frame and batch headers): damage that
    no length or structure check notices, only a checksum, which is what this fault is
    for (the skip-crc control relies on it). Without such bytes, a bit in the last 4 KiB."""
    size = path.lstat().st_size
    start, end = _last_frame(path, size)
    records_start = start + FRAME_HEADER_BYTES + BATCH_HEADER_BYTES
    if end > records_start:
        position = rng.randrange(records_start, end)
    else:
        position = rng.randrange(max(0, size - BITFLIP_WINDOW_BYTES), size)
    bit = rng.randrange(8)
    descriptor = _open(path, os.O_RDWR)
    try:
        (old,) = os.pread(descriptor, 1, position)
        new = old ^ (1 << bit)
        os.pwrite(descriptor, bytes([new]), position)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    detail = f"flipped bit {bit} of byte {position} of {size} (0x{old:02x} -> 0x{new:02x})"
    return Corruption("bitflip", str(path), size, size, position, detail)
