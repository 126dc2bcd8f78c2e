"""Scale without collapse (issue 26): a real 3-node cluster grown to many partitions.

Starts three `raftlog serve` processes with the local launcher (127.0.0.1-3,
ports 19100 and 19080 unless told otherwise, RF 3), then creates topics of
`--step` partitions through the HTTP API until `--partitions` exist. After each
step it prints:

- create: seconds the `POST /v1/topics` took;
- led: seconds until every partition of every topic has a leader (a replica
  that says it leads, in the highest term any replica reports);
- quiet: seconds until every group on every node is quiesced (capped by
  `--timeout`; a leader moved by the balancer wakes its group for a while);
- idle CPU per node over `--idle-seconds` (percent of one core; noisy on a
  shared box: the counts beside it are the steadier figures);
- RSS per node, and per hosted replica (RSS / groups hosted);
- quiesced groups per node, and during the idle window: elections, leader
  changes, transport frames in and out per second, summed over the nodes.

Nothing polls the nodes during the idle window: /metrics is scraped just
before and just after it (a scrape of thousands of groups is itself work).

Then, unless `--skip-restarts`: kills one node with SIGKILL (seconds until every
partition is led again, by the two left), starts it again (seconds until it is
back in every partition's ISR and each of its replicas holds its leader's whole
log: the same log end offset; a kill shorter than the ISR lag time never takes
it out of the ISRs, so the ISR alone would not show it caught up), and restarts the whole cluster (SIGTERM, then
start; seconds until every partition is led). Every wait is bounded by
`--timeout`; a wait that runs out prints what was still missing. A step whose
partitions never all got a leader ends the growth, and the restarts are skipped
(they would measure the storm, not recovery). The cluster is stopped by PID at the end, whatever happened.

Prints a table as it goes and one JSON line at the end (`scale_result`).

    .venv/bin/python bench/scale.py [--partitions 10000] [--step 1000] [--idle-seconds 10]
                                    [--timeout 300] [--skip-restarts | --full-restart-only] [--keep DIR]
                                    [--hold-at 2000 --hold-seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LauncherError, LocalCluster

POLL_S = 1.0  # between polls of the topic views or /metrics while waiting
HTTP_TIMEOUT_S = 60.0  # one request to a node (a describe of thousands of partitions on a busy node)
CREATE_TIMEOUT_S = 120.0
NODES = 3
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# The /metrics families read here (node-level ones, and the per-group counters summed).
_SUMMED = {
    "raftlog_group_elections_total": "elections",
    "raftlog_group_leader_changes_total": "leader_changes",
}
_NODE_LEVEL = {
    "raftlog_node_groups": "groups",
    "raftlog_node_leaders": "leaders",
    "raftlog_quiesced_groups": "quiesced",
    "raftlog_transport_frames_in_total": "frames_in",
    "raftlog_transport_frames_out_total": "frames_out",
    "raftlog_transport_bytes_out_total": "bytes_out",
    "raftlog_peer_silences_total": "peer_silences",
    "raftlog_groups_back_to_quiet_total": "back_to_quiet",
    "raftlog_event_loop_lag_seconds_count": "loop_lag_count",
    "raftlog_event_loop_lag_seconds_sum": "loop_lag_sum",
}


# ---------------------------------------------------------------------- node probes


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def pids(cluster: LocalCluster) -> list[int]:
    return [n.process.pid if n.process is not None else 0 for n in cluster.nodes]


async def scrape(session: aiohttp.ClientSession, server: str) -> dict[str, float] | None:
    """The node-level figures and the per-group counters summed; None if the node did not answer."""
    try:
        async with session.get(f"http://{server}/metrics",
                               timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    figures: dict[str, float] = dict.fromkeys([*_SUMMED.values(), *_NODE_LEVEL.values()], 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name in _SUMMED:
            figures[_SUMMED[name]] += float(value)
        elif name in _NODE_LEVEL:
            figures[_NODE_LEVEL[name]] = float(value)
    return figures


async def scrape_all(session: aiohttp.ClientSession, cluster: LocalCluster) -> list[dict[str, float] | None]:
    return list(await asyncio.gather(*(scrape(session, n.http_addr) for n in cluster.nodes)))


async def describe(session: aiohttp.ClientSession, server: str, topic: str) -> list[dict[str, Any]] | None:
    try:
        async with session.get(f"http://{server}/v1/topics/{topic}",
                               timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as response:
            if response.status != 200:
                return None
            return (await response.json())["partitions"]
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
        return None


@dataclass
class Leadership:
    partitions: int = 0
    led: int = 0
    in_isr: int = 0  # partitions whose leader counts `isr_node` in sync (when asked)
    caught_up: int = 0  # ... and whose replica on `isr_node` holds the leader's whole log
    views_missing: int = 0  # (node, topic) describes that failed


async def leadership(session: aiohttp.ClientSession, cluster: LocalCluster, topics: list[str],
                     node_ids: list[int], isr_node: int = 0) -> Leadership:
    """Every partition of `topics` as the nodes in `node_ids` see it.

    A partition is led when some replica says it leads in the highest term any
    replica reports for it (a deposed leader that has not heard yet does not count)."""
    found = Leadership()
    for topic in topics:
        servers = [cluster.nodes[i - 1].http_addr for i in node_ids]
        views = await asyncio.gather(*(describe(session, s, topic) for s in servers))
        by_partition: dict[int, list[dict[str, Any]]] = {}
        for node_id, view in zip(node_ids, views, strict=True):
            if view is None:
                found.views_missing += 1
                continue
            for partition in view:
                by_partition.setdefault(int(partition["partition"]), []).append(partition | {"_node": node_id})
        if not by_partition:
            continue
        found.partitions += max(len(v) for v in views if v is not None)
        for replicas in by_partition.values():
            terms = [r.get("term") or 0 for r in replicas]
            leaders = [r for r in replicas if r.get("role") == "leader" and (r.get("term") or 0) == max(terms)]
            if leaders:
                found.led += 1
                if isr_node and isr_node in (leaders[0].get("isr") or []):
                    found.in_isr += 1
                    own = [r for r in replicas if r["_node"] == isr_node]
                    if own and own[0].get("log_end_offset") == leaders[0].get("log_end_offset"):
                        found.caught_up += 1
    return found


# ---------------------------------------------------------------------- waits


@dataclass
class Wait:
    seconds: float | None  # None: the wait ran out
    detail: str = ""


async def wait_led(session: aiohttp.ClientSession, cluster: LocalCluster, topics: list[str], expected: int,
                   node_ids: list[int], timeout_s: float, began: float | None = None,
                   progress_s: float = 0.0) -> Wait:
    """Until every partition is led. With `progress_s`, prints the count led that often
    (the shape of a slow recovery: a steady climb, or a stall)."""
    began = time.monotonic() if began is None else began
    deadline = began + timeout_s
    printed = began
    while True:  # polled at least once, even past the deadline (a wait after another that ran out)
        last = await leadership(session, cluster, topics, node_ids)
        if last.partitions >= expected and last.led >= expected:
            return Wait(time.monotonic() - began)
        if progress_s and time.monotonic() - printed >= progress_s:
            printed = time.monotonic()
            print(f"  {printed - began:5.0f} s: {last.led} of {expected} led", flush=True)
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_S)
    missing = f" ({last.views_missing} topic views unanswered)" if last.views_missing else ""
    return Wait(None, f"{expected - last.led} of {expected} partitions without a leader after "
                      f"{time.monotonic() - began:.0f} s{missing}")


async def wait_in_isr(session: aiohttp.ClientSession, cluster: LocalCluster, topics: list[str], expected: int,
                      node_id: int, timeout_s: float, began: float) -> Wait:
    deadline = began + timeout_s
    everyone = [n.node_id for n in cluster.nodes]
    while True:
        last = await leadership(session, cluster, topics, everyone, isr_node=node_id)
        if last.in_isr >= expected and last.caught_up >= expected:
            return Wait(time.monotonic() - began)
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_S)
    return Wait(None, f"node {node_id} missing from {expected - last.in_isr} of {expected} ISRs, short of the "
                      f"leader's log in {expected - last.caught_up} ({expected - last.led} leaderless) "
                      f"after {timeout_s:.0f} s")


async def wait_quiet(session: aiohttp.ClientSession, cluster: LocalCluster, timeout_s: float) -> Wait:
    began = time.monotonic()
    deadline = began + timeout_s
    figures: list[dict[str, float] | None] = []
    while time.monotonic() < deadline:
        figures = await scrape_all(session, cluster)
        if all(f is not None and f["groups"] > 0 and f["quiesced"] >= f["groups"] - 1 for f in figures):
            # every group but the metadata group (which never quiesces while it ticks node heartbeats)
            return Wait(time.monotonic() - began)
        await asyncio.sleep(POLL_S)
    quiet = ", ".join("?" if f is None else f"{f['quiesced']:.0f}/{f['groups']:.0f}" for f in figures)
    return Wait(None, f"not every group quiet after {timeout_s:.0f} s (quiesced/hosted per node: {quiet})")


async def wait_healthy(cluster: LocalCluster, timeout_s: float, nodes: list[int] | None = None) -> Wait:
    began = time.monotonic()
    try:
        await asyncio.to_thread(cluster.wait_healthy, timeout_s, nodes)
    except LauncherError as error:
        return Wait(None, str(error))
    return Wait(time.monotonic() - began)


# ---------------------------------------------------------------------- steps


@dataclass
class Step:
    partitions: int
    create_s: float | None
    led_s: float | None
    quiet_s: float | None
    cpu_percent: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    rss_kib_per_replica: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    quiesced: list[int] = field(default_factory=list)
    idle_elections: int = 0
    idle_leader_changes: int = 0
    idle_frames_in_per_s: float = 0.0
    idle_frames_out_per_s: float = 0.0
    idle_loop_lag_max_mean_ms: float = 0.0  # the mean loop lag (ms) of the worst node in the window
    elections_total: int = 0  # since the cluster started, summed over the nodes
    notes: list[str] = field(default_factory=list)


def _diff(after: list[dict[str, float] | None], before: list[dict[str, float] | None], key: str) -> float:
    return sum((a[key] - b[key]) for a, b in zip(after, before, strict=True) if a is not None and b is not None)


async def idle_window(session: aiohttp.ClientSession, cluster: LocalCluster, step: Step, seconds: float) -> None:
    before = await scrape_all(session, cluster)
    processes = pids(cluster)
    cpu_before = [cpu_seconds(p) for p in processes]
    began = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - began
    cpu_after = [cpu_seconds(p) for p in processes]
    after = await scrape_all(session, cluster)
    step.cpu_percent = [round((a - b) / elapsed * 100, 1) for a, b in zip(cpu_after, cpu_before, strict=True)]
    rss = [rss_bytes(p) for p in processes]
    step.rss_mib = [round(r / 2**20, 1) for r in rss]
    step.groups = [int(f["groups"]) if f else -1 for f in after]
    step.quiesced = [int(f["quiesced"]) if f else -1 for f in after]
    step.rss_kib_per_replica = [round(r / 1024 / g, 1) if g > 0 else 0.0 for r, g in zip(rss, step.groups,
                                                                                           strict=True)]
    step.idle_elections = int(_diff(after, before, "elections"))
    step.idle_leader_changes = int(_diff(after, before, "leader_changes"))
    step.idle_frames_in_per_s = round(_diff(after, before, "frames_in") / elapsed, 1)
    step.idle_frames_out_per_s = round(_diff(after, before, "frames_out") / elapsed, 1)
    lags = [(a["loop_lag_sum"] - b["loop_lag_sum"]) / max(1.0, a["loop_lag_count"] - b["loop_lag_count"]) * 1000
            for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    step.idle_loop_lag_max_mean_ms = round(max(lags, default=0.0), 2)
    step.elections_total = int(sum(f["elections"] for f in after if f is not None))
    if any(f is None for f in (*before, *after)):
        step.notes.append("a node did not answer /metrics around the idle window")


def print_header() -> None:
    print(f"{'partitions':>10} {'create s':>8} {'led s':>7} {'quiet s':>7} {'idle CPU % per node':>20} "
          f"{'RSS MiB per node':>20} {'KiB/replica':>18} {'quiesced per node':>20} {'elect':>6} "
          f"{'ldr chg':>7} {'frames/s in':>11} {'lag ms':>6}", flush=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_step(step: Step) -> None:
    print(f"{step.partitions:>10} {_fmt(step.create_s):>8} {_fmt(step.led_s):>7} {_fmt(step.quiet_s):>7} "
          f"{'/'.join(f'{c:.1f}' for c in step.cpu_percent):>20} {'/'.join(f'{r:.0f}' for r in step.rss_mib):>20} "
          f"{'/'.join(f'{r:.0f}' for r in step.rss_kib_per_replica):>18} "
          f"{'/'.join(str(q) for q in step.quiesced):>20} {step.idle_elections:>6} {step.idle_leader_changes:>7} "
          f"{step.idle_frames_in_per_s:>11.1f} {step.idle_loop_lag_max_mean_ms:>6.1f}", flush=True)
    for note in step.notes:
        print(f"{'':>10} note: {note}", flush=True)


async def grow(session: aiohttp.ClientSession, cluster: LocalCluster, args: argparse.Namespace,
               topics: list[str]) -> tuple[list[Step], bool]:
    """Create topics step by step; False when a step's partitions never all got a leader."""
    steps: list[Step] = []
    total = 0
    everyone = [n.node_id for n in cluster.nodes]
    print_header()
    while total < args.partitions:
        count = min(args.step, args.partitions - total)
        name = f"scale-{len(topics)}"
        began = time.monotonic()
        create_s: float | None = None
        note = ""
        try:
            async with session.post(f"http://{cluster.nodes[0].http_addr}/v1/topics",
                                    json={"name": name, "partitions": count, "replication_factor": NODES},
                                    timeout=aiohttp.ClientTimeout(total=CREATE_TIMEOUT_S)) as response:
                body = await response.text()
                if response.status in (200, 201):
                    create_s = time.monotonic() - began
                else:
                    note = f"create answered {response.status}: {body[:200]}"
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            note = f"create failed: {error!r}"
        topics.append(name)  # it may exist even when the answer was lost or late
        total += count
        led = await wait_led(session, cluster, topics, total, everyone, args.timeout, began)
        step = Step(partitions=total, create_s=create_s, led_s=led.seconds, quiet_s=None)
        if note:
            step.notes.append(note)
        if led.seconds is None:
            step.notes.append(led.detail)
        else:
            quiet = await wait_quiet(session, cluster, args.timeout)
            step.quiet_s = quiet.seconds
            if quiet.seconds is None:
                step.notes.append(quiet.detail)
        await idle_window(session, cluster, step, args.idle_seconds)
        print_step(step)
        steps.append(step)
        if args.hold_at and total == args.hold_at and args.hold_seconds > 0:
            # Quiet time for an outside look (py-spy record -p PID): nothing polls the nodes.
            print(f"holding {args.hold_seconds:.0f} s at {total} partitions; pids {pids(cluster)}", flush=True)
            await asyncio.sleep(args.hold_seconds)
        if led.seconds is None:
            return steps, False
    return steps, True


