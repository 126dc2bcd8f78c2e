"""Mirrors between two real clusters (issue 24): lag at a steady rate, backlog catch-up, full sync.

Two 3-node clusters from the local launcher on this box, loopback only: the source on
127.0.0.1-3 ports 19900/19980, the sink on 127.0.0.1-3 ports 19950/19990 (unless told
otherwise). Links are made with the real CLI (`raftlog mirror create`, `pause`, `verify`)
against the sink; everything else is the HTTP API of docs/http.md.

1. **Lag.** A producer writes binary batches of `--batch-records` records of 100 bytes
   (default 100) to partition 0 of a source topic every `batch / --rate` seconds (default
   10 ms: 10,000 records/s), up to `--inflight` requests in flight, each acknowledged at
   `acks=quorum` (the default), as a client batching on a 10 ms linger would. First alone
   (topic `alone`, no mirror: the baseline), then on topic `live` mirrored by link `live`.
   A reader long-polls the sink's consume API (`GET .../records?wait_ms=500`, on the sink
   partition's leader) and notes when each offset appears. Per batch (its records are
   acknowledged together and appear together, so per-record percentiles are the same):
   the time from the producer's acknowledgement at the source to its appearance in the
   sink; p50/p99/max, the achieved rate, and the producer's own latency beside the
   baseline's.
2. **Backlog catch-up.** Topic `bulk` (one partition, RF 3) is filled with `--backlog-mib`
   MiB of 100-byte records in identical batches of `--fill-records`; then link `bulk` is
   created and the mirror status is polled every 0.2 s until the partition's position
   equals the source's high watermark: MB/s over the copy (from the first copied bytes)
   and over the whole (from the create). Then the two legs of the pull's round trip,
   each alone, 1 MiB at a time: the source's `/log` read and the sink's commit of 1 MiB.
3. **Full sync.** `raftlog mirror verify bulk --no-repair` of the identical partitions, timed
   around the CLI, with its time on the sink leader (the link's status, `last_verify`);
   then a second verify through the HTTP route for its report (bytes hashed). Then one committed batch is made to
   differ, from outside the processes: the link is paused, the source topic deleted and
   filled again with the same batches except one, in the middle (same record count, other
   values), so the copies differ in exactly that batch; verified again (report only), then
   with repair (a resync that keeps the identical prefix below the difference and copies
   the rest again), timed until the mirror is identical, with the sink nodes' events of
   the repair from their logs (resync, prefix kept, group opened, leader).

For each phase: the CPU seconds of the source's and the sink's node processes
(/proc/PID/stat), so where the time goes is visible. The box's two cores run six nodes
and this client: read the figures with that in mind.

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/mirror.py [--seconds 20] [--rate 10000]
        [--backlog-mib 1024] [--skip-differ]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decommission_timeline import read_events
from multiraft.cli.launcher import LocalCluster
from storage.batch import Record, encode_batch

BATCH = "application/vnd.raftlog.batch"
VALUE = b"x" * 100
TICK_S = os.sysconf("SC_CLK_TCK")
GOALS = {"lag_p99_ms": 100.0, "catchup_mb_s": 100.0, "identical_s": 2.0, "differ_s": 5.0}


def _cpu_s(clusters: dict[str, LocalCluster]) -> dict[str, list[float]]:
    """CPU seconds (user + system) of each cluster's node processes so far, per node."""
    totals = {}
    for name, cluster in clusters.items():
        totals[name] = []
        for node in cluster.nodes:
            fields = Path(f"/proc/{node.process.pid}/stat").read_text().rsplit(")", 1)[1].split()  # type: ignore[union-attr]
            totals[name].append((int(fields[11]) + int(fields[12])) / TICK_S)  # utime, stime (fields 14, 15)
    return totals


