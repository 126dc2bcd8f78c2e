"""A wiped follower catching up: by whole segment files (far horizon) against entry-by-entry
replay, measured in the same run (issue 25).

For each mode, a real 3-node cluster from the local launcher (127.0.0.1-3, ports 19700/
19780 unless told otherwise) with `far_catchup_lag_entries` and `_bytes` set through a config file: `files` (the
defaults, 20,000 entries or 32 MiB) and `replay` (0 and 0: never). One partition (RF 3) is filled
with `--mib` MiB of binary batches (`--batch-kib` KiB each, records of 1 KiB); then a
follower is killed (SIGKILL), its copy of the partition deleted from disk (the node's
database still says it had one: it comes back in repair, as after a replaced disk) and
it is started again. Printed per mode: the time until its HTTP port answers, the time
until its copy's high watermark equals the leader's (everything replicated and
applied), the MiB/s over the whole, and the path its log says it took
(`far_catchup_installed`). Then the ratio files / replay (issue 25's goal: at least 2).
The leader looks for far followers four times a second (catchup_leader.ROUND_S; twenty
while one is probed), and the core holds replay back meanwhile. Printed too, per mode: the
far-horizon events of the leader's and the follower's logs, in seconds from the restart
(`follower_lost_entries`: when the leader learned that the follower lost its log, the
same in both modes: before it, nothing can start; `far_stream_received`: the stream's
time; `far_catchup_installed`: staging and install). `--profile DIR` records both nodes
with py-spy (collapsed stacks per thread), `--logs DIR` keeps every node's log.

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/catchup.py [--mib 1024] [--batch-kib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from storage.batch import Record, encode_batch

BATCH = "application/vnd.raftlog.batch"
MODES = (("files", "far_catchup_lag_entries = 20000\nfar_catchup_lag_bytes = 33554432\n"),
         ("replay", "far_catchup_lag_entries = 0\nfar_catchup_lag_bytes = 0\n"))


async def _get(session: aiohttp.ClientSession, server: str, path: str) -> tuple[int, dict]:
    async with asyncio.timeout(30), session.get(f"http://{server}{path}") as answer:
        return answer.status, await answer.json()


async def _partition(session: aiohttp.ClientSession, server: str) -> dict | None:
    try:
        status, body = await _get(session, server, "/v1/topics/bulk")
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return body["partitions"][0] if status == 200 else None


async def _fill(session: aiohttp.ClientSession, server: str, mib: int, batch_kib: int) -> float:
    batch = encode_batch([Record(None, b"x" * 1024)] * batch_kib, first_timestamp_ms=1)
    began = time.monotonic()
    for _ in range(mib * 1024 // batch_kib):
        for _attempt in range(100):
            async with asyncio.timeout(30), session.post(f"http://{server}/v1/topics/bulk/partitions/0/records",
                                                         data=batch, headers={"Content-Type": BATCH}) as answer:
                if answer.status == 200:
                    break
            await asyncio.sleep(0.1)
    return time.monotonic() - began


async def _one(mode: str, args: argparse.Namespace, cluster: LocalCluster) -> dict:
    servers = cluster.http_addresses
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(30), session.post(f"http://{servers[0]}/v1/topics", json={
                "name": "bulk", "partitions": 1, "replication_factor": 3}) as answer:
            assert answer.status == 201, await answer.text()
        while (view := await _partition(session, servers[0])) is None or not view["leader"]:
            await asyncio.sleep(0.2)
        leader = view["leader"]
        filled_s = await _fill(session, servers[leader - 1], args.mib, args.batch_kib)
        while (view := await _partition(session, servers[leader - 1])) is None or \
                sorted(view["isr"] or []) != [1, 2, 3]:
            await asyncio.sleep(0.2)
        follower = next(n for n in (1, 2, 3) if n != leader)
        node = cluster.nodes[follower - 1]
        cluster.kill_node(follower)
        shutil.rmtree(node.data_dir / "groups" / str(view["group_id"]))
        target = view["high_watermark"]
        began, began_wall = time.monotonic(), time.time()
        cluster.start_node(follower)
        profilers = _profile(args, mode, {"leader": cluster.nodes[leader - 1], "follower": node})
        answering = None
        while True:
            mine = await _partition(session, servers[follower - 1])
            if mine is not None and answering is None:
                answering = time.monotonic() - began
            if mine is not None and mine["high_watermark"] == target:
                break
            if time.monotonic() - began > args.timeout:
                raise SystemExit(f"bench: {mode}: the follower did not catch up in {args.timeout} s")
            await asyncio.sleep(0.05)
        took = time.monotonic() - began
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(30)
    log = node.log_file.read_text(errors="replace")
    path = "files" if "far_catchup_installed" in log else "replay"
    for line in log.splitlines():
        if "far_catchup_installed" in line or "far_catchup_failed" in line:
            print(f"  {mode}: follower: {line.split(']', 1)[-1].strip()}")
    for role, local in (("leader", cluster.nodes[leader - 1]), ("follower", node)):
        for at, event in _timeline(local.log_file.read_text(errors="replace"), began_wall, view["group_id"]):
            print(f"  {mode}: {at:6.2f} s {role}: {event}")
    return {"mode": mode, "fill_s": filled_s, "answering_s": answering, "took_s": took, "path": path,
            "mib_per_s": args.mib / took, "mib_per_s_answering": args.mib / (took - answering)}


_EVENTS = ("node_started", "group_opened", "follower_lost_entries", "replica_repaired", "far_catchup_started", "far_catchup_done", "far_catchup_installed",
           "far_catchup_failed", "far_catchup_refused", "far_catchup_idle", "far_catchup_abandoned",
           "far_catchup_offer_again", "far_stream_fallback", "far_stream_failed", "far_stream_received", "far_install_started")


def _timeline(log: str, since: float, group_id: int) -> list[tuple[float, str]]:
    """The far-horizon events of a node's log (JSON lines) from `since` (wall clock) on."""
    events = []
    for line in log.splitlines():
        try:
            fields = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        event = fields.get("event")
        if event not in _EVENTS or fields.get("group_id", group_id) != group_id:
            continue
        at = datetime.datetime.fromisoformat(fields["timestamp"].replace("Z", "+00:00")).timestamp() - since
        if at >= 0:
            details = {k: v for k, v in fields.items()
                       if k not in ("event", "level", "timestamp", "node_id", "group_id", "logger")}
            events.append((at, f"{event} {details}" if details else event))
    return events


