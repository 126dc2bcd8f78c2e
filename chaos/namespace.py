"""The chaos run's own network and mount namespaces, and the guard every fault passes.

The runner re-executes itself under `unshare --net --mount --fork`: the new
network namespace holds only `lo`, so firewall rules, the cluster's addresses
127.0.0.1..N and the client's 127.0.0.100 exist nowhere else, and everything
dies with the process. The private mount namespace carries the per-node tmpfs
mounts and a private `/dev/shm` (libfaketime leaves a shared-memory file per
process there, and `kill -9` leaves it behind: see `chaos.clockfaults`).

Every function that changes network or mount state calls `require_namespace()`
first. It trusts no single sign: the environment marker must be set, the
namespaces recorded before the re-exec must differ from the current ones, and
the network namespace must hold nothing but `lo`. These are exceptions, not
`assert`s, so `python -O` cannot strip them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

NAMESPACE_MARKER = "RAFTLOG_CHAOS_NS"
OUTER_NAMESPACES = "RAFTLOG_CHAOS_OUTER_NS"  # "net:[...] mnt:[...]" of the process that re-executed
UNSHARE_ARGUMENTS = ("unshare", "--net", "--mount", "--fork", "--kill-child")
COMMAND_TIMEOUT_S = 10.0
# /dev/shm inside the namespace: libfaketime's per-process files are a few KiB each.
SHM_BYTES = 64 << 20

# <linux/sockios.h>, <net/if.h>: struct ifreq is 40 bytes on x86_64 (16-byte name, 24-byte union).
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sh22x")

_prepared = False  # this process already brought lo up and mounted its /dev/shm


class NamespaceError(RuntimeError):
    """A fault was about to change network or mount state outside the runner's namespaces."""


class NamespaceUnavailable(RuntimeError):
    """`unshare` cannot create the namespaces here (missing, or not permitted)."""


@dataclass(frozen=True, slots=True)
class NamespaceStatus:
    inside: bool
    reason: str  # why not inside, or what was checked


def namespace_ids() -> dict[str, str]:
    """The current process's network and mount namespace identities, e.g. `net:[4026531833]`."""
    return {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("net", "mnt")}


def _outer_ids() -> dict[str, str]:
    recorded = os.environ.get(OUTER_NAMESPACES, "")
    return {entry.split(":", 1)[0]: entry for entry in recorded.split() if ":" in entry}


def namespace_status() -> NamespaceStatus:
    """Whether this process runs inside namespaces that `enter_namespaces` created."""
    if os.environ.get(NAMESPACE_MARKER) != "1":
        return NamespaceStatus(False, f"{NAMESPACE_MARKER}=1 is not set (not started by enter_namespaces)")
    outer, current = _outer_ids(), namespace_ids()
    for kind in ("net", "mnt"):
        if kind not in outer:
            return NamespaceStatus(False, f"{OUTER_NAMESPACES} does not record the outer {kind} namespace")
        if outer[kind] == current[kind]:
            return NamespaceStatus(False, f"the {kind} namespace is still the outer one ({current[kind]})")
    try:
        init_net = os.readlink("/proc/1/ns/net")
    except OSError:
        init_net = None  # not readable in every container; the other checks stand
    if init_net == current["net"]:
        return NamespaceStatus(False, f"the network namespace is init's ({init_net})")
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"]:
        return NamespaceStatus(False, f"the network namespace has interfaces {interfaces}, not only lo")
    return NamespaceStatus(True, f"inside {current['net']} {current['mnt']} (outer {outer['net']})")


def require_namespace() -> None:
    """Raise `NamespaceError` unless inside the runner's namespaces. Call before any change."""
    status = namespace_status()
    if not status.inside:
        raise NamespaceError(f"refusing to change network or mount state: {status.reason}")


def unshare_problem() -> str | None:
    """Why `unshare` cannot create the namespaces here, or None when it can (tried for real)."""
    if shutil.which("unshare") is None:
        return "unshare is not installed (Debian package util-linux)"
    try:
        result = subprocess.run(
            [*UNSHARE_ARGUMENTS, "true"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"unshare did not finish within {COMMAND_TIMEOUT_S:.0f} s"
    if result.returncode != 0:
        detail = result.stderr.strip() or f"exit {result.returncode}"
        return f"unshare --net --mount failed: {detail} (needs root or user namespaces)"
    return None


def enter_namespaces(argv: Sequence[str]) -> None:
    """Make sure the rest of this process runs inside fresh network and mount namespaces.

    Outside: re-executes `python *argv` under unshare (never returns); `argv` is
    what follows the interpreter, e.g. `["-m", "chaos", "run", ...]`. Raises
    `NamespaceUnavailable` first if unshare cannot work here. Inside (marker set):
    checks it really is inside, brings `lo` up, makes every mount private and
    mounts a private `/dev/shm`; idempotent within a process.
    """
    if os.environ.get(NAMESPACE_MARKER) == "1":
        require_namespace()
        _prepare_inside()
        return
    problem = unshare_problem()
    if problem is not None:
        raise NamespaceUnavailable(problem)
    ids = namespace_ids()
    environment = dict(os.environ)
    environment[NAMESPACE_MARKER] = "1"
    environment[OUTER_NAMESPACES] = f"{ids['net']} {ids['mnt']}"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(UNSHARE_ARGUMENTS[0], [*UNSHARE_ARGUMENTS, sys.executable, *argv], environment)


def _prepare_inside() -> None:
    global _prepared
    if _prepared:
        return
    _bring_loopback_up()
    run_command(["mount", "--make-rprivate", "/"])
    run_command(["mount", "-t", "tmpfs", "-o", f"size={SHM_BYTES},mode=1777", "tmpfs", "/dev/shm"])
    _prepared = True


def _bring_loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        request = _IFREQ.pack(b"lo", 0)
        _, flags = _IFREQ.unpack(fcntl.ioctl(handle, _SIOCGIFFLAGS, request))
        fcntl.ioctl(handle, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))


def run_command(argv: Sequence[str], input_text: str | None = None) -> str:
    """Run a short system command with a deadline; its stdout, or `FaultError` with its stderr."""
    try:
        result = subprocess.run(
            list(argv), input=input_text, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except FileNotFoundError as error:
        raise FaultError(f"{argv[0]}: not installed") from error
    except subprocess.TimeoutExpired as error:
        raise FaultError(f"{' '.join(argv)}: no answer within {COMMAND_TIMEOUT_S:.0f} s") from error
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise FaultError(f"{' '.join(argv)}: exit {result.returncode}: {detail}")
    return result.stdout


class FaultError(RuntimeError):
    """A fault could not be injected or removed (the command failed); the message says why."""
