"""The chaos fault layer against the real kernel: firewall rules, tmpfs, libfaketime, signals.

Anything that changes network or mount state runs in `tests.chaos.faults_helper`,
a subprocess that enters its own namespaces; pytest itself never does. Tests
skip, naming the reason, when this machine lacks a mechanism.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import faults
from chaos.clockfaults import find_faketime_library
from chaos.namespace import NAMESPACE_MARKER, OUTER_NAMESPACES, namespace_ids
from chaos.netfaults import Rule, _iptables_rule, _nft_rule, check_loopback
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset, Term
from storage.batch import HEADER_BYTES as BATCH_HEADER_BYTES
from storage.frames import FRAME_HEADER_BYTES, encode_frame

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parents[2]
HELPER_TIMEOUT_S = 30.0
ONE, TWO, THREE, CLIENT = "127.0.0.1", "127.0.0.2", "127.0.0.3", faults.CLIENT_IP


def run_helper(*arguments: str, environment: dict[str, str] | None = None) -> tuple[int, dict]:
    """Run one namespace scenario; its exit status and the JSON object it printed last."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos.faults_helper", *arguments],
        cwd=REPOSITORY,
        env=environment if environment is not None else _outside_environment(),
        capture_output=True,
        text=True,
        timeout=HELPER_TIMEOUT_S,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output (exit {result.returncode}): {result.stderr[-2000:]}"
    return result.returncode, json.loads(lines[-1])


def _outside_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop(NAMESPACE_MARKER, None)
    environment.pop(OUTER_NAMESPACES, None)
    return environment


@pytest.fixture(scope="module")
def capabilities() -> dict:
    code, result = run_helper("capabilities")
    if code == 3:
        pytest.skip(f"no namespaces here: {result['error']}")
    assert code == 0, result
    return result


def require(capabilities: dict, name: str) -> None:
    if not capabilities[name]:
        pytest.skip(f"{name} unavailable: {capabilities['reasons'].get(name)}")


def test_capabilities_are_probed_inside_the_namespace(capabilities: dict) -> None:
    # Goal: every mechanism is probed for real, and each missing one says why.
    assert capabilities["netns"] is True
    assert capabilities["delay"] is False and "netem" in capabilities["reasons"]["delay"]
    for name in ("iptables", "nft", "loss", "faketime", "tmpfs", "sigstop"):
        if not capabilities[name]:
            assert capabilities["reasons"].get(name), name
    if shutil.which("iptables-restore"):
        assert capabilities["iptables"], capabilities["reasons"]
    if shutil.which("nft"):
        assert capabilities["nft"], capabilities["reasons"]
    if find_faketime_library():
        assert capabilities["faketime"], capabilities["reasons"]
    assert capabilities["tmpfs"] and capabilities["sigstop"], capabilities["reasons"]


def test_capabilities_outside_probe_no_network_or_mount() -> None:
    # Goal: outside the namespace, detection changes nothing and says so.
    found = faults.Capabilities.detect()
    assert not found.netns and not found.iptables and not found.nft and not found.tmpfs
    assert "outside the chaos namespace" in found.reasons["iptables"]
    assert not found.available("partition") and found.available("kill")
    assert set(found.unavailable(["kill", "partition", "disk-full"])) == {"partition", "disk-full"}


def test_state_changes_are_refused_outside_the_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: no rule or mount can be made from the host, even with the marker set by mistake.
    monkeypatch.delenv(NAMESPACE_MARKER, raising=False)
    _assert_all_refused()
    monkeypatch.setenv(NAMESPACE_MARKER, "1")  # set by mistake: the recorded outer namespaces are ours
    monkeypatch.setenv(OUTER_NAMESPACES, " ".join(namespace_ids().values()))
    _assert_all_refused()
    with pytest.raises(faults.NamespaceError):
        faults.enter_namespaces(["-c", "pass"])  # with the marker: checks, never prepares the host
    monkeypatch.setenv(OUTER_NAMESPACES, "net:[1] mnt:[1]")  # a forged outer record
    if sorted(name for _, name in socket.if_nameindex()) != ["lo"]:
        with pytest.raises(faults.NamespaceError, match="interfaces"):
            faults.require_namespace()


def _assert_all_refused() -> None:
    with pytest.raises(faults.NamespaceError):
        faults.require_namespace()
    with pytest.raises(faults.NamespaceError):
        faults.Network("iptables")
    with pytest.raises(faults.NamespaceError):
        faults.Disk().mount_tmpfs("/tmp", 1 << 20)


