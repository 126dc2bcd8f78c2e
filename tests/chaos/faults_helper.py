"""Scenarios for tests/chaos/test_faults.py that must run inside the chaos namespaces.

    python -m tests.chaos.faults_helper SCENARIO [ARGUMENT]

Each scenario re-executes itself through `enter_namespaces` (so pytest never
enters a namespace), observes what the faults do, and prints one JSON object
on its last line; the test asserts on it. Exit status 3 with `{"error": ...}`:
the namespaces could not be created.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from chaos import faults

NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
CLIENT = faults.CLIENT_IP
ADDRESSES = (*NODES, CLIENT)
UDP_PORT = 47_101
TCP_PORT = 47_102
TCP_TIMEOUT_S = 0.7  # under one SYN retransmission (1 s): a dropped SYN fails, a slow host passes
UDP_SETTLE_S = 0.05
LOSS_BATCH = 50  # datagrams per burst: well under lo's default receive buffer


class Reachability:
    """UDP sockets on every address: one datagram per ordered pair shows who reaches whom."""

    def __init__(self) -> None:
        self.sockets: dict[str, socket.socket] = {}
        for address in ADDRESSES:
            handle = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            handle.bind((address, UDP_PORT))
            handle.setblocking(False)
            self.sockets[address] = handle

    def close(self) -> None:
        for handle in self.sockets.values():
            handle.close()

    def missing(self) -> list[str]:
        """Ordered pairs "source>target" whose datagram did not arrive."""
        for source in ADDRESSES:
            for target in ADDRESSES:
                if source != target:
                    self.sockets[source].sendto(f"{source}>{target}".encode(), (target, UDP_PORT))
        arrived = self._drain()
        expected = {f"{s}>{t}" for s in ADDRESSES for t in ADDRESSES if s != t}
        return sorted(expected - arrived)

    def delivered(self, source: str, target: str, count: int) -> int:
        received = 0
        for first in range(0, count, LOSS_BATCH):
            for number in range(first, min(count, first + LOSS_BATCH)):
                self.sockets[source].sendto(f"{number}".encode(), (target, UDP_PORT))
            received += len(self._drain())
        return received

    def _drain(self) -> set[str]:
        time.sleep(UDP_SETTLE_S)
        arrived = set()
        for handle in self.sockets.values():
            while True:
                try:
                    arrived.add(handle.recv(64).decode())
                except BlockingIOError:
                    break
        return arrived


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()


async def tcp_reaches(source: str, target: str) -> bool:
    """A whole TCP exchange (connect, send, echo) from `source` to `target` within the timeout."""
    try:
        async with asyncio.timeout(TCP_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(target, TCP_PORT, local_addr=(source, 0))
            try:
                writer.write(b"ping\n")
                return await reader.readline() == b"ping\n"
            finally:
                writer.close()
    except (TimeoutError, OSError):
        return False


async def tcp_matrix(pairs: list[tuple[str, str]]) -> dict[str, bool]:
    results = await asyncio.gather(*(tcp_reaches(s, t) for s, t in pairs))
    return {f"{s}>{t}": ok for (s, t), ok in zip(pairs, results, strict=True)}


async def network(backend: str) -> dict[str, object]:
    servers = [await asyncio.start_server(_echo, node, TCP_PORT) for node in NODES]
    probe = Reachability()
    network = faults.Network(backend)  # type: ignore[arg-type]
    one, two, three = NODES
    steps: dict[str, object] = {}

    async def observe(name: str, tcp: list[tuple[str, str]] = ()) -> None:  # type: ignore[assignment]
        steps[name] = {"missing": probe.missing(), "tcp": await tcp_matrix(list(tcp)), "active": network.active()}

    try:
        await observe("baseline", [(one, two), (CLIENT, one)])
        network.split([one], [two, three])
        await observe("split", [(one, two), (two, one), (two, three), (CLIENT, one)])
        network.heal()
        await observe("healed", [(one, two), (two, one)])
        network.one_way(one, two)
        await observe("one_way", [(one, two), (two, one), (one, three)])
        network.heal()
        fault = network.isolate(three)
        await observe("isolate", [(three, three), (CLIENT, three)])
        network.undo(fault)
        network.isolate(three, include_client=True)
        await observe("isolate_with_client")
        network.heal()
        network.isolate_client(one)
        await observe("isolate_client", [(CLIENT, one), (two, one)])
        network.heal()
        split = network.split([one], [two, three])
        network.loss([three], 1.0)
        network.undo(split)
        await observe("undo_keeps_others")
        network.heal()
        network.loss([two], 1.0)
        await observe("loss_all", [(one, two), (CLIENT, two), (one, three)])
        network.heal()
        network.loss([two], 0.0)
        steps["loss_none_delivered"] = probe.delivered(one, two, 200)
        network.heal()
        network.loss([two], 0.5)
        steps["loss_half_delivered"] = probe.delivered(one, two, 400)
        network.heal()
        await observe("final")
        steps["listing_after_heal"] = network.listing()
        network.close()
        steps["closed"] = True
    finally:
        probe.close()
        for server in servers:
            server.close()
            await server.wait_closed()
    return steps


def disk(directory: str) -> dict[str, object]:
    root = Path(directory)
    mount_point = root / "mnt"
    mount_point.mkdir()
    busy = root / "busy"
    busy.mkdir()
    (busy / "file").write_bytes(b"x")
    disk = faults.Disk()
    result: dict[str, object] = {}
    try:
        disk.mount_tmpfs(busy, 1 << 20)
    except faults.FaultError as error:
        result["refused_non_empty"] = str(error)
    try:
        disk.fill(root)
    except faults.FaultError as error:
        result["refused_foreign_fill"] = str(error)
    disk.mount_tmpfs(mount_point, 2 << 20)
    result["is_mount"] = os.path.ismount(mount_point)
    (mount_point / "before").write_bytes(bytes(8192))
    result["filled_bytes"] = disk.fill(mount_point)
    result["refilled_bytes"] = disk.fill(mount_point)
    result["write_when_full"] = _write_errno(mount_point / "data")
    result["freed_bytes"] = disk.free(mount_point)
    result["write_after_free"] = _write_errno(mount_point / "data")
    result["free_again"] = disk.free(mount_point)
    disk.unmount(mount_point)
    result["mounted_after_unmount"] = os.path.ismount(mount_point)
    return result


def _write_errno(path: Path) -> str:
    try:
        with open(path, "ab") as handle:
            handle.write(bytes(4096))
            handle.flush()
    except OSError as error:
        return errno.errorcode[error.errno or 0]
    return "ok"


def inside() -> dict[str, object]:
    faults.enter_namespaces(["-m", "tests.chaos.faults_helper", "inside"])  # again: idempotent
    with open("/proc/self/mountinfo") as handle:
        shm = [line for line in handle if line.split()[4] == "/dev/shm"]
    return {
        "status": faults.namespace_status().reason,
        "inside": faults.namespace_status().inside,
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "shm_is_tmpfs": bool(shm) and " - tmpfs " in shm[-1],
    }


def main() -> int:
    scenario, *arguments = sys.argv[1:]
    try:
        faults.enter_namespaces(["-m", "tests.chaos.faults_helper", *sys.argv[1:]])
    except faults.NamespaceUnavailable as error:
        print(json.dumps({"error": str(error)}))
        return 3
    if scenario == "capabilities":
        result: object = faults.Capabilities.detect().to_json()
    elif scenario == "network":
        result = asyncio.run(network(arguments[0]))
    elif scenario == "disk":
        result = disk(arguments[0])
    elif scenario == "inside":
        result = inside()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