class Phase:
    """Wall time and the clusters' CPU seconds over a `with` block."""

    def __init__(self, clusters: dict[str, LocalCluster]) -> None:
        self.clusters = clusters

    def __enter__(self) -> Phase:
        self.began, self.cpu_began = time.monotonic(), _cpu_s(self.clusters)
        return self

    def __exit__(self, *_: object) -> None:
        self.wall_s = time.monotonic() - self.began
        self.cpu = {k: [a - b for a, b in zip(v, self.cpu_began[k], strict=True)]
                    for k, v in _cpu_s(self.clusters).items()}

    def __str__(self) -> str:
        return "CPU " + ", ".join(
            f"{k} {sum(v):.1f} s ({100 * sum(v) / self.wall_s:.0f} % of a core; nodes "
            + "/".join(f"{100 * n / self.wall_s:.0f}" for n in v) + " %)"
            for k, v in self.cpu.items()) + f" over {self.wall_s:.1f} s"


async def _call(session: aiohttp.ClientSession, server: str, method: str, path: str,
                timeout_s: float = 30, **kwargs: object) -> tuple[int, dict]:
    async with asyncio.timeout(timeout_s), session.request(method, f"http://{server}{path}", **kwargs) as answer:
        body = await answer.read()
        return answer.status, (await answer.json() if body and answer.content_type == "application/json" else {})


