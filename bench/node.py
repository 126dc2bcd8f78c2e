"""A real 3-node raftlog cluster on this machine: produce throughput, latency, failover, idle cost.

Starts three `raftlog serve` processes (127.0.0.1-3, fsync on, replication
factor 3) with the local launcher, drives them over HTTP from this one client
process (the nodes and this client run on uvloop), and prints:

- produce throughput: 100-byte records in 1,000-record binary batches to one
  partition, acks=quorum, `--window` requests in flight (target >= 300,000 rec/s);
- the box's limit for that produce, measured in the same run: the disk's
  sequential write + fsync bandwidth over RF 3 x 100 B, and the ratio (goal >= 0.8);
- JSON produce throughput (1,000 string records per request), for comparison;
- consume throughput of those records from one partition over HTTP, binary
  (target >= 1,000,000 rec/s) and JSON (target >= 100,000 rec/s);
- sequential single-record produce latency p50/p99 (target p99 <= 3 ms);
- failover: the longest gap between acknowledged writes while the partition
  leader is killed with SIGKILL (target <= 1 s);
- idle cost: CPU per node process with `--idle-partitions` partitions x RF 3
  quiesced (target <= 5 % of one core).

Baseline: NATS JetStream R=3 run by the peer kit's `nats_bench.py` in the same
invocation with `--nats-kit DIR` (a writable copy of `../shared/peers` on which
`setup.sh` ran: `cp -r ../shared/peers /tmp/peers-kit && /tmp/peers-kit/setup.sh`);
without it the figure the kit recorded on this machine is printed, marked so.
NATS does not fsync its writes, so with the kit the sequential latency is also
measured against etcd (3 members, Raft, an fsync per write: the closest peer to
what raftlog promises), the same number of sequential puts through its HTTP
gateway, in the same invocation.

    .venv/bin/python bench/node.py [--seconds 10] [--window 8] [--nats-kit /tmp/peers-kit]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient, RaftlogError
from storage.batch import Record, encode_batch

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
RECORDS_PER_BATCH = 1000
RECORD_BYTES = 100


def batch_of(records: int, tag: int) -> bytes:
    value = (b"%08d" % tag) + b"x" * (RECORD_BYTES - 8)
    return encode_batch([Record(None, value)] * records, first_timestamp_ms=int(time.time() * 1000))


async def leader_server(client: AsyncClient, cluster: LocalCluster, topic: str, partition: int) -> str:
    """The HTTP address of the partition leader (the client would be told so by a 421 anyway)."""
    for _ in range(200):
        description = await client.describe_topic(topic)
        leader = description["partitions"][partition].get("leader")
        if leader:
            return cluster.nodes[int(leader) - 1].http_addr
        await asyncio.sleep(0.05)
    raise RuntimeError("no partition leader")


async def throughput(servers: list[str], topic: str, seconds: float, window: int) -> float:
    batches = [batch_of(RECORDS_PER_BATCH, i) for i in range(16)]
    acknowledged = 0
    deadline = time.monotonic() + seconds

    async def worker(client: AsyncClient, worker_id: int) -> None:
        nonlocal acknowledged
        sent = worker_id
        while time.monotonic() < deadline:
            answer = await client.produce_batch(topic, 0, batches[sent % len(batches)])
            acknowledged += answer["count"]
            sent += 1

    async with AsyncClient(servers) as client:
        began = time.monotonic()
        await asyncio.gather(*(worker(client, w) for w in range(window)))
        return acknowledged / (time.monotonic() - began)


async def json_throughput(servers: list[str], topic: str, seconds: float, window: int) -> float:
    """JSON produce: 1,000 100-byte string records per request to one partition."""
    records = [{"value": "x" * RECORD_BYTES, "partition": 0} for _ in range(RECORDS_PER_BATCH)]
    acknowledged = 0
    deadline = time.monotonic() + seconds

    async def worker(client: AsyncClient) -> None:
        nonlocal acknowledged
        while time.monotonic() < deadline:
            offsets = await client.produce(topic, records, format="string")
            acknowledged += len(offsets)

    async with AsyncClient(servers) as client:
        began = time.monotonic()
        await asyncio.gather(*(worker(client) for _ in range(window)))
        return acknowledged / (time.monotonic() - began)


async def consume_rate(server: str, topic: str, seconds: float, binary: bool) -> float:
    """Records/s reading one partition from offset 0, sequentially, from one replica."""
    records = 0
    offset = 0
    async with AsyncClient([server], timeout_s=60) as client:
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            if binary:
                read = await client.consume_batches(topic, 0, offset, max_records=100_000, max_bytes=8 << 20)
                next_offset, high_watermark = read.next_offset, read.high_watermark
            else:
                answer = await client.consume(topic, 0, offset, max_records=10_000, max_bytes=8 << 20, format="string")
                next_offset, high_watermark = answer["next_offset"], answer["high_watermark"]
            records += next_offset - offset
            offset = next_offset if next_offset < high_watermark else 0
        return records / (time.monotonic() - began)


async def latency(servers: list[str], topic: str, count: int) -> tuple[float, float]:
    one = batch_of(1, 0)
    samples = []
    async with AsyncClient(servers) as client:
        for _ in range(50):
            await client.produce_batch(topic, 0, one)
        for _ in range(count):
            began = time.perf_counter()
            await client.produce_batch(topic, 0, one)
            samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


async def failover(cluster: LocalCluster, topic: str, seconds_after: float) -> tuple[float, int]:
    """Write sequentially; kill -9 the leader; the longest gap between acknowledgements."""
    servers = cluster.http_addresses
    one = batch_of(10, 1)
    acknowledged: list[float] = []
    stop_at = [float("inf")]

    async def writer(client: AsyncClient) -> None:
        while time.monotonic() < stop_at[0]:
            try:
                await client.produce_batch(topic, 0, one)
                acknowledged.append(time.monotonic())
            except RaftlogError:
                await asyncio.sleep(0.01)

    async with AsyncClient(servers, timeout_s=5.0, attempts=50, backoff_s=0.01, backoff_max_s=0.1) as client:
        leader_http = await leader_server(client, cluster, topic, 0)
        task = asyncio.create_task(writer(client))
        await asyncio.sleep(1.0)
        victim = next(n for n in cluster.nodes if n.http_addr == leader_http)
        killed_at = time.monotonic()
        cluster.kill_node(victim.node_id)
        stop_at[0] = killed_at + seconds_after
        await task
    window = [t for t in acknowledged if t >= killed_at - 1.0]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    return max(gaps, default=float("inf")), victim.node_id


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_cost(cluster: LocalCluster, partitions: int, measure_s: float) -> list[float]:
    async with AsyncClient(cluster.http_addresses, timeout_s=120) as client:
        await client.create_topic("idle", partitions=partitions, replication_factor=3)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            # Steady state: every group quiet and leadership back on the preferred replicas
            # (until then the balancer moves leaders every few seconds, waking their groups).
            metrics = [await _quiesced(client, server) for server in cluster.http_addresses]
            leaders = [await _metric(server, "raftlog_node_leaders") for server in cluster.http_addresses]
            if all(m >= partitions for m in metrics) and min(leaders) >= partitions // len(leaders) - 1:
                break
            await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"groups did not settle: quiet {metrics}, leaders {leaders}")
    pids = [int(n.pid_file.read_text()) for n in cluster.nodes]
    before = [cpu_seconds(p) for p in pids]
    await asyncio.sleep(measure_s)
    return [(cpu_seconds(p) - b) / measure_s for p, b in zip(pids, before, strict=True)]


async def _quiesced(client: AsyncClient, server: str) -> int:
    return await _metric(server, "raftlog_quiesced_groups")


async def _metric(server: str, name: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"http://{server}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return 0


def nats_baseline(kit: Path | None) -> str:
    """NATS JetStream R=3 figures: run now from a writable copy of the peer kit, or recorded."""
    if kit is not None and (kit / ".venv" / "bin" / "python").exists():
        output = subprocess.run(
            [str(kit / ".venv" / "bin" / "python"), "nats_bench.py", "--reps", "1", "--n", "100000",
             "--lat-n", "2000", "--only", "pub,lat,failover"],
            cwd=kit, capture_output=True, text=True, timeout=1200, check=False,
        )
        wanted = ("pub100_msgs_per_s", "lat_p50_ms", "lat_p99_ms", "max_gap_ms")
        lines = [line.split()[0] + " " + line.split()[1] for line in output.stdout.splitlines()
                 if line.split() and line.split()[0] in wanted]
        if lines:
            return "NATS JetStream R=3, this run (no fsync; 100 B publishes, window 1024): " + "; ".join(lines)
        return f"NATS baseline run failed (exit {output.returncode}): {output.stderr.strip()[-300:]}"
    if not (PEERS / "results" / "nats.json").exists():
        return f"NATS baseline: no --nats-kit given and no recorded figures at {PEERS / 'results'}"
    recorded = json.loads((PEERS / "results" / "nats.json").read_text())
    rates = sorted(r["pub100"]["msgs_per_s"] for r in recorded["runs"] if "pub100" in r)
    p99 = sorted(r["lat"]["p99_ms"] for r in recorded["runs"] if "lat" in r)
    return (f"NATS JetStream R=3 (recorded by ../shared/peers on this machine, not this run): "
            f"publish 100 B median {statistics.median(rates):,.0f} msg/s, sequential p99 {statistics.median(p99):.2f} ms")


# Run in the kit's own environment (its etcd_bench module starts and stops the members by PID).
_ETCD_SEQUENTIAL = """
import json, sys, etcd_bench
cluster = etcd_bench.Cluster()
try:
    cluster.start()
    print(json.dumps(etcd_bench.seq_puts(cluster.leader(), int(sys.argv[1]))))