def test_missing_unshare_is_a_clear_error() -> None:
    # Goal: without unshare the bootstrap raises NamespaceUnavailable instead of exec-failing.
    environment = {**_outside_environment(), "PATH": "/nonexistent"}
    code, result = run_helper("inside", environment=environment)
    assert code == 3
    assert "unshare is not installed" in result["error"]


def test_enter_namespaces_prepares_the_inside(capabilities: dict) -> None:
    # Goal: inside, only lo exists and is up, and /dev/shm is private (libfaketime's files die with us).
    code, result = run_helper("inside")
    assert code == 0
    assert result["inside"] is True, result["status"]
    assert result["interfaces"] == ["lo"]
    assert result["shm_is_tmpfs"] is True


@pytest.mark.parametrize("backend", ["iptables", "nft"])
def test_network_faults_cut_exactly_the_paths_they_name(capabilities: dict, backend: str) -> None:
    # Goal: each fault drops exactly its address pairs (UDP matrix), TCP sees the same,
    # undo/heal remove exactly their rules, and loss draws once per packet.
    require(capabilities, backend)
    code, steps = run_helper("network", backend)
    assert code == 0, steps

    def pairs(*names: tuple[str, str]) -> list[str]:
        return sorted(f"{source}>{target}" for source, target in names)

    assert steps["baseline"]["missing"] == []
    assert all(steps["baseline"]["tcp"].values())
    split = steps["split"]
    assert split["missing"] == pairs((ONE, TWO), (TWO, ONE), (ONE, THREE), (THREE, ONE))
    assert split["tcp"] == {f"{ONE}>{TWO}": False, f"{TWO}>{ONE}": False, f"{TWO}>{THREE}": True, f"{CLIENT}>{ONE}": True}
    assert split["active"] == [f"split {ONE} | {TWO},{THREE}"]
    assert steps["healed"]["missing"] == [] and all(steps["healed"]["tcp"].values())
    assert steps["healed"]["active"] == []
    one_way = steps["one_way"]
    assert one_way["missing"] == pairs((ONE, TWO))
    # Over TCP a one-way cut blocks connections both ways (the replies are dropped).
    assert one_way["tcp"] == {f"{ONE}>{TWO}": False, f"{TWO}>{ONE}": False, f"{ONE}>{THREE}": True}
    isolated = pairs((ONE, THREE), (THREE, ONE), (TWO, THREE), (THREE, TWO))
    assert steps["isolate"]["missing"] == isolated
    assert steps["isolate"]["tcp"] == {f"{THREE}>{THREE}": True, f"{CLIENT}>{THREE}": True}
    assert steps["isolate_with_client"]["missing"] == sorted([*isolated, *pairs((CLIENT, THREE), (THREE, CLIENT))])
    assert steps["isolate_with_client"]["active"] == [f"isolate {THREE} from everyone"]
    assert steps["isolate_client"]["missing"] == pairs((CLIENT, ONE), (ONE, CLIENT))
    assert steps["isolate_client"]["tcp"] == {f"{CLIENT}>{ONE}": False, f"{TWO}>{ONE}": True}
    assert steps["undo_keeps_others"]["missing"] == pairs((ONE, THREE), (TWO, THREE), (CLIENT, THREE))
    assert steps["undo_keeps_others"]["active"] == [f"loss 100% to {THREE}"]
    assert steps["loss_all"]["missing"] == pairs((ONE, TWO), (THREE, TWO), (CLIENT, TWO))
    assert steps["loss_all"]["tcp"] == {f"{ONE}>{TWO}": False, f"{CLIENT}>{TWO}": False, f"{ONE}>{THREE}": True}
    assert steps["loss_none_delivered"] == 200
    # 400 draws at p = 0.5: mean 200, sd 10. Drawing twice per packet would give about 100.
    assert 140 <= steps["loss_half_delivered"] <= 260
    assert steps["final"] == {"missing": [], "tcp": {}, "active": []}
    assert "CHAOS-" not in steps["listing_after_heal"] and "fault_" not in steps["listing_after_heal"]
    assert steps["closed"] is True