def _profile(args: argparse.Namespace, mode: str, nodes: dict) -> list[subprocess.Popen]:
    """py-spy on the leader and the follower from the restart to the catch-up (`--profile DIR`:
    collapsed stacks per thread, CPU samples only, the processes not paused)."""
    if args.profile is None:
        return []
    Path(args.profile).mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    return [subprocess.Popen([spy, "record", "--pid", str(local.process.pid), "--nonblocking", "--threads",
                              "--rate", "200", "--idle", "--format", "raw", "-o", f"{args.profile}/{mode}-{role}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for role, local in nodes.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="MiB in the partition")
    parser.add_argument("--batch-kib", type=int, default=64, help="KiB a batch (records of 1 KiB)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--raft-port", type=int, default=19700)
    parser.add_argument("--http-port", type=int, default=19780)
    parser.add_argument("--logs", help="a directory to keep the nodes' logs in")
    parser.add_argument("--profile", help="a directory for py-spy's stacks of the leader and the follower")
    args = parser.parse_args()
    results = []
    for mode, settings in MODES:
        directory = Path(tempfile.mkdtemp(prefix=f"bench-catchup-{mode}-"))
        config = directory / "node.toml"
        config.write_text(settings)
        cluster = LocalCluster(directory / "cluster", 3, raft_port=args.raft_port, http_port=args.http_port,
                               extra_args=("--config", str(config)))
        try:
            cluster.start()
            cluster.wait_healthy(60)
            result = asyncio.run(_one(mode, args, cluster))
        finally:
            cluster.stop()
            if args.logs is not None:  # every node's log, for a closer look
                for local in cluster.nodes:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    shutil.copy(local.log_file, Path(args.logs) / f"{mode}-node{local.node_id}.log")
        shutil.rmtree(directory, ignore_errors=True)
        results.append(result)
        print(f"{mode:>6}: filled {args.mib} MiB in {result['fill_s']:.1f} s; wiped follower answering after "
              f"{result['answering_s']:.1f} s, caught up after {result['took_s']:.1f} s "
              f"({result['mib_per_s']:.0f} MiB/s; {result['mib_per_s_answering']:.0f} MiB/s from answering), "
              f"path taken: {result['path']}", flush=True)
    files, replay = results
    print(f"ratio files / replay: {files['mib_per_s'] / replay['mib_per_s']:.2f} over the whole, "
          f"{files['mib_per_s_answering'] / replay['mib_per_s_answering']:.2f} from answering (goal >= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