async def _until(probe, what: str, timeout_s: float, poll_s: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (result := await probe()):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(poll_s)
    return result


async def _leader(session: aiohttp.ClientSession, servers: list[str], topic: str, timeout_s: float = 30) -> str:
    """The HTTP address of the leader of `topic`'s partition 0, once it has one."""
    async def probe() -> str | None:
        try:
            status, body = await _call(session, servers[0], "GET", f"/v1/topics/{topic}")
        except (aiohttp.ClientError, TimeoutError):
            return None
        leader = body["partitions"][0]["leader"] if status == 200 else None
        return servers[leader - 1] if leader else None
    return await _until(probe, f"a leader of {topic}/0", timeout_s)


async def _create_topic(session: aiohttp.ClientSession, servers: list[str], name: str) -> str:
    status, body = await _call(session, servers[0], "POST", "/v1/topics",
                               json={"name": name, "partitions": 1, "replication_factor": 3})
    assert status == 201, (status, body)
    return await _leader(session, servers, name)


def _cli(sink: LocalCluster, *args: str, check: bool = True) -> tuple[float, str]:
    """Run `raftlog mirror ...` against the sink; (wall seconds, its output)."""
    command = [sys.executable, "-m", "multiraft.cli", "mirror", *args, "--server", ",".join(sink.http_addresses)]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    took = time.monotonic() - began
    if check and done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return took, done.stdout


# ---- 1. lag ---------------------------------------------------------------------------------


async def _produce(session: aiohttp.ClientSession, server: str, topic: str, args: argparse.Namespace
                   ) -> tuple[list[tuple[int, int, float, float]], int, float]:
    """Batches on a fixed schedule; ([(base offset, count, sent, acknowledged)], errors, wall s)."""
    batch = encode_batch([Record(None, VALUE)] * args.batch_records, first_timestamp_ms=1)
    interval_s = args.batch_records / args.rate
    slots = asyncio.Semaphore(args.inflight)
    acked: list[tuple[int, int, float, float]] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        try:
            sent = time.monotonic()
            status, body = await _call(session, server, "POST", f"/v1/topics/{topic}/partitions/0/records",
                                       data=batch, headers={"Content-Type": BATCH})
            if status == 200:
                acked.append((body["base_offset"], body["count"], sent, time.monotonic()))
            else:
                errors += 1
        except (aiohttp.ClientError, TimeoutError):
            errors += 1
        finally:
            slots.release()

    tasks = []
    began = time.monotonic()
    for i in range(int(args.seconds / interval_s)):
        await asyncio.sleep(max(0.0, began + i * interval_s - time.monotonic()))
        await slots.acquire()  # a full pipeline delays the next batch: the achieved rate says so
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return acked, errors, time.monotonic() - began


async def _watch(session: aiohttp.ClientSession, server: str, topic: str, arrivals: list[tuple[float, int]],
                 stop: asyncio.Event) -> None:
    """Long-poll the consume API from offset 0; note (time, next offset) of every answer that moved."""
    position = 0
    while not stop.is_set():
        try:
            status, body = await _call(session, server, "GET", f"/v1/topics/{topic}/partitions/0/records"
                                       f"?offset={position}&wait_ms=500&max_records=100000&max_bytes=16777216")
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(0.05)
            continue
        if status == 200 and body["next_offset"] > position:
            position = body["next_offset"]
            arrivals.append((time.monotonic(), position))
        elif status != 200:
            await asyncio.sleep(0.05)


def _percentiles_ms(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"p50 {1000 * statistics.median(ordered):.1f} ms, p99 {1000 * p99:.1f} ms, "
            f"max {1000 * ordered[-1]:.1f} ms")


def _producer_line(acked: list[tuple[int, int, float, float]], errors: int, wall_s: float) -> str:
    records = sum(a[1] for a in acked)
    return (f"{records / wall_s:,.0f} rec/s achieved ({len(acked)} batches, {errors} errors), produce latency "
            + _percentiles_ms([a[3] - a[2] for a in acked]))


async def _lag(session: aiohttp.ClientSession, source: LocalCluster, sink: LocalCluster,
               clusters: dict[str, LocalCluster], args: argparse.Namespace) -> dict[str, float]:
    alone = await _create_topic(session, source.http_addresses, "alone")
    with Phase(clusters) as phase:
        acked, errors, wall_s = await _produce(session, alone, "alone", args)
    print(f"lag: baseline, no mirror: {_producer_line(acked, errors, wall_s)}; {phase}", flush=True)

    live = await _create_topic(session, source.http_addresses, "live")
    took, _ = _cli(sink, "create", "live", "--source", ",".join(source.http_addresses), "--topics", "live")
    sink_leader = await _leader(session, sink.http_addresses, "live", 60)
    print(f"lag: link made by the CLI in {took:.2f} s; mirror topic led by {sink_leader}", flush=True)
    arrivals: list[tuple[float, int]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(session, sink_leader, "live", arrivals, stop))
    with Phase(clusters) as phase:
        acked, errors, wall_s = await _produce(session, live, "live", args)
        end = max(base + count for base, count, _, _ in acked)
        await _until(lambda: asyncio.sleep(0, bool(arrivals) and arrivals[-1][1] >= end),
                     "the mirror to hold the last batch", 60, 0.05)
    stop.set()
    await watcher
    lags, index = [], 0
    for base, count, _, acked_at in sorted(acked):
        while arrivals[index][1] < base + count:
            index += 1
        lags.append(arrivals[index][0] - acked_at)
    p99 = sorted(lags)[int(0.99 * len(lags))] * 1000
    print(f"lag: with the mirror: {_producer_line(acked, errors, wall_s)}", flush=True)
    print(f"lag: source ack -> in the sink's consume answer, per batch of {args.batch_records} records: "
          f"{_percentiles_ms(lags)} (goal p99 <= {GOALS['lag_p99_ms']:.0f} ms at 10,000 rec/s: "
          f"{'met' if p99 <= GOALS['lag_p99_ms'] else 'NOT met'}); {len(arrivals)} sink answers; {phase}", flush=True)
    return {"p99_ms": p99}


# ---- 2. backlog catch-up --------------------------------------------------------------------


async def _fill(session: aiohttp.ClientSession, server: str, topic: str, args: argparse.Namespace,
                odd_at: int | None = None) -> tuple[int, float]:
    """`--backlog-mib` MiB of identical batches, 4 requests in flight; the batch number `odd_at`
    (if given) holds other values. (bytes written, seconds)."""
    batch = encode_batch([Record(None, VALUE)] * args.fill_records, first_timestamp_ms=1)
    odd = encode_batch([Record(None, b"y" * len(VALUE))] * args.fill_records, first_timestamp_ms=1)
    count = args.backlog_mib * 1024 * 1024 // len(batch)
    numbers = iter(range(count))
    began = time.monotonic()

    async def worker() -> None:
        for n in numbers:
            for _attempt in range(100):
                status, _ = await _call(session, server, "POST", f"/v1/topics/{topic}/partitions/0/records",
                                        data=odd if n == odd_at else batch, headers={"Content-Type": BATCH})
                if status == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"bench: the fill of {topic} failed at batch {n}")
    await asyncio.gather(*(worker() for _ in range(4)))
    return count * len(batch), time.monotonic() - began