def test_disk_fill_gives_enospc_and_free_restores(capabilities: dict, tmp_path: Path) -> None:
    # Goal: the ballast fills the tmpfs to ENOSPC, free gives the space back, and the
    # mount never shows outside the namespace.
    require(capabilities, "tmpfs")
    code, result = run_helper("disk", str(tmp_path))
    assert code == 0, result
    assert "not empty" in result["refused_non_empty"]
    assert "not a tmpfs mounted by this Disk" in result["refused_foreign_fill"]
    assert result["is_mount"] is True
    assert result["filled_bytes"] + 8192 == 2 << 20  # the whole tmpfs, beside one 8 KiB file
    assert result["refilled_bytes"] == 0
    assert result["write_when_full"] == "ENOSPC"
    assert result["freed_bytes"] == result["filled_bytes"]
    assert result["write_after_free"] == "ok"
    assert result["free_again"] == 0
    assert result["mounted_after_unmount"] is False
    assert not os.path.ismount(tmp_path / "mnt")
    assert list((tmp_path / "mnt").iterdir()) == []  # the files lived on the tmpfs only


# -- clock ----------------------------------------------------------------------

_CLOCK_CHILD = """
import asyncio, concurrent.futures, json, sys, threading, time
async def waits():
    started = time.monotonic()
    await asyncio.sleep(0.05)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        await asyncio.get_running_loop().run_in_executor(pool, threading.Event().wait, 0.02)
    return time.monotonic() - started
for line in sys.stdin:
    slept = asyncio.run(waits()) if line.strip() == "waits" else None
    print(json.dumps({"wall": time.time(), "monotonic": time.monotonic(), "slept": slept}), flush=True)
"""


@pytest.mark.asyncio
async def test_clock_moves_the_wall_clock_of_a_real_child_not_its_monotonic(tmp_path: Path) -> None:
    # Goal: bumps reach a running node at once, monotonic time and asyncio stay on real time.
    library = find_faketime_library()
    if library is None:
        pytest.skip("libfaketime not installed (make chaos-deps)")
    clock = faults.Clock(tmp_path / "clock")
    environment = {**os.environ, **clock.env_for(7)}
    assert environment["FAKETIME_DONT_FAKE_MONOTONIC"] == "1" and environment["FAKETIME_NO_CACHE"] == "1"
    assert environment["LD_PRELOAD"].split()[0] == library
    async with asyncio.timeout(20):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CLOCK_CHILD, env=environment,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        try:
            observed = []
            for action in ("none", "+120", "-150", "reset", "waits"):
                if action == "reset":
                    clock.reset(7)
                elif action != "none" and action != "waits":
                    clock.bump(7, int(action))
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write(f"{action}\n".encode())
                report = json.loads(await child.stdout.readline())
                observed.append((round(report["wall"] - time.time()), report["monotonic"] - time.monotonic(), report))
                file_text = (tmp_path / "clock" / "faketime-7").read_text()
                assert file_text == f"{clock.offset(7):+d}s\n"
            # kill -9 leaves libfaketime's shared memory behind; remove_stale_shm clears it.
            child.kill()
            await child.wait()
            removed = faults.remove_stale_shm(child.pid)
            assert sorted(removed) == [f"/dev/shm/faketime_shm_{child.pid}", f"/dev/shm/sem.faketime_sem_{child.pid}"]
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
            faults.remove_stale_shm(child.pid)
    assert [wall for wall, _, _ in observed] == [0, 120, -30, 0, 0]
    assert all(abs(monotonic) < 1.0 for _, monotonic, _ in observed)
    assert 0.07 <= observed[-1][2]["slept"] < 2.0


