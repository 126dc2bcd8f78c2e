"""The chaos runner's fault injection layer: what works here, and the tools to inject it.

    enter_namespaces(argv)     re-exec under `unshare --net --mount` (chaos.namespace)
    Capabilities.detect()      probe each mechanism for real, inside the namespace
    Network                    partitions, one-way drops, client isolation, loss (chaos.netfaults)
    Clock                      per-node wall-clock offsets with libfaketime (chaos.clockfaults)
    Disk, corrupt_tail         disk full on tmpfs, damaged log tails (chaos.diskfaults)
    pause, resume              SIGSTOP / SIGCONT by PID, children of this process only

Process kills and restarts belong to the runner, which holds the `Popen`s.
Delay is not offered: this kernel has no netem, and an NFQUEUE delayer needs
the NetfilterQueue module; `Capabilities` reports it unavailable, with why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from chaos.clockfaults import Clock, find_faketime_library, remove_stale_shm
from chaos.diskfaults import (
    BALLAST_NAME,
    CORRUPT_MODES,
    Corruption,
    Disk,
    NothingToCorrupt,
    corrupt_tail,
)
from chaos.namespace import (
    FaultError,
    NamespaceError,
    NamespaceUnavailable,
    enter_namespaces,
    namespace_status,
    require_namespace,
    run_command,
)
from chaos.netfaults import CLIENT_IP, NetFault, Network

__all__ = [
    "BALLAST_NAME",
    "CLIENT_IP",
    "CORRUPT_MODES",
    "Capabilities",
    "Clock",
    "Corruption",
    "Disk",
    "FaultError",
    "NamespaceError",
    "NamespaceUnavailable",
    "NetFault",
    "Network",
    "NothingToCorrupt",
    "corrupt_tail",
    "enter_namespaces",
    "namespace_status",
    "pause",
    "process_state",
    "remove_stale_shm",
    "require_namespace",
    "resume",
]

PROBE_TIMEOUT_S = 20.0
_PROBE_OFFSET_S = 3600
# The probe child reports its clocks; the parent compares them with its own.
_CLOCK_PROBE = """
import asyncio, concurrent.futures, json, threading, time
async def main():
    started = time.monotonic()
    await asyncio.sleep(0.02)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        await asyncio.get_running_loop().run_in_executor(pool, threading.Event().wait, 0.01)
    return time.monotonic() - started
slept = asyncio.run(main())
try:
    time.sleep(0.001)
    sleep_error = None
except OSError as error:
    sleep_error = str(error)
print(json.dumps({"wall": time.time(), "monotonic": time.monotonic(), "slept": slept,
                  "sleep_error": sleep_error}))
