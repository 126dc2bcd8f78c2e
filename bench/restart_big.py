"""Restart of nodes holding a big partition (issue 25): how long until it serves again.

A real 3-node cluster from the local launcher (127.0.0.1-3, ports 19800/19880 unless
told otherwise), one partition (RF 3) filled with `--mib` MiB of binary batches
(`--batch-kib` KiB each, records of 1 KiB). Then two restarts, each timed from the
start of the processes until a write is acknowledged (acks=quorum) and a read of
offset 0 and of the last offset written before the restart answer, through node 1:

- `one`: node 1 (the partition's leader if it led, else a follower) is killed
  (SIGKILL) and started again, the two others running;
- `all`: every node is killed and started again.

A restarted node replays its log into the partition's state machine (producer table,
offsets) before it serves from it; `--mib` sets how much there is to replay. Printed:
the fill, then per restart the time until node 1's HTTP port answers and until the
write and the reads succeed (issue 25's goal: at most 3 s for 1 GiB).

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/restart_big.py [--mib 1024] [--batch-kib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from storage.batch import Record, encode_batch

BATCH = "application/vnd.raftlog.batch"


async def _post(session: aiohttp.ClientSession, server: str, body: bytes) -> dict | None:
    try:
        async with asyncio.timeout(10), session.post(f"http://{server}/v1/topics/big/partitions/0/records",
                                                     data=body, headers={"Content-Type": BATCH}) as answer:
            return await answer.json() if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _read(session: aiohttp.ClientSession, server: str, offset: int) -> bool:
    try:
        async with asyncio.timeout(10), session.get(
                f"http://{server}/v1/topics/big/partitions/0/records",
                params={"offset": str(offset), "max_records": "1"}) as answer:
            if answer.status != 200:
                return False
            body = await answer.json()
            return bool(body.get("records")) and body["records"][0]["offset"] == offset
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False


async def _fill(session: aiohttp.ClientSession, server: str, mib: int, batch_kib: int) -> int:
    batch = encode_batch([Record(None, b"x" * 1024)] * batch_kib, first_timestamp_ms=1)
    last = -1
    for _ in range(mib * 1024 // batch_kib):
        for _attempt in range(100):
            answer = await _post(session, server, batch)
            if answer is not None:
                last = answer["base_offset"] + answer["count"] - 1
                break
            await asyncio.sleep(0.1)
    return last


async def _serving(session: aiohttp.ClientSession, server: str, last: int, began: float,
                   timeout_s: float) -> tuple[float, float]:
    answering = None
    probe = encode_batch([Record(None, b"after-restart")], first_timestamp_ms=1)
    while True:
        if time.monotonic() - began > timeout_s:
            raise SystemExit(f"bench: not serving after {timeout_s} s")
        try:
            async with asyncio.timeout(2), session.get(f"http://{server}/v1/health") as answer:
                if answering is None and answer.status < 500:
                    answering = time.monotonic() - began
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(0.05)
            continue
        if await _post(session, server, probe) is not None and await _read(session, server, 0) \
                and await _read(session, server, last):
            return answering, time.monotonic() - began
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace, cluster: LocalCluster) -> None:
    servers = cluster.http_addresses
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(30), session.post(f"http://{servers[0]}/v1/topics", json={
                "name": "big", "partitions": 1, "replication_factor": 3}) as answer:
            assert answer.status == 201, await answer.text()
        began = time.monotonic()
        last = -1
        while last < 0:
            last = await _fill(session, servers[0], args.mib, args.batch_kib)
        print(f"fill: {args.mib} MiB ({last + 1} records) in {time.monotonic() - began:.1f} s", flush=True)
        await asyncio.sleep(3)  # every replica applies it
        for mode in ("one", "all"):
            nodes = [1] if mode == "one" else [1, 2, 3]
            for node in nodes:
                cluster.kill_node(node)
            began = time.monotonic()
            for node in nodes:
                cluster.start_node(node)
            answering, serving = await _serving(session, servers[0], last, began, args.timeout)
            print(f"restart {mode:>3}: node 1 answering after {answering:.2f} s, serving writes and reads of "
                  f"offsets 0 and {last} after {serving:.2f} s (goal <= 3 s)", flush=True)
            await asyncio.sleep(3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--batch-kib", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--raft-port", type=int, default=19800)
    parser.add_argument("--http-port", type=int, default=19880)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-restart-big-"))
    cluster = LocalCluster(directory, 3, raft_port=args.raft_port, http_port=args.http_port)
    try:
        cluster.start()
        cluster.wait_healthy(60)
        asyncio.run(run(args, cluster))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