def test_clock_argument_checks(tmp_path: Path) -> None:
    # Goal: misuse fails loudly instead of writing a file libfaketime would misread.
    library = find_faketime_library() or "/nonexistent/libfaketime.so.1"
    clock = faults.Clock(library=library)
    with pytest.raises(ValueError, match="no state directory"):
        clock.env_for(1)
    with pytest.raises(KeyError):
        clock.bump(1, 5)
    environment = clock.env_for(1, tmp_path)
    assert environment["FAKETIME_TIMESTAMP_FILE"] == str(tmp_path / "faketime-1")
    assert (tmp_path / "faketime-1").read_text() == "+0s\n"
    assert clock.bump(1, 90) == 90 and clock.bump(1, -120) == -30
    assert (tmp_path / "faketime-1").read_text() == "-30s\n"
    with pytest.raises(TypeError):
        clock.bump(1, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        clock.set_offset(1, 10**6)


# -- pauses ---------------------------------------------------------------------


def test_pause_and_resume_a_child_by_pid() -> None:
    # Goal: SIGSTOP/SIGCONT reach our own child, and nothing else can be signalled.
    child = subprocess.Popen(["sleep", "20"])
    try:
        faults.pause(child.pid)
        assert _eventually_state(child.pid, "T")
        faults.resume(child.pid)
        assert _eventually_state(child.pid, "S")
        with pytest.raises(ValueError, match="not a child"):
            faults.pause(os.getppid())
        with pytest.raises(ValueError):
            faults.pause(1)
    finally:
        child.kill()
        child.wait(timeout=10)
    with pytest.raises(ProcessLookupError):
        faults.pause(child.pid)


def _eventually_state(pid: int, state: str) -> bool:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if faults.process_state(pid) == state:
            return True
        time.sleep(0.01)
    return False


# -- rules, without a namespace --------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "iptables", "nft"),
    [
        (Rule("drop", ONE, TWO), f"-s {ONE}/32 -d {TWO}/32 -j DROP", f"ip saddr {ONE} ip daddr {TWO} drop"),
        (Rule("return", CLIENT, THREE), f"-s {CLIENT}/32 -d {THREE}/32 -j RETURN", f"ip saddr {CLIENT} ip daddr {THREE} return"),
        (
            Rule("drop", None, TWO, 0.25),
            f"-d {TWO}/32 -m statistic --mode random --probability 0.250000 -j DROP",
            f"ip daddr {TWO} numgen random mod 1000000 < 250000 drop",
        ),
        (Rule("drop", ONE, None, 0.0), f"-s {ONE}/32 -m statistic --mode random --probability 0.000000 -j DROP",
         f"ip saddr {ONE} numgen random mod 1000000 < 0 drop"),
    ],
)
def test_rules_render_for_both_backends(rule: Rule, iptables: str, nft: str) -> None:
    # Goal: the exact rule text each backend receives.
    assert _iptables_rule(rule) == iptables
    assert _nft_rule(rule) == nft


@pytest.mark.parametrize("address", ["10.0.0.1", "192.168.1.1", "0.0.0.0", "127.0.0.0/8", "::1", "localhost"])
def test_rules_refuse_addresses_outside_loopback(address: str) -> None:
    # Goal: no rule can name anything outside 127.0.0.0/8.
    with pytest.raises(ValueError):
        check_loopback(address)
    with pytest.raises(ValueError):
        Rule("drop", address, None)


# -- tail corruption -------------------------------------------------------------

FRAME_PAYLOAD_BYTES = (100, 3000, 700, 2500)


def _segment_bytes(first_index: int, payload_bytes: tuple[int, ...]) -> tuple[bytes, list[tuple[int, int]]]:
    """Real frames (as storage writes them) and each frame's [start, end)."""
    data, bounds = b"", []
    for number, size in enumerate(payload_bytes):
        entry = Entry(Index(first_index + number), Term(2), EntryKind.META, bytes([number % 251]) * size)
        header, payload = encode_frame(entry, Offset(0), 0)
        bounds.append((len(data), len(data) + len(header) + len(payload)))
        data += header + payload
    return data, bounds


def _data_dir(root: Path) -> tuple[Path, dict[str, list[tuple[int, int]]]]:
    """Three groups, each with an older segment and a newest one; group 5's newest is empty."""
    data_dir = root / "node"
    bounds = {}
    for group in ("0", "3", "5"):
        directory = data_dir / "groups" / group
        directory.mkdir(parents=True)
        older, _ = _segment_bytes(1, FRAME_PAYLOAD_BYTES)
        (directory / f"{1:020d}.seg").write_bytes(older)
        newest, frame_bounds = _segment_bytes(5, FRAME_PAYLOAD_BYTES[: 2 + int(group) % 3])
        name = f"{5:020d}.seg"
        (directory / name).write_bytes(b"" if group == "5" else newest)
        bounds[f"groups/{group}/{name}"] = frame_bounds
    (data_dir / "groups" / "0" / "00000000000000000005.seg.part").write_bytes(b"partial")
    outside = root / "outside"
    outside.mkdir()
    (outside / f"{99:020d}.seg").write_bytes(b"x" * 5000)
    (data_dir / "groups" / "9").symlink_to(outside)  # a link out of data_dir: never followed
    return data_dir, bounds


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink() and "9" not in path.relative_to(root).parts
    }