async def _mirror_partition(session: aiohttp.ClientSession, sink: LocalCluster, link: str) -> dict | None:
    try:
        status, body = await _call(session, sink.http_addresses[0], "GET", f"/v1/admin/mirrors/{link}")
    except (aiohttp.ClientError, TimeoutError):
        return None
    topics = body.get("topics") or [] if status == 200 else []
    return topics[0]["partitions"][0] if topics and topics[0]["partitions"] else None


async def _caught_up(session: aiohttp.ClientSession, sink: LocalCluster, link: str, target: int,
                     timeout_s: float) -> dict[str, float]:
    """Poll the link's status until its partition's position is `target`: when it first showed,
    first copied, and ended (monotonic times)."""
    marks: dict[str, float] = {}

    async def probe() -> bool:
        partition = await _mirror_partition(session, sink, link)
        now = time.monotonic()
        if partition is not None:
            marks.setdefault("shown", now)
            if partition.get("position"):
                marks.setdefault("copying", now)
            marks["end"] = now
            return (partition.get("position") or 0) >= target
        return False
    await _until(probe, f"link {link}'s mirror at {target}", timeout_s, 0.2)
    return marks


async def _catchup(session: aiohttp.ClientSession, source: LocalCluster, sink: LocalCluster,
                   clusters: dict[str, LocalCluster], args: argparse.Namespace) -> tuple[str, int, int]:
    leader = await _create_topic(session, source.http_addresses, "bulk")
    written, fill_s = await _fill(session, leader, "bulk", args)
    _, topic = await _call(session, leader, "GET", "/v1/topics/bulk")
    target = topic["partitions"][0]["high_watermark"]
    print(f"catch-up: filled {written / 2**20:.0f} MiB ({target:,} records of 100 B, batches of "
          f"{args.fill_records}) in {fill_s:.1f} s ({written / fill_s / 1e6:.0f} MB/s produced)", flush=True)
    with Phase(clusters) as phase:
        began = time.monotonic()
        _cli(sink, "create", "bulk", "--source", ",".join(source.http_addresses), "--topics", "bulk")
        marks = await _caught_up(session, sink, "bulk", target, args.timeout)
    copy_s = marks["end"] - marks["copying"]
    whole_s = marks["end"] - began
    rate = written / whole_s / 1e6
    print(f"catch-up: {written / 1e6:.0f} MB copied in {whole_s:.1f} s from `mirror create` "
          f"({rate:.0f} MB/s; goal >= {GOALS['catchup_mb_s']:.0f} MB/s: "
          f"{'met' if rate >= GOALS['catchup_mb_s'] else 'NOT met'}); the mirror topic shown after "
          f"{marks['shown'] - began:.1f} s, copying after {marks['copying'] - began:.1f} s, then "
          f"{copy_s:.1f} s copying ({written / copy_s / 1e6:.0f} MB/s) (status polled every 0.2 s); "
          f"baseline: the source took the same bytes from the producer at {written / fill_s / 1e6:.0f} MB/s; "
          f"{phase}", flush=True)
    return leader, target, written


# ---- 3. full sync ---------------------------------------------------------------------------