"""

# Fault kinds the runner names -> the capability each needs (None: always available).
_KIND_NEEDS = {
    "kill": None,
    "pause": "sigstop",
    "partition": "partition",
    "loss": "loss",
    "delay": "delay",
    "clock": "faketime",
    "disk-full": "tmpfs",
    "corrupt": None,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """Which fault mechanisms work here, each probed for real; `reasons` says why one does not."""

    netns: bool
    iptables: bool
    nft: bool
    loss: bool
    delay: bool
    faketime: bool
    faketime_library: str | None
    tmpfs: bool
    sigstop: bool
    reasons: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def partition(self) -> bool:
        return self.iptables or self.nft

    @property
    def firewall(self) -> str | None:
        """The `Network` backend to use: iptables (nft-backed here) first, else nft."""
        return "iptables" if self.iptables else "nft" if self.nft else None

    @classmethod
    def detect(cls) -> Capabilities:
        """Probe everything. Network and mount probes run only inside the chaos namespace;
        outside they report unavailable (they would change the host)."""
        reasons: dict[str, str] = {}
        notes: list[str] = []
        status = namespace_status()
        if not status.inside:
            for name in ("netns", "iptables", "nft", "loss", "tmpfs"):
                reasons[name] = f"not probed outside the chaos namespace: {status.reason}"
            iptables = nft = loss = tmpfs = False
        else:
            iptables, iptables_loss = _probe_iptables(reasons)
            nft, nft_loss = _probe_nft(reasons)
            loss = iptables_loss if iptables else nft_loss
            if not loss:
                reasons.setdefault("loss", "no statistic match (iptables) or numgen (nft)")
            tmpfs = _probe_tmpfs(reasons)
        reasons["delay"] = _delay_reason()
        library = find_faketime_library()
        faketime = library is not None and _probe_faketime(library, reasons, notes)
        if library is None:
            reasons["faketime"] = "libfaketime not found (Debian package faketime; make chaos-deps)"
        sigstop = _probe_sigstop(reasons)
        return cls(
            netns=status.inside,
            iptables=iptables,
            nft=nft,
            loss=loss,
            delay=False,
            faketime=faketime,
            faketime_library=library,
            tmpfs=tmpfs,
            sigstop=sigstop,
            reasons=reasons,
            notes=tuple(notes),
        )

    def available(self, kind: str) -> bool:
        """Whether the runner's fault kind (kill, pause, partition, loss, delay, clock,
        disk-full, corrupt) can be injected."""
        need = _KIND_NEEDS[kind]
        return need is None or bool(getattr(self, need))

    def unavailable(self, kinds: list[str]) -> dict[str, str]:
        """Kind -> why it is skipped, for the kinds in `kinds` that cannot run here."""
        skipped = {}
        for kind in kinds:
            if not self.available(kind):
                need = _KIND_NEEDS[kind]
                assert need is not None
                names = ("iptables", "nft") if need == "partition" else (need,)
                skipped[kind] = "; ".join(self.reasons.get(name, f"{name} unavailable") for name in names)
        return skipped

    def lines(self) -> list[str]:
        """One line per mechanism, for the run's report."""
        found = [
            ("netns", self.netns),
            ("iptables", self.iptables),
            ("nft", self.nft),
            ("loss", self.loss),
            ("delay", self.delay),
            ("faketime", self.faketime),
            ("tmpfs", self.tmpfs),
            ("sigstop", self.sigstop),
        ]
        lines = [f"{name}: {'yes' if ok else 'no (' + self.reasons.get(name, '?') + ')'}" for name, ok in found]
        return lines + [f"note: {note}" for note in self.notes]

    def to_json(self) -> dict[str, object]:
        return {
            "netns": self.netns,
            "iptables": self.iptables,
            "nft": self.nft,
            "loss": self.loss,
            "delay": self.delay,
            "faketime": self.faketime,
            "faketime_library": self.faketime_library,
            "tmpfs": self.tmpfs,
            "sigstop": self.sigstop,
            "reasons": dict(self.reasons),
            "notes": list(self.notes),
        }


def _probe_iptables(reasons: dict[str, str]) -> tuple[bool, bool]:
    """(rules work, statistic loss works), by a scratch chain that nothing jumps to."""
    if shutil.which("iptables-restore") is None or shutil.which("iptables") is None:
        reasons["iptables"] = "iptables is not installed (make chaos-deps)"
        return False, False
    chain = "CHAOS-PROBE"
    plain = f"*filter\n:{chain} - [0:0]\n-A {chain} -s 127.0.0.254/32 -d 127.0.0.253/32 -j DROP\nCOMMIT\n"
    statistic = f"*filter\n-A {chain} -d 127.0.0.253/32 -m statistic --mode random --probability 0.5 -j DROP\nCOMMIT\n"
    try:
        run_command(["iptables-restore", "--noflush"], plain)
    except FaultError as error:
        reasons["iptables"] = str(error)
        return False, False
    try:
        run_command(["iptables-restore", "--noflush"], statistic)
        loss = True
    except FaultError as error:
        reasons["loss"] = str(error)
        loss = False
    run_command(["iptables-restore", "--noflush"], f"*filter\n-F {chain}\n-X {chain}\nCOMMIT\n")
    return True, loss


def _probe_nft(reasons: dict[str, str]) -> tuple[bool, bool]:
    """(rules work, numgen loss works), by a scratch table whose chain hooks nothing."""
    if shutil.which("nft") is None:
        reasons["nft"] = "nft is not installed (make chaos-deps)"
        return False, False
    table = "raftlog_chaos_probe"
    plain = f"add table ip {table}\nadd chain ip {table} probe\nadd rule ip {table} probe ip saddr 127.0.0.254 drop\n"
    try:
        run_command(["nft", "-f", "-"], plain)
    except FaultError as error:
        reasons["nft"] = str(error)
        return False, False
    try:
        run_command(["nft", "-f", "-"], f"add rule ip {table} probe numgen random mod 100 < 50 drop\n")
        loss = True
    except FaultError as error:
        reasons.setdefault("loss", str(error))
        loss = False
    run_command(["nft", "-f", "-"], f"delete table ip {table}\n")
    return True, loss