@pytest.mark.parametrize("mode", faults.CORRUPT_MODES)
@pytest.mark.parametrize("seed", range(6))
def test_corrupt_tail_changes_exactly_what_it_reports(tmp_path: Path, mode: str, seed: int) -> None:
    # Goal: one newest segment changes, exactly as the description says; nothing else does.
    data_dir, bounds = _data_dir(tmp_path)
    before_digests = _digests(tmp_path)
    newest = {name: (data_dir / name).read_bytes() for name in bounds}
    corruption = faults.corrupt_tail(data_dir, mode, random.Random(seed))  # type: ignore[arg-type]
    changed = Path(corruption.path).relative_to(data_dir).as_posix()
    assert changed in bounds
    if mode != "garbage":
        assert changed != "groups/5/00000000000000000005.seg"  # nothing to cut or flip there
    after_digests = _digests(tmp_path)
    assert {name for name in before_digests if before_digests[name] != after_digests[name]} == {f"node/{changed}"}
    before, after = newest[changed], (data_dir / changed).read_bytes()
    assert (corruption.size_before, corruption.size_after) == (len(before), len(after))
    if mode == "truncate":
        start, end = bounds[changed][-1]
        assert start < len(after) < end, "cut inside the last frame"
        assert after == before[: len(after)] and corruption.position == len(after)
    elif mode == "garbage":
        assert after[: len(before)] == before and 1 <= len(after) - len(before) <= 4096
        assert corruption.position == len(before)
    else:
        differing = [i for i in range(len(before)) if before[i] != after[i]]
        start, end = bounds[changed][-1]
        assert differing == [corruption.position], "one byte changed"
        assert start + FRAME_HEADER_BYTES + BATCH_HEADER_BYTES <= corruption.position < end, "in the last frame, past its frame and batch headers"
        assert bin(before[corruption.position] ^ after[corruption.position]).count("1") == 1
    assert str(corruption).startswith(f"{mode} {corruption.path}: ")
    assert (tmp_path / "outside" / f"{99:020d}.seg").read_bytes() == b"x" * 5000


def test_corrupt_tail_spares_the_groups_it_is_told_to(tmp_path: Path) -> None:
    # Goal: the runner keeps damage to a minority of each group's replicas by sparing,
    # on one node, the groups it already damaged on another.
    data_dir, _ = _data_dir(tmp_path)
    for seed in range(20):
        corruption = faults.corrupt_tail(data_dir, "garbage", random.Random(seed), frozenset({"0", "5"}))
        assert Path(corruption.path).parent.name == "3"
    with pytest.raises(faults.NothingToCorrupt):
        faults.corrupt_tail(data_dir, "garbage", random.Random(0), frozenset({"0", "3", "5"}))


def test_corrupt_tail_picks_several_groups_and_refuses_empty_dirs(tmp_path: Path) -> None:
    # Goal: the group is random (not always group 0); a node with no segment is reported, not faked.
    data_dir, _ = _data_dir(tmp_path)
    chosen = set()
    for seed in range(20):
        corruption = faults.corrupt_tail(data_dir, "garbage", random.Random(seed))
        chosen.add(Path(corruption.path).parent.name)
    assert chosen == {"0", "3", "5"}
    empty = tmp_path / "empty"
    (empty / "groups" / "1").mkdir(parents=True)
    with pytest.raises(faults.NothingToCorrupt):
        faults.corrupt_tail(empty, "bitflip", random.Random(0))
    with pytest.raises(ValueError):
        faults.corrupt_tail(data_dir, "shred", random.Random(0))  # type: ignore[arg-type]


def test_every_three_corruptions_include_each_mode_in_a_seeded_order() -> None:
    # The skip-crc control is exposed only by a bitflip (truncation and garbage are
    # caught without checksums): a run with three or more corruptions always has one.
    from chaos.injectors import ModeDeck

    orders = set()
    for seed in range(20):
        deck = ModeDeck(faults.CORRUPT_MODES, random.Random(seed))
        drawn = [deck.draw() for _ in range(9)]
        for round_start in range(0, 9, 3):
            assert sorted(drawn[round_start:round_start + 3]) == sorted(faults.CORRUPT_MODES)
        again = ModeDeck(faults.CORRUPT_MODES, random.Random(seed))
        assert [again.draw() for _ in range(9)] == drawn, "the seed decides the order"
        orders.add(tuple(drawn[:3]))
    assert len(orders) > 1, "the order varies with the seed"