finally:
    cluster.stop()
"""


def etcd_latency(kit: Path | None, count: int, our_p99: float) -> str | None:
    """etcd's sequential put latency, this run: a Raft log that fsyncs every write, as ours."""
    if kit is None or not (kit / "etcd_bench.py").exists() or not (kit / ".venv" / "bin" / "python").exists():
        return None
    output = subprocess.run(
        [str(kit / ".venv" / "bin" / "python"), "-c", _ETCD_SEQUENTIAL, str(count)],
        cwd=kit, capture_output=True, text=True, timeout=600, check=False,
    )
    lines = output.stdout.strip().splitlines()
    try:
        figures = json.loads(lines[-1])
        p50, p99 = float(figures["p50_ms"]), float(figures["p99_ms"])
    except (IndexError, ValueError, KeyError, TypeError):
        return f"etcd baseline run failed (exit {output.returncode}): {output.stderr.strip()[-300:]}"
    return (f"etcd 3 members (Raft, fsync per write), this run: {count} sequential 100 B puts through its HTTP "
            f"gateway: p50 {p50:.2f} ms, p99 {p99:.2f} ms (raftlog's p99 / etcd's: {our_p99 / p99:.2f})")


DISK_LIMIT_BYTES = 256 * 1024 * 1024


def disk_limit(directory: Path, record_bytes: int = 100, replicas: int = 3) -> tuple[float, float]:
    """The box's physical limit for replicated produce, measured now on the nodes' disk:
    sequential write + fsync bandwidth (256 MiB in 1 MiB writes, one fsync at the end,
    as ../shared/peers/limits.py does) over the bytes the cluster writes per record
    (`replicas` copies of `record_bytes`). Returns (MB/s, records/s)."""
    path = directory / "disk-limit.bin"
    chunk = os.urandom(1024 * 1024)
    began = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < DISK_LIMIT_BYTES:
            written += os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    per_s = written / (time.perf_counter() - began)
    return per_s / 1e6, per_s / (replicas * record_bytes)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--window", type=int, default=8, help="produce requests in flight")
    parser.add_argument("--latency-count", type=int, default=2000)
    parser.add_argument("--idle-partitions", type=int, default=1000)
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--nats-kit", type=Path, help="a writable copy of ../shared/peers after its setup.sh: "
                        "run the NATS baseline in this invocation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-") as directory:
        cluster = LocalCluster(Path(directory), 3, raft_port=17100, http_port=18080)
        cluster.start()
        try:
            cluster.wait_healthy(60)
            async with AsyncClient(cluster.http_addresses, timeout_s=60) as client:
                await client.create_topic("bench", partitions=1, replication_factor=3)
                leader = await leader_server(client, cluster, "bench", 0)
            rate = await throughput([leader], "bench", args.seconds, args.window)
            print(f"produce 100 B x {RECORDS_PER_BATCH}/batch, acks=quorum, window {args.window}: "
                  f"{rate:,.0f} records/s (target 300,000: {rate / 300_000:.2f}x)", flush=True)
            disk_mb_s, limit = disk_limit(Path(directory))
            print(f"disk limit, this run: sequential write + fsync {disk_mb_s:,.0f} MB/s / (RF 3 x 100 B) = "
                  f"{limit:,.0f} records/s; binary produce / limit: {rate / limit:.2f} (goal >= 0.8)", flush=True)
            json_rate = await json_throughput([leader], "bench", args.seconds / 2, args.window)
            print(f"produce JSON (string format, 1,000 records of 100 B per request): {json_rate:,.0f} records/s",
                  flush=True)
            for binary in (True, False):
                consumed = await consume_rate(leader, "bench", args.seconds / 2, binary)
                target = 1_000_000 if binary else 100_000
                print(f"consume one partition, {'binary' if binary else 'JSON (string format)'}: "
                      f"{consumed:,.0f} records/s (target {target:,}: {consumed / target:.2f}x)", flush=True)
            p50, p99 = await latency([leader], "bench", args.latency_count)
            print(f"sequential single-record produce: p50 {p50:.2f} ms, p99 {p99:.2f} ms (target p99 <= 3 ms)", flush=True)
            gap, victim = await failover(cluster, "bench", 5.0)
            print(f"failover: leader node {victim} killed with SIGKILL; longest gap between acknowledged "
                  f"writes {gap * 1000:.0f} ms (target <= 1000 ms)", flush=True)
            cluster.start_node(victim)
            cluster.wait_healthy(60)
            if not args.skip_idle:
                usage = await idle_cost(cluster, args.idle_partitions, 10.0)
                print(f"idle: {args.idle_partitions} partitions x RF 3 quiesced; CPU per node "
                      + ", ".join(f"{u * 100:.1f} %" for u in usage) + " of one core (target <= 5 %)", flush=True)
        finally:
            cluster.stop()
    print(nats_baseline(args.nats_kit), flush=True)
    etcd = etcd_latency(args.nats_kit, args.latency_count, p99)
    if etcd is not None:
        print(etcd, flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(uvloop.run(main()))  # the client on uvloop, like the nodes
