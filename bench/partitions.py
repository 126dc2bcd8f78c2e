"""Produce over one partition vs spread over eight (issue 26), same cluster, same run.

A real 3-node cluster (the local launcher, 127.0.0.1-3, ports 19300/19380 unless
told otherwise), RF 3, acks=quorum, fsync on. Topic `one` has one partition,
topic `eight` eight (their leaders spread over the nodes by the balancer). Every
request carries 1,000 records of 100 B; `--window` requests are in flight. Legs,
interleaved `--rounds` times so the box's hour hits them alike:

- `json-1`: JSON (string format) to `one`, sent to its leader;
- `json-8`: JSON with keys spread (`murmur2(key) % 8`) to `eight`, requests spread
  over the three nodes (each splits a request into 8 batches and forwards the
  ones it does not lead);
- `json-8-routed`: JSON to `eight`, but each request goes to one leader and holds
  only records of partitions that node leads (explicit `partition`): the split
  without the forwarding;
- `bin-1`: a binary batch of 1,000 records to `one`'s leader;
- `bin-8`: binary batches of 1,000 records, each worker to one partition of
  `eight` (worker w to partition w % 8), to that partition's leader.

Per leg: records/s, the ratio to its one-partition leg, CPU seconds per million
records summed over the three nodes (and per node), flushes (group-commit
fsync rounds, `raftlog_fsync_seconds_count`, and their mean duration) and
transport frames per 1,000 records. The box is shared: read the ratios, CPU per record and counts before
the absolute rates.

`--profile LEG`: after the legs, run LEG again while `py-spy record --format raw`
samples every node for `--profile-seconds`; the raw (collapsed) stacks land in
`--profile-dir`, and a summary of each node's inclusive shares for the frames
that matter here is printed (bench/partitions.py --summarize FILE prints it again).

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/partitions.py [--seconds 6] [--rounds 2]
        [--profile json-8 --profile-dir /tmp/partitions-profile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient
from multiraft.state.partitioner import partition_for_key
from storage.batch import Record, encode_batch

RECORDS = 1000
RECORD_BYTES = 100
PARTITIONS = 8
LEGS = ("json-1", "json-8", "json-8-routed", "bin-1", "bin-8")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
PY_SPY = Path(sys.executable).parent / "py-spy"
# Frames whose inclusive share the profile summary prints (substring of "function (file:line)").
FRAMES = {
    "http produce_topic": "produce_topic (multiraft/http/handlers/produce.py",
    "http produce_partition": "produce_partition (multiraft/http/handlers/produce.py",
    "JSON parse (json_object)": "json_object (multiraft/http/params.py",
    "parse_records": "parse_records (multiraft/http/records.py",
    "encode_records": "encode_records (multiraft/http/records.py",
    "_assign (partitioning)": "_assign (multiraft/http/handlers/produce.py",
    "json_response": "json_response (",
    "node produce (forward)": "call_peer (multiraft/node/routing.py",
    "rpc serve (forwarded in)": "serve (multiraft/node/produce.py",
    "rpc serve_many (forwarded in)": "serve_many (multiraft/node/produce.py",
    "validate batch": "validate_off_loop (multiraft/node/batch_checks.py",
    "group _drain": "_drain (multiraft/runtime/group.py",
    "group _handle_ready": "_handle_ready (multiraft/runtime/group.py",
    "process_ready": "process_ready (multiraft/runtime/ready_processor.py",
    "core step": "step (raftlog/core/raft.py",
    "core ready()": "ready (raftlog/core/raft.py",
    "storage append": "append (storage/segments.py",
    "flusher": "(multiraft/runtime/flusher.py",
    "fsync (os.fsync)": "fsync (",
    "state db write": "write (storage/kv.py",
    "apply (state machine)": "apply (multiraft/state/partition.py",
    "wire encode": "encode_message (raftlog/wire.py",
    "wire decode": "decode_message (raftlog/wire.py",
    "transport inbound": "(multiraft/transport/inbound.py",
    "transport peer_link": "(multiraft/transport/peer_link.py",
    "ticker": "(multiraft/node/ticker.py",
    "aiohttp server": "(aiohttp/web_protocol.py",
}


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid` so far, every thread."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


async def metrics(session: aiohttp.ClientSession, server: str) -> dict[str, float]:
    wanted = ("raftlog_fsync_seconds_count", "raftlog_fsync_seconds_sum", "raftlog_transport_frames_in_total",
              "raftlog_replicate_seconds_count", "raftlog_tree_sidecar_warmer_bytes_hashed_total")
    async with session.get(f"http://{server}/metrics") as response:
        text = await response.text()
    found = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in found:
            found[name] = float(value)
    return found


class Topology:
    """Who leads what, and the request bodies of every leg."""

    def __init__(self, cluster: LocalCluster, leader_one: str, leaders_eight: dict[int, str]) -> None:
        self.servers = cluster.http_addresses
        self.leader_one = leader_one
        self.leaders_eight = leaders_eight  # partition -> leader's HTTP address
        value = "x" * RECORD_BYTES
        self.json_one = [{"value": value, "partition": 0} for _ in range(RECORDS)]
        # Keys chosen so that murmur2 spreads them evenly over the eight partitions.
        keys: dict[int, list[str]] = collections.defaultdict(list)
        for i in itertools.count():
            key = f"key-{i}"
            partition = partition_for_key(key.encode(), PARTITIONS)
            if len(keys[partition]) < RECORDS // PARTITIONS:
                keys[partition].append(key)
            if sum(len(k) for k in keys.values()) == RECORDS:
                break
        spread = [key for group in itertools.zip_longest(*keys.values()) for key in group if key]
        self.json_keys = [{"key": key, "value": value} for key in spread]
        self.routed: dict[str, list[dict]] = {}  # leader -> 1,000 records over the partitions it leads
        for server in sorted(set(leaders_eight.values())):
            led = [p for p, s in sorted(leaders_eight.items()) if s == server]
            self.routed[server] = [{"value": value, "partition": led[i % len(led)]} for i in range(RECORDS)]
        self.batch = encode_batch([Record(None, value.encode())] * RECORDS, first_timestamp_ms=int(time.time() * 1000))


def leg_worker(leg: str, topology: Topology, client_for: Callable[[str], AsyncClient],
               worker: int) -> Callable[[], Awaitable[int]]:
    """One request of `leg` for worker `worker`; returns the records acknowledged."""
    t = topology
    if leg == "json-1":
        client = client_for(t.leader_one)
        return lambda: _json(client, "one", t.json_one)
    if leg == "json-8":
        client = client_for(t.servers[worker % len(t.servers)])
        return lambda: _json(client, "eight", t.json_keys)
    if leg == "json-8-routed":
        server = sorted(t.routed)[worker % len(t.routed)]
        client = client_for(server)
        return lambda: _json(client, "eight", t.routed[server])
    if leg == "bin-1":
        client = client_for(t.leader_one)
        return lambda: _binary(client, "one", 0, t.batch)
    partition = worker % PARTITIONS
    client = client_for(t.leaders_eight[partition])
    return lambda: _binary(client, "eight", partition, t.batch)


async def _json(client: AsyncClient, topic: str, records: list[dict]) -> int:
    return len(await client.produce(topic, records, format="string"))


async def _binary(client: AsyncClient, topic: str, partition: int, batch: bytes) -> int:
    return int((await client.produce_batch(topic, partition, batch))["count"])


class Leg:
    def __init__(self, name: str) -> None:
        self.name = name
        self.records = 0
        self.seconds = 0.0
        self.cpu = [0.0, 0.0, 0.0]
        self.cpu_system = 0.0  # of sum(cpu): in the kernel (syscalls: sockets, writes, fsyncs)
        self.cpu_client = 0.0  # this process (the load's client) meanwhile: the box's other share
        self.counters: dict[str, float] = collections.defaultdict(float)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


async def run_leg(leg: Leg, topology: Topology, cluster: LocalCluster, window: int, seconds: float) -> None:
    pids = [n.process.pid for n in cluster.nodes if n.process is not None]
    clients: dict[str, AsyncClient] = {}

    def client_for(server: str) -> AsyncClient:
        if server not in clients:
            clients[server] = AsyncClient([server], timeout_s=60)
        return clients[server]

    requests = [leg_worker(leg.name, topology, client_for, w) for w in range(window)]
    deadline = time.monotonic() + seconds
    done = 0

    async def loop(request: Callable[[], Awaitable[int]]) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            acked = await request()  # never `done += await ...`: that reads `done` before the
            done += acked  # await and writes back a stale sum, losing the other workers' counts

    async with aiohttp.ClientSession() as session:
        before = [await metrics(session, s) for s in topology.servers]
        cpu_before = [cpu_split(p) for p in pids]
        client_before = time.process_time()
        began = time.monotonic()
        try:
            await asyncio.gather(*(loop(r) for r in requests))
        finally:
            for client in clients.values():
                await client.close()
        elapsed = time.monotonic() - began
        leg.cpu_client += time.process_time() - client_before
        cpu_after = [cpu_split(p) for p in pids]
        after = [await metrics(session, s) for s in topology.servers]
    leg.records += done
    leg.seconds += elapsed
    for i, (b, a) in enumerate(zip(cpu_before, cpu_after, strict=True)):
        leg.cpu[i] += sum(a) - sum(b)
        leg.cpu_system += a[1] - b[1]
    for b, a in zip(before, after, strict=True):
        for name in a:
            leg.counters[name] += a[name] - b[name]


def report(legs: dict[str, Leg]) -> None:
    base = {kind: legs[f"{kind}-1"].rate if f"{kind}-1" in legs else 0.0 for kind in ("json", "bin")}
    for name, leg in legs.items():
        if not leg.records:
            continue
        per_million = 1e6 / leg.records
        cpu = sum(leg.cpu) * per_million
        per_node = "/".join(f"{c * per_million:.1f}" for c in leg.cpu)
        ratio = leg.rate / base[name.split("-")[0]] if base[name.split("-")[0]] else 0.0
        counters = leg.counters
        system = leg.cpu_system * 100 / max(sum(leg.cpu), 1e-9)
        print(f"{name:14s} {leg.rate:10,.0f} rec/s  x{ratio:4.2f} of {name.split('-')[0]}-1   "
              f"CPU {cpu:5.1f} s per M records (nodes {per_node}; {system:.0f} % system; client "
              f"{leg.cpu_client * per_million:.1f}; box {(sum(leg.cpu) + leg.cpu_client) / leg.seconds:.2f} cores)   "
              "per 1k records: "
              f"flushes {counters['raftlog_fsync_seconds_count'] * 1000 / leg.records:5.2f} "
              f"(mean {counters['raftlog_fsync_seconds_sum'] * 1000 / max(1, counters['raftlog_fsync_seconds_count']):.2f} ms), "
              f"proposals committed {counters['raftlog_replicate_seconds_count'] * 1000 / leg.records:5.2f}, "
              f"frames in {counters['raftlog_transport_frames_in_total'] * 1000 / leg.records:5.1f}, "
              f"sidecar bytes hashed per record "
              f"{counters['raftlog_tree_sidecar_warmer_bytes_hashed_total'] / leg.records:5.0f}", flush=True)


async def settle_leaders(client: AsyncClient, cluster: LocalCluster) -> tuple[str, dict[int, str]]:
    """Leaders home (balanced), then who leads `one` and each partition of `eight`."""
    http = {n.node_id: n.http_addr for n in cluster.nodes}
    for _ in range(120):
        await client.balance_leaders()
        await asyncio.sleep(1.0)
        one = (await client.describe_topic("one"))["partitions"]
        eight = (await client.describe_topic("eight"))["partitions"]
        if all(p.get("leader") for p in one + eight):
            homes = {p["partition"]: p["replicas"][0] for p in eight}
            if all(p["leader"] == homes[p["partition"]] for p in eight):
                return http[int(one[0]["leader"])], {p["partition"]: http[int(p["leader"])] for p in eight}
    raise RuntimeError("leaders did not settle")


def profile(cluster: LocalCluster, directory: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    directory.mkdir(parents=True, exist_ok=True)
    spies = []
    for node in cluster.nodes:
        assert node.process is not None
        output = directory / f"node{node.node_id}.txt"
        spies.append(subprocess.Popen(
            [str(PY_SPY), "record", "-d", str(int(seconds)), "-r", "200", "-p", str(node.process.pid),
             "--format", "raw", "-o", str(output), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def summarize(path: Path, top: int = 25) -> str:
    """Inclusive shares of FRAMES and the top self frames of one raw py-spy profile."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue  # a sampled frame's text may hold a newline (py-spy shows locals' reprs)
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for label, needle in FRAMES.items():
            if any(needle in frame for frame in frames):
                inclusive[label] += count
    lines = [f"{path.name}: {total} samples"]
    lines += [f"  {count * 100 / total:5.1f} % incl  {label}" for label, count in inclusive.most_common()]
    lines += [f"  {count * 100 / total:5.1f} % self  {frame}" for frame, count in own.most_common(top)]
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="per leg per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=int, default=8, help="requests in flight")
    parser.add_argument("--legs", default=",".join(LEGS))
    parser.add_argument("--raft-port", type=int, default=19300)
    parser.add_argument("--http-port", type=int, default=19380)
    parser.add_argument("--profile", choices=LEGS)
    parser.add_argument("--profile-seconds", type=float, default=10.0)
    parser.add_argument("--profile-dir", type=Path, default=Path("/tmp/partitions-profile"))
    parser.add_argument("--summarize", type=Path, nargs="*", help="only print the summary of these raw profiles")
    args = parser.parse_args()
    if args.summarize:
        for path in args.summarize:
            print(summarize(path))
        return 0
    directory = Path(tempfile.mkdtemp(prefix="raftlog-partitions-"))
    cluster = LocalCluster(directory, 3, raft_port=args.raft_port, http_port=args.http_port)
    cluster.start()
    try:
        await asyncio.to_thread(cluster.wait_healthy, 60)
        async with AsyncClient(cluster.http_addresses, timeout_s=60) as client:
            await client.create_topic("one", partitions=1, replication_factor=3)
            await client.create_topic("eight", partitions=PARTITIONS, replication_factor=3)
            leader_one, leaders_eight = await settle_leaders(client, cluster)
        topology = Topology(cluster, leader_one, leaders_eight)
        print(f"leaders: one -> {leader_one}; eight -> "
              + ", ".join(f"{p}:{s.split(':')[0]}" for p, s in sorted(leaders_eight.items())), flush=True)
        names = [n for n in args.legs.split(",") if n]
        legs = {name: Leg(name) for name in LEGS if name in names}
        for _ in range(args.rounds):
            for name in legs:
                await run_leg(legs[name], topology, cluster, args.window, args.seconds)
        print(f"window {args.window}, {args.rounds} x {args.seconds:.0f} s per leg, 1,000 x 100 B records "
              "per request, RF 3, acks=quorum", flush=True)
        report(legs)
        if args.profile:
            spies = profile(cluster, args.profile_dir, args.profile_seconds)
            await asyncio.sleep(1.0)  # py-spy attached before the load starts
            extra = Leg(args.profile)
            await run_leg(extra, topology, cluster, args.window, args.profile_seconds)
            for spy in spies:
                spy.wait(args.profile_seconds + 30)
            print(f"profiled {args.profile}: {extra.rate:,.0f} rec/s while sampled", flush=True)
            for node in cluster.nodes:
                path = args.profile_dir / f"node{node.node_id}.txt"
                if path.exists():
                    print(summarize(path), flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(uvloop.run(main()))
