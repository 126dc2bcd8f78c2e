"""Wall-clock faults per node with libfaketime, monotonic time untouched.

Each node starts with `LD_PRELOAD=libfaketime` and its own timestamp file
holding an offset such as `+120s`; `FAKETIME_NO_CACHE=1` makes the library
re-read the file on every wall-clock call (about 7 us each here, against 0.4 us
unfaked: fine at our request rates), so a bump lands at once.
`FAKETIME_DONT_FAKE_MONOTONIC=1` keeps `time.monotonic()` and therefore asyncio's
timers, Raft ticks and timeouts on real time: only `time.time()` and friends
jump. Safety must never depend on the wall clock; this is how we check.

Known traps of libfaketime 0.9.10 (Debian bookworm), all checked on this machine:

* With DONT_FAKE_MONOTONIC, `time.sleep()` raises `OSError(EINVAL)` on Python
  3.11+: it sleeps with `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`, which
  that release mangles (wolfcw/libfaketime#426, fixed upstream later).
  asyncio sleeps, `threading.Event.wait`, `Lock.acquire(timeout)` and
  `queue.Queue.get(timeout)` work. `raftlog serve` never calls `time.sleep`.
* Without DONT_FAKE_MONOTONIC, `threading.Event().wait(timeout)` hangs.
* The library keeps `/dev/shm/faketime_shm_<pid>`; `kill -9` leaves it behind
  and a later process that gets the same PID fails to start ("shm_open failed:
  File exists"). The namespace bootstrap mounts a private `/dev/shm`, and
  `remove_stale_shm(pid)` clears a killed node's files.
* File timestamps are not faked: a node 600 s ahead sees the files it just
  wrote as 600 s old. Time-based retention reads the wall clock, so bumps
  exercise it too.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

FAKETIME_GLOBS = (
    # The pthread-safe build first: nodes call the clock from several threads.
    "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
SHM_DIRECTORY = "/dev/shm"
# Bumps beyond a day say nothing more about safety and risk overflowing timeouts.
OFFSET_SECONDS_MAX = 86_400


def find_faketime_library() -> str | None:
    for pattern in FAKETIME_GLOBS:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[0]
    return None


class Clock:
    """Per-node wall-clock offsets. `bump` adds to a node's offset, `set_offset` replaces it."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, library: str | None = None) -> None:
        found = library or find_faketime_library()
        if found is None:
            raise FileNotFoundError("libfaketime is not installed (Debian package faketime; make chaos-deps)")
        self.library = found
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self._files: dict[int, Path] = {}
        self._offsets: dict[int, int] = {}

    def env_for(self, node_id: int, state_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
        """Environment variables to start node `node_id` under libfaketime (offset 0 at first).
        The timestamp file lives in `state_dir`, or the directory given to the constructor."""
        directory = Path(state_dir) if state_dir is not None else self.state_dir
        if directory is None:
            raise ValueError("no state directory: pass one to Clock() or env_for()")
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"faketime-{node_id}"
        self._files[node_id] = path
        self._write(node_id, self._offsets.get(node_id, 0))
        preload = " ".join(part for part in (self.library, os.environ.get("LD_PRELOAD", "")) if part)
        return {
            "LD_PRELOAD": preload,
            "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_NO_CACHE": "1",
        }

    def bump(self, node_id: int, seconds: int) -> int:
        """Move the node's wall clock by `seconds` (negative: back); returns its new offset."""
        return self.set_offset(node_id, self._offsets.get(node_id, 0) + seconds)

    def set_offset(self, node_id: int, seconds: int) -> int:
        if not isinstance(seconds, int):
            raise TypeError(f"offset {seconds!r} is not a whole number of seconds")
        if abs(seconds) > OFFSET_SECONDS_MAX:
            raise ValueError(f"offset {seconds} s exceeds {OFFSET_SECONDS_MAX} s")
        self._write(node_id, seconds)
        return seconds

    def reset(self, node_id: int) -> None:
        self.set_offset(node_id, 0)

    def offset(self, node_id: int) -> int:
        return self._offsets.get(node_id, 0)

    def _write(self, node_id: int, seconds: int) -> None:
        path = self._files.get(node_id)
        if path is None:
            raise KeyError(f"node {node_id} has no timestamp file: call env_for({node_id}) first")
        # Written whole and renamed: the node re-reads the file on every call.
        scratch = path.with_name(path.name + ".new")
        scratch.write_text(f"{seconds:+d}s\n")
        os.replace(scratch, path)
        self._offsets[node_id] = seconds


def remove_stale_shm(pid: int) -> list[str]:
    """Remove libfaketime's shared-memory files of a process that is gone (after `kill -9`
    and `wait`); returns the paths removed. Never touches a live process's files."""
    if pid <= 1:
        raise ValueError(f"pid {pid}")
    if os.path.exists(f"/proc/{pid}"):
        return []
    removed = []
    for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        path = os.path.join(SHM_DIRECTORY, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