async def restarts(session: aiohttp.ClientSession, cluster: LocalCluster, args: argparse.Namespace,
                   topics: list[str], expected: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if not args.full_restart_only:
        figures.update(await kill_and_restart_one(session, cluster, args, topics, expected))
    figures.update(await restart_all(session, cluster, args, topics, expected))
    return figures


async def kill_and_restart_one(session: aiohttp.ClientSession, cluster: LocalCluster, args: argparse.Namespace,
                               topics: list[str], expected: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    victim = NODES  # the last node: never the one that bootstrapped first
    left = [n.node_id for n in cluster.nodes if n.node_id != victim]
    killed_at = time.monotonic()
    cluster.kill_node(victim)
    led = await wait_led(session, cluster, topics, expected, left, args.timeout, killed_at)
    figures["kill_one_led_s"] = led.seconds
    print(f"kill -9 node {victim}: every partition led again after {_fmt(led.seconds)} s {led.detail}", flush=True)

    started_at = time.monotonic()
    cluster.start_node(victim)
    healthy = await wait_healthy(cluster, args.timeout, [victim])
    isr = await wait_in_isr(session, cluster, topics, expected, victim, args.timeout, started_at) \
        if healthy.seconds is not None else healthy
    figures["restart_one_healthy_s"] = healthy.seconds
    figures["restart_one_in_every_isr_s"] = isr.seconds
    print(f"restart node {victim}: healthy after {_fmt(healthy.seconds)} s, back in every ISR and caught up after "
          f"{_fmt(isr.seconds)} s {isr.detail}", flush=True)
    return figures


async def restart_all(session: aiohttp.ClientSession, cluster: LocalCluster, args: argparse.Namespace,
                      topics: list[str], expected: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    stopped_at = time.monotonic()
    codes = await asyncio.to_thread(cluster.stop)
    figures["stop_all_s"] = round(time.monotonic() - stopped_at, 1)
    figures["stop_exit_codes"] = codes
    started_at = time.monotonic()
    await asyncio.to_thread(cluster.start)
    healthy = await wait_healthy(cluster, args.timeout)
    everyone = [n.node_id for n in cluster.nodes]
    # Counted even when a node never registered (its metadata group lost in the storm): the
    # nodes answer topic views from their replayed catalogs meanwhile. One cap for both waits.
    led = await wait_led(session, cluster, topics, expected, everyone, args.timeout, started_at, progress_s=10)
    figures["restart_all_healthy_s"] = healthy.seconds
    figures["restart_all_led_s"] = led.seconds
    details = [d for d in (healthy.detail, led.detail) if d]
    if details:
        figures["restart_all_detail"] = "; ".join(details)
    after = await scrape_all(session, cluster)
    figures["restart_all_elections"] = int(sum(f["elections"] for f in after if f is not None))
    print(f"restart all (stop took {figures['stop_all_s']} s, exit codes {codes}): healthy after "
          f"{_fmt(healthy.seconds)} s, every partition led after {_fmt(led.seconds)} s "
          f"{figures.get('restart_all_detail', '')}; "
          f"elections since the restart {figures['restart_all_elections']}", flush=True)
    return figures


async def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    cluster = LocalCluster(directory, NODES, raft_port=args.raft_port, http_port=args.http_port)
    result: dict[str, Any] = {"partitions_asked": args.partitions, "step": args.step,
                              "idle_seconds": args.idle_seconds, "timeout_s": args.timeout}
    cluster.start()
    try:
        healthy = await wait_healthy(cluster, 60)
        if healthy.seconds is None:
            raise SystemExit(f"cluster did not start: {healthy.detail}")
        print(f"cluster up in {healthy.seconds:.1f} s: {', '.join(cluster.http_addresses)}; pids "
              f"{pids(cluster)}; data {directory}", flush=True)
        topics: list[str] = []
        async with aiohttp.ClientSession() as session:
            steps, converged = await grow(session, cluster, args, topics)
            result["steps"] = [asdict(s) for s in steps]
            result["converged"] = converged
            if args.skip_restarts:
                pass
            elif not converged:
                # A kill or a restart of a cluster that never settled measures the storm, not recovery.
                print("restarts skipped: the last step never had a leader for every partition", flush=True)
            else:
                result["restarts"] = await restarts(session, cluster, args, topics, steps[-1].partitions)
    finally:
        result["stopped"] = await asyncio.to_thread(cluster.stop)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000, help="partitions to reach, in all topics")
    parser.add_argument("--step", type=int, default=1000, help="partitions per topic created")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="cap of every wait, in seconds")
    parser.add_argument("--skip-restarts", action="store_true")
    parser.add_argument("--full-restart-only", action="store_true",
                        help="skip the kill and restart of one node; restart the whole cluster only")
    parser.add_argument("--raft-port", type=int, default=19100)
    parser.add_argument("--http-port", type=int, default=19080)
    parser.add_argument("--hold-at", type=int, default=0, metavar="PARTITIONS",
                        help="after the step that reaches this many partitions, leave the cluster alone for "
                             "--hold-seconds (to attach a profiler)")
    parser.add_argument("--hold-seconds", type=float, default=0.0)
    parser.add_argument("--keep", type=Path, help="keep the cluster's data here (a new directory) for a look after")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True)
        result = asyncio.run(run(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="raftlog-scale-") as directory:
            result = asyncio.run(run(args, Path(directory)))
    print("scale_result " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stopped bench stops its cluster too
    raise SystemExit(main())