async def _verify(session: aiohttp.ClientSession, sink: LocalCluster, clusters: dict[str, LocalCluster],
                  what: str, goal_s: float, repair: bool = False) -> dict:
    """The CLI's verify, timed, with the sink leader's time for it (the link's status); then a
    second verify through the HTTP route, report only, for its bytes hashed."""
    flags = () if repair else ("--no-repair",)
    with Phase(clusters) as phase:
        cli_s, output = await asyncio.to_thread(_cli, sink, "verify", "bulk", *flags, check=False)
    last = (await _mirror_partition(session, sink, "bulk") or {}).get("last_verify") or {}
    status, report = await _call(session, sink.http_addresses[0], "POST", "/v1/admin/mirrors/bulk/verify",
                                 timeout_s=120, json={"repair": False})
    assert status == 200, report
    p = report["partitions"][0]
    print(f"full sync, {what}: `raftlog mirror verify bulk {' '.join(flags)}` {cli_s:.2f} s wall "
          f"(goal <= {goal_s:.0f} s: {'met' if cli_s <= goal_s else 'NOT met'}); {phase}", flush=True)
    for line in output.strip().splitlines():
        print(f"    {line}")
    print(f"  that verify on the sink leader (status' last_verify): {last.get('seconds', float('nan')):.2f} s, "
          f"{last.get('nodes_compared')} digests compared")
    print(f"  the route again: {p['status']} over [{p['lo']},{p['hi']}), {p['seconds']:.2f} s on the sink "
          f"leader, {p['nodes_compared']} digests compared in {p['spans']} span(s), {p['bytes_hashed'] / 1e6:.0f} MB "
          f"hashed by the sink ({p['bytes_hashed'] / max(p['seconds'], 1e-9) / 1e6:.0f} MB/s over its time), "
          f"ranges {p['ranges']}", flush=True)
    return p