def _probe_tmpfs(reasons: dict[str, str]) -> bool:
    directory = tempfile.mkdtemp(prefix="chaos-tmpfs-probe-")
    try:
        run_command(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", directory])
        try:
            with open(os.path.join(directory, "probe"), "wb") as handle:
                handle.write(bytes(4096))
        finally:
            run_command(["umount", directory])
        return True
    except (FaultError, OSError) as error:
        reasons["tmpfs"] = str(error)
        return False
    finally:
        os.rmdir(directory)


def _delay_reason() -> str:
    module = importlib.util.find_spec("netfilterqueue") is not None
    return (
        "no delay injector: this kernel has no netem, and an NFQUEUE delayer "
        f"(NetfilterQueue module {'present' if module else 'not installed'}) is not written yet"
    )


def _probe_faketime(library: str, reasons: dict[str, str], notes: list[str]) -> bool:
    """Start a real Python child under libfaketime an hour ahead: its wall clock must move,
    its monotonic clock must not, and asyncio and threads must still work."""
    with tempfile.TemporaryDirectory(prefix="chaos-faketime-probe-") as directory:
        clock = Clock(directory, library)
        environment = {**os.environ, **clock.env_for(0)}
        clock.set_offset(0, _PROBE_OFFSET_S)
        try:
            result = subprocess.run(
                [sys.executable, "-c", _CLOCK_PROBE],
                env=environment,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            reasons["faketime"] = f"a Python child under libfaketime hung for {PROBE_TIMEOUT_S:.0f} s"
            return False
        wall, monotonic = time.time(), time.monotonic()
    if result.returncode != 0:
        reasons["faketime"] = f"a Python child under libfaketime failed: {result.stderr.strip()[-300:]}"
        return False
    child = json.loads(result.stdout.strip().splitlines()[-1])
    wall_offset = child["wall"] - wall
    if abs(wall_offset - _PROBE_OFFSET_S) > 60:
        reasons["faketime"] = f"offset +{_PROBE_OFFSET_S}s showed as {wall_offset:+.0f} s in the child"
        return False
    if abs(child["monotonic"] - monotonic) > 60:
        reasons["faketime"] = "the child's monotonic clock moved with the wall clock"
        return False
    if child["sleep_error"] is not None:
        notes.append(
            f"under libfaketime time.sleep() fails ({child['sleep_error']}; libfaketime#426): "
            "asyncio sleeps and threading.Event waits work"
        )
    return True


def _probe_sigstop(reasons: dict[str, str]) -> bool:
    try:
        child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as error:
        reasons["sigstop"] = f"cannot start a probe child: {error}"
        return False
    try:
        pause(child.pid)
        stopped = _wait_for_state(child.pid, "T")
        resume(child.pid)
        running = _wait_for_state(child.pid, "S")
    finally:
        child.kill()
        child.wait(timeout=PROBE_TIMEOUT_S)
    if not (stopped and running):
        reasons["sigstop"] = f"SIGSTOP/SIGCONT did not stop and resume a child (stopped {stopped}, resumed {running})"
    return stopped and running


def _wait_for_state(pid: int, state: str, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_state(pid) == state:
            return True
        time.sleep(0.005)
    return False


# -- process pauses -------------------------------------------------------------


def process_state(pid: int) -> str:
    """The state letter from /proc/<pid>/stat: R running, S sleeping, T stopped, Z zombie."""
    return _stat(pid)[0]


def pause(pid: int) -> None:
    """SIGSTOP one child process of this process, by PID."""
    _signal_child(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    """SIGCONT one child process of this process, by PID."""
    _signal_child(pid, signal.SIGCONT)


def _stat(pid: int) -> tuple[str, int]:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except FileNotFoundError as error:
        raise ProcessLookupError(f"no process {pid}") from error
    # The command name sits in parentheses and may itself hold spaces or parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _signal_child(pid: int, signal_number: int) -> None:
    """Only our own children: their PIDs cannot be reused before we reap them."""
    if pid <= 1 or pid == os.getpid():
        raise ValueError(f"refusing to signal pid {pid}")
    _, parent = _stat(pid)
    if parent != os.getpid():
        raise ValueError(f"pid {pid} is not a child of this process (its parent is {parent})")
    os.kill(pid, signal_number)