async def _differ(session: aiohttp.ClientSession, source: LocalCluster, sink: LocalCluster,
                  clusters: dict[str, LocalCluster], args: argparse.Namespace, target: int, written: int) -> None:
    _cli(sink, "pause", "bulk")
    status, _ = await _call(session, source.http_addresses[0], "DELETE", "/v1/topics/bulk")
    assert status == 204, status
    await asyncio.sleep(1.0)  # the old groups dropped on every source node
    leader = await _create_topic(session, source.http_addresses, "bulk")
    count = args.backlog_mib * 1024 * 1024 // len(encode_batch([Record(None, VALUE)] * args.fill_records,
                                                                first_timestamp_ms=1))
    _, fill_s = await _fill(session, leader, "bulk", args, odd_at=count // 2)
    _, topic = await _call(session, leader, "GET", "/v1/topics/bulk")
    assert topic["partitions"][0]["high_watermark"] == target, topic
    print(f"full sync: the source topic deleted and filled again ({fill_s:.1f} s) with batch {count // 2} of "
          f"{count} holding other values (same record count)", flush=True)
    await _verify(session, sink, clusters, "one batch differs, report only", GOALS["differ_s"])
    _cli(sink, "resume", "bulk")
    _, before = await _call(session, sink.http_addresses[0], "GET", "/v1/topics/bulk")
    old_group = before["partitions"][0]["group_id"]

    async def refilled() -> bool:
        _, view = await _call(session, sink.http_addresses[0], "GET", "/v1/topics/bulk")
        p = view["partitions"][0]
        return p["group_id"] != old_group and p["high_watermark"] == target

    with Phase(clusters) as phase:
        began, began_epoch = time.monotonic(), time.time()
        _, output = await asyncio.to_thread(_cli, sink, "verify", "bulk", check=False)
        verified_s = time.monotonic() - began
        await _until(refilled, "the resynced mirror at the source's high watermark", args.timeout, 0.2)
    took = time.monotonic() - began
    print(f"full sync, repair: `raftlog mirror verify bulk` (with repair) {verified_s:.2f} s, then the new "
          f"incarnation refilled to the source's high watermark: {took:.1f} s in all "
          f"({written / took / 1e6:.0f} MB/s of partition; sink topic's high watermark polled every 0.2 s); "
          f"{phase}", flush=True)
    for line in output.strip().splitlines():
        print(f"    {line}")
    _repair_timeline(sink, began_epoch)
    await _verify(session, sink, clusters, "after the resync", GOALS["identical_s"])


REPAIR_EVENTS = ("mirror_verified", "mirror_resync_started", "mirror_prefix_kept", "mirror_prefix_not_kept",
                 "group_closed", "group_opened", "role_changed")


def _repair_timeline(sink: LocalCluster, since: float) -> None:
    """Where the repair's time went: the sink nodes' events after the verify began (their logs)."""
    events = [e for e in read_events(sink.directory, since) if e.name in REPAIR_EVENTS]
    shown = {"bytes", "seconds", "next_offset", "files", "status", "role", "group_id", "old_group", "deleted"}
    for event in events[:40]:
        fields = " ".join(f"{k}={v}" for k, v in event.fields.items() if k in shown)
        print(f"    +{event.at - since:6.2f} s  node {event.node}  {event.name}  {fields}")
    if len(events) > 40:
        print(f"    ... {len(events) - 40} more")


async def _legs(session: aiohttp.ClientSession, source: LocalCluster, sink: LocalCluster,
                source_leader: str, mib: int) -> None:
    """The two legs of the pull's round trip, each alone, 1 MiB at a time, one in flight: the
    source's /log read (this client reading `mib` MiB of bulk, as a sink leader does) and the
    sink's commit of 1 MiB (a produce of 1 MiB batches to a plain sink topic)."""
    began, position, read = time.monotonic(), 0, 0
    while read < mib * 2**20:
        async with asyncio.timeout(30), session.get(
                f"http://{source_leader}/v1/topics/bulk/partitions/0/log",
                params={"offset": str(position), "max_bytes": str(2**20)}) as answer:
            body = await answer.read()
            position = int(answer.headers["Raftlog-Next-Offset"])
        read += len(body)
    read_s = time.monotonic() - began
    leader = await _create_topic(session, sink.http_addresses, "probe")
    batch = encode_batch([Record(None, VALUE)] * (2**20 // 112), first_timestamp_ms=1)
    began = time.monotonic()
    for _ in range(mib):
        status, _ = await _call(session, leader, "POST", "/v1/topics/probe/partitions/0/records", data=batch,
                                headers={"Content-Type": BATCH})
        assert status == 200, status
    commit_s = time.monotonic() - began
    print(f"catch-up, the legs alone ({mib} MiB each, one request in flight): the source's /log read "
          f"{1000 * read_s / (read / 2**20):.1f} ms per MiB ({read / read_s / 1e6:.0f} MB/s); the sink's commit "
          f"of a {len(batch) / 2**20:.2f} MiB batch {1000 * commit_s / mib:.1f} ms ({mib * len(batch) / commit_s / 1e6:.0f} "
          f"MB/s)", flush=True)


async def _run(source: LocalCluster, sink: LocalCluster, args: argparse.Namespace) -> None:
    clusters = {"source": source, "sink": sink}
    async with aiohttp.ClientSession() as session:
        if not args.skip_lag:
            await _lag(session, source, sink, clusters, args)
        leader, target, written = await _catchup(session, source, sink, clusters, args)
        await _legs(session, source, sink, leader, min(256, args.backlog_mib))
        await _verify(session, sink, clusters, "identical", GOALS["identical_s"])
        if not args.skip_differ:
            await _differ(session, source, sink, clusters, args, target, written)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each producer run")
    parser.add_argument("--rate", type=float, default=10_000.0, help="records/s the producer aims at")
    parser.add_argument("--batch-records", type=int, default=100, help="records a produced batch (lag)")
    parser.add_argument("--inflight", type=int, default=8, help="produce requests in flight at most (lag)")
    parser.add_argument("--backlog-mib", type=int, default=1024)
    parser.add_argument("--fill-records", type=int, default=1000, help="records a batch of the backlog")
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument("--skip-differ", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound of each wait for a copy")
    parser.add_argument("--ports", default="19900,19980,19950,19990", help="source raft,http, sink raft,http")
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    for host, port in ((f"127.0.0.{i}", port) for i in (1, 2, 3) for port in ports):
        with socket.socket() as probe:  # a node left from another run would answer for ours
            if probe.connect_ex((host, port)) == 0:
                raise SystemExit(f"bench: {host}:{port} is in use; stop what listens there first")
    directory = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    source = LocalCluster(directory / "source", 3, raft_port=ports[0], http_port=ports[1])
    sink = LocalCluster(directory / "sink", 3, raft_port=ports[2], http_port=ports[3])
    try:
        for cluster in (source, sink):
            cluster.start()
        for cluster in (source, sink):
            cluster.wait_ready(60)
        asyncio.run(_run(source, sink, args))
    finally:
        sink.stop()
        source.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
