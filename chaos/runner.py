"""One chaos run: start a real cluster, run the workload under the nemesis, heal,
read everything back, check the history, write the report, print one summary.

Phases:
1. start N `raftlog serve` processes (data under `<out>/data`), create the topics;
2. main phase for `duration` seconds: workload + nemesis;
3. heal: stop the nemesis, undo every fault, restart what is down, wait until
   every node is healthy; time how long each partition takes to accept a write
   again (the recovery time after the final heal);
4. final reads of every partition from offset 0 until a confirmed leader's high
   watermark covers the highest offset the history saw (`chaos/finalread.py`);
   a partition that never gets there is its own verdict, `final-read-incomplete`;
5. server-side checks (every replica of every group catches up to the group's
   highest commit index, then their logs up to it are byte-identical, when the
   debug endpoints are on; at most one leader per group and term, from the node
   logs), then the history checker;
6. report: history.jsonl, node logs, summary.txt, stats.json, index.html.
The summary line begins with `chaos:`; any anomaly makes the exit code non-zero.

With `far_catchup` (chaos/farcatchup.py) the nodes start with small far-horizon
thresholds and the topics with small segments, and the summary counts the
far-horizon installs the nodes' logs show.

With `mirror` (chaos/mirror.py) a sink cluster mirrors the topics under faults of its
own (sink kills and pauses, link cuts and pauses); after the final reads the mirror's
logs are compared with the source's (chaos/mirror_checks.py) and one topic promoted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import checker
from chaos.cluster import ChaosCluster, copy_logs
from chaos.farcatchup import count_events as count_far_events
from chaos.farcatchup import summary_part as far_summary
from chaos.farcatchup import topic_config as far_topic_config
from chaos.farcatchup import write_node_config as write_far_config
from chaos.finalread import ClusterReplicas, FinalRead, FinalReader, targets_of
from chaos.group_workload import GroupWorkload
from chaos.history import PartitionKey
from chaos.history_file import read_history
from chaos.history_writer import HistoryWriter
from chaos.mirror import MirrorRun
from chaos.mirror_checks import summary_part as mirror_summary
from chaos.mirror_filter_checks import summary_part as filtered_summary
from chaos.mirror_follow import LIMITS as FOLLOW_LIMITS
from chaos.mirror_follow_checks import summary_part as follow_summary
from chaos.moves import summarize as summarize_moves
from chaos.moves import unavailable_reason as move_unavailable
from chaos.nemesis import Nemesis
from chaos.serverchecks import DebugEndpoints, compare_replicas, leaders_per_term, skipped_ranges
from chaos.workload import CLIENT_HOST, Stats, Workload
from multiraft.cli.launcher import LauncherError
from multiraft.client import AsyncClient, RaftlogError

TOPICS = (("chaos-a", 4), ("chaos-b", 4))
REPLICATION_FACTOR = 3  # at most: a cluster of fewer nodes gets one copy per node
RECOVERY_TIMEOUT_S = 60.0
# Faults start this long after the topics exist: the ack-before-fsync control defers
# every fsync by 2 s, metadata included, and must lose records, not the topics.
TOPIC_SETTLE_S = 3.0
LISTED_PROBLEMS = 2  # findings of one kind spelled out in the summary line; details.json has all


@dataclass
class RunConfig:
    out: Path
    seed: int
    nodes: int = 3
    duration_s: float = 60.0
    faults: list[str] = field(default_factory=lambda: ["kill", "pause"])
    unsafe: list[str] = field(default_factory=list)
    lose_unsynced: bool = True
    groups: bool = False  # the consumer-group workload too (chaos/group_workload.py)
    far_catchup: bool = False  # far-horizon catch-up driven hard (chaos/farcatchup.py)
    mirror: bool = False  # a sink cluster mirrors the topics, under faults too (chaos/mirror.py)


@dataclass
class RunResult:
    summary: str
    ok: bool
    details: dict[str, Any]


async def run(config: RunConfig, extra_faults: Any = None) -> RunResult:
    """`extra_faults`: a `chaos.faults`-backed provider of network/clock/disk fault kinds."""
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    env = {"RAFTLOG_CHAOS_DEBUG": "1"}
    if config.lose_unsynced:
        env["RAFTLOG_CHAOS_FILES"] = "write-behind"
    if config.unsafe:
        env["RAFTLOG_UNSAFE"] = ",".join(config.unsafe)

    def node_env(node: int) -> dict[str, str]:
        extra = dict(env)
        if extra_faults is not None:
            extra |= extra_faults.env_for(node)
        return extra

    extra_args = ("--config", str(write_far_config(out))) if config.far_catchup else ()
    cluster = ChaosCluster(out / "data", config.nodes, node_env, extra_args)
    if extra_faults is not None:
        extra_faults.prepare(cluster)
    keys = [PartitionKey(topic, p) for topic, count in TOPICS for p in range(count)]
    stats = Stats()
    details: dict[str, Any] = {"seed": config.seed, "nodes": config.nodes, "duration_s": config.duration_s}
    history_path = out / "history.jsonl"
    mirror = MirrorRun(out, lambda node: dict(env), random.Random(rng.random()),
                       getattr(extra_faults, "network", None), time.monotonic()) if config.mirror else None
    try:
        await asyncio.to_thread(cluster.start_all, 90.0)
        await _create_topics(cluster, far_topic_config() if config.far_catchup else {})
        await asyncio.sleep(TOPIC_SETTLE_S)
        if mirror is not None:
            await mirror.start(cluster, keys)
        kinds = [k for k in config.faults
                 if k in ("kill", "power", "pause") or (extra_faults and k in extra_faults.kinds)]
        why_not_move = move_unavailable(config.nodes, _replication_factor(config.nodes))
        if "move" in config.faults and why_not_move is None:
            kinds.append("move")
        details["faults_skipped"] = sorted(set(config.faults) - set(kinds))
        extra = dict(extra_faults.kinds) if extra_faults else {}
        if mirror is not None:
            kinds += list(mirror.kinds)
            extra |= mirror.kinds
            details["faults_skipped"] += ["link-cut"] if "link-cut" not in mirror.kinds else []
        if "move" in details["faults_skipped"] and why_not_move is not None:
            details["faults_skipped_why"] = {"move": why_not_move}
        nemesis = Nemesis(cluster, keys, rng, kinds, extra=extra, topics=tuple(topic for topic, _ in TOPICS),
                          due=mirror.follow.due(config.duration_s) if mirror else [],
                          limits=dict(FOLLOW_LIMITS) if mirror else {})
        if mirror is not None:
            mirror.started = mirror.follow.started = nemesis.started  # samples on the fault windows' clock
        with HistoryWriter.open(history_path) as history:
            workload = Workload(cluster, history, keys, random.Random(rng.random()), stats)
            stop = asyncio.Event()
            workload.stop = stop
            groups = GroupWorkload(cluster, history, random.Random(rng.random()), stats, dict(TOPICS)) \
                if config.groups else None
            loads = asyncio.create_task(_gather(workload.run(), *([groups.run(stop)] if groups else []),
                                                *([mirror.follow.write(stop), mirror.filtered.write(stop)] if mirror else [])))
            faults = asyncio.create_task(nemesis.run(stop))
            sampled = asyncio.Event()  # the mirror's positions are sampled until its check
            sampling = asyncio.create_task(mirror.sample(sampled) if mirror else sampled.wait())
            try:
                await asyncio.sleep(config.duration_s)
                stop.set()
                await faults
            except asyncio.CancelledError:
                # Interrupted (Ctrl-C, or the soak's SIGTERM): the nemesis must not restart a
                # node after `cluster.stop` below, nor the workload write to a closed history.
                await _cancel(loads, faults, sampling)
                raise
            healed_at = time.monotonic()
            await asyncio.wait_for(loads, 30.0)
            if extra_faults is not None:
                await extra_faults.heal_all()
            for node in list(cluster.paused):
                cluster.resume(node)
            for node in list(cluster.down):
                cluster.start(node)
            try:
                await asyncio.to_thread(cluster.wait_healthy, 90.0)
                if mirror is not None:
                    await mirror.heal()  # the sink's nodes back, the link resumed
            except LauncherError as error:  # a node that cannot come back is a finding, not a crash
                details["not_healthy"] = str(error)
                await _dump_tasks(cluster)
            details["crashed"] = cluster.exited()
            if mirror is not None:
                details["sink_crashed"] = mirror.sink.exited()
            if nemesis.mover is not None and "not_healthy" not in details:
                # Every decommissioned node recommissioned and back in the metadata group
                # before the final phase (chaos/moves.py); one that is not is a finding.
                details["moves_unsettled"] = await nemesis.mover.settle()
            finals: list[FinalRead] = []
            if "not_healthy" not in details:
                details["recovery_s"] = await _recovery(cluster, history, keys, healed_at)
                finals = await _final_reads(cluster, history, history_path, keys)
                details["final_reads"] = [final.details() for final in finals]
                if groups is not None:
                    details["group_drain_short"] = await _group_drain(groups, history, history_path)
                sampled.set()
                await sampling
                if mirror is not None:
                    finished = await mirror.finish(cluster, {final.key: final.high_watermark for final in finals})
            if not sampling.done():
                await _cancel(sampling)
        if "not_healthy" not in details:
            replicas = await asyncio.to_thread(compare_replicas, DebugEndpoints(cluster))
            details["replicas"] = replicas.details()
            if mirror is not None:  # the sink takes the harshest faults: its replicas and terms too
                sink = await asyncio.to_thread(compare_replicas, DebugEndpoints(mirror.sink))
                details["sink_replicas"] = sink.details()
                details["sink_leaders_per_term"] = leaders_per_term(mirror.sink)
            refused = await asyncio.to_thread(skipped_ranges, cluster, keys)
        else:
            refused = {}  # the final phase did not run: the history checks what it saw
        incomplete = {final.key: final.explanation() for final in finals if not final.complete}
        result = checker.check(read_history(history_path), refused_ranges=refused, incomplete_reads=incomplete)
        details["leaders_per_term"] = leaders_per_term(cluster)
        if "finished" in locals():
            verdicts = finished.pop("verdicts")
            result = dataclasses.replace(result, anomalies=result.anomalies + tuple(verdicts.anomalies))
            details["mirror"] = finished | {"compared": verdicts.compared, "identical": verdicts.identical,
                                            "records": verdicts.records, "summary": mirror_summary(
                                                verdicts, finished["promote"], mirror.samples)
                                            + "; " + follow_summary(finished["follow"])
                                            + "; " + filtered_summary(finished["filtered"])}
    finally:
        await asyncio.to_thread(cluster.stop)
        if mirror is not None:
            await asyncio.to_thread(mirror.stop)
        if extra_faults is not None:
            await extra_faults.close()
        copy_logs(cluster, out)
    if config.far_catchup:
        details["far_catchup"] = count_far_events(sorted(out.glob("node*.log")))
    details["windows"] = [vars(w) for w in nemesis.windows] if "nemesis" in locals() else []
    details["fault_counts"] = dict(nemesis.counts) if "nemesis" in locals() else {}
    if "nemesis" in locals() and nemesis.mover is not None:
        details["moves"] = [vars(record) for record in nemesis.mover.records]
        details["moves_summary"] = summarize_moves(nemesis.mover.records)
    details["stats"] = result.stats
    details["anomalies"] = result.counts()
    details["unchecked"] = list(result.unchecked)
    summary, ok = _summary(config, details, result)
    details["summary"] = summary
    (out / "summary.txt").write_text(summary + "\n")
    (out / "details.json").write_text(json.dumps(details, indent=1, default=str))
    (out / "anomalies.txt").write_text("\n".join(f"{a.name} {a.key}: {a.explanation} ops={list(a.ops)}"
                                                  for a in result.anomalies) + "\n")
    from chaos.report import write_report

    write_report(out, details, stats)
    if ok:
        shutil.rmtree(out / "data", ignore_errors=True)  # kept only when a run failed, for forensics
        shutil.rmtree(out / "sink-data", ignore_errors=True)
    return RunResult(summary, ok, details)


def _replication_factor(nodes: int) -> int:
    return min(REPLICATION_FACTOR, nodes)


async def create_fresh_topic(client: AsyncClient, topic: str, partitions: int, replication_factor: int,
                             config: dict[str, Any]) -> None:
    """Create `topic` on a cluster the run just made, where nobody else creates topics.

    The client repeats a create whose answer was lost or timed out (on a loaded box the
    first answer can be a 504 after the create committed), and the repeat meets
    TOPIC_EXISTS: Kafka's admin clients meet the same and treat it as done. Here it is
    done only if the topic is the one asked for, so a wrong topic still stops the run.
    """
    try:
        await client.create_topic(topic, partitions=partitions, replication_factor=replication_factor, config=config)
    except RaftlogError as error:
        if error.code != "TOPIC_EXISTS":
            raise
        described = await client.describe_topic(topic)
        if len(described["partitions"]) != partitions:
            raise RuntimeError(f"topic {topic} exists with {len(described['partitions'])} partitions, "
                               f"not the {partitions} this run creates") from error


async def _create_topics(cluster: ChaosCluster, topic_config: dict[str, Any]) -> None:
    servers = [cluster.http(n) for n in cluster.ids]
    async with AsyncClient(servers, timeout_s=30, attempts=20, local_host=CLIENT_HOST) as client:
        for topic, partitions in TOPICS:
            await create_fresh_topic(client, topic, partitions, _replication_factor(len(cluster.ids)), topic_config)
        for topic, partitions in TOPICS:
            for partition in range(partitions):
                await _until_writable(client, topic, partition, 60.0)


async def _until_writable(client: AsyncClient, topic: str, partition: int, timeout_s: float) -> float:
    began = time.monotonic()
    while True:
        try:
            await client.consume(topic, partition, 0, max_records=1)
            return time.monotonic() - began
        except RaftlogError:
            if time.monotonic() - began > timeout_s:
                raise
            await asyncio.sleep(0.1)


async def _gather(*loads: Any) -> None:
    await asyncio.gather(*loads)


async def _group_drain(groups: GroupWorkload, history: HistoryWriter, history_path: Path) -> dict[str, Any]:
    """The groups' final drain (chaos/group_workload.py) to the highest offset the history saw."""
    history.flush()
    targets = targets_of(await asyncio.to_thread(read_history, history_path))
    return await groups.drain({key: max(target.acked, target.read) for key, target in targets.items()})


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _dump_tasks(cluster: ChaosCluster) -> None:
    """Ask every running node to log its tasks' await chains (SIGUSR1): the logs then
    show where a node that did not come back, or its peers, were waiting."""
    for node in cluster.serving():
        cluster.local.signal_node(node, signal.SIGUSR1)
    await asyncio.sleep(1.0)


async def _recovery(cluster: ChaosCluster, history: HistoryWriter, keys: list[PartitionKey],
                    healed_at: float) -> float:
    """Seconds from the final heal until every partition took a write again (the worst one)."""
    servers = [cluster.http(n) for n in cluster.ids]
    worst = 0.0
    async with AsyncClient(servers, timeout_s=5, attempts=3, local_host=CLIENT_HOST) as client:
        for number, key in enumerate(keys):
            process = 10_000 + number
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while True:
                value = f"probe-{key.topic}-{key.partition}-{time.monotonic_ns()}"
                index = history.invoke_send(process, key, [value])
                try:
                    answer = await client.produce(key.topic, [{"value": value, "partition": key.partition}])
                except RaftlogError as error:
                    history.info(index, error.code) if error.code not in ("NOT_LEADER", "LEADER_NOT_AVAILABLE", "UNAVAILABLE") \
                        else history.fail(index, error.code)
                    if time.monotonic() > deadline:
                        return float("inf")
                    await asyncio.sleep(0.1)
                    continue
                history.ok_send(index, [int(answer[0]["offset"])])
                break
            worst = max(worst, time.monotonic() - healed_at)
    return worst


async def _final_reads(cluster: ChaosCluster, history: HistoryWriter, history_path: Path,
                       keys: list[PartitionKey]) -> list[FinalRead]:
    """Every partition read back until it covers what the history saw (chaos/finalread.py).
    The targets come from the history file itself, flushed first: it holds every op,
    the recovery probes included."""
    history.flush()
    targets = targets_of(await asyncio.to_thread(read_history, history_path))
    servers = [cluster.http(n) for n in cluster.ids]
    async with AsyncClient(servers, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as client:
        reader = FinalReader(ClusterReplicas(cluster, client), history)
        return await reader.read_all(keys, targets)


def _group_ops(stats: dict[str, int]) -> str:
    return (f", group: {stats.get('member-ok', 0)} joins/heartbeats/leaves ok, {stats.get('group-fetch-ok', 0)} "
            f"fetches ok, {stats.get('group-commit-ok', 0)} commits ok ({stats.get('group-commit-fail', 0)} refused)")


def _skipped_why(details: dict[str, Any]) -> str:
    """`move` is skipped for the cluster's shape, not this machine's: say why in the line."""
    why = details.get("faults_skipped_why", {})
    return "".join(f" ({kind} unavailable: {reason})" for kind, reason in sorted(why.items()))


def _sink_problems(details: dict[str, Any]) -> list[str]:
    """A mirror run's sink cluster judged as the source is: every replica of every group
    identical up to the group's commit, one leader per term. The end read compares only
    the first sink copy that caught up, so a different second copy shows only here."""
    replicas = details.get("sink_replicas")
    if replicas is None:
        return []
    problems = [f"sink replicas not compared: {replicas['error']}"] if replicas.get("error") else []
    problems += _replica_problems(replicas, "sink replicas")
    violations = details.get("sink_leaders_per_term", {}).get("violations", [])
    if violations:
        problems.append(f"sink: two leaders in one term: {len(violations)}")
    return problems


def _replica_problems(replicas: dict[str, Any], what: str) -> list[str]:
    """A replica comparison's findings (chaos/serverchecks.py), for the source or the sink."""
    problems = []
    if replicas.get("mismatched"):
        problems.append(f"{what} differ in {len(replicas['mismatched'])} groups")
    if replicas.get("stuck"):
        problems.append(f"{what} stuck behind their group's commit: {len(replicas['stuck'])} "
                        f"({'; '.join(replicas['stuck'][:LISTED_PROBLEMS])})")
    return problems


def _sink_part(details: dict[str, Any]) -> str:
    replicas = details.get("sink_replicas")
    if replicas is None:
        return ""
    two = details.get("sink_leaders_per_term", {}).get("violations", [])
    return (f"sink replicas byte-identical: {replicas.get('identical', 0)}/{replicas.get('compared', 0)} groups, "
            f"sink leaders per term: {'ok' if not two else 'VIOLATED'}; ")


def _summary(config: RunConfig, details: dict[str, Any], result: checker.CheckResult) -> tuple[str, bool]:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(details["fault_counts"].items())) or "none"
    stats = result.stats
    replicas = details.get("replicas", {})
    identical = replicas.get("identical", 0)
    compared = replicas.get("compared", 0)
    two_leaders = details.get("leaders_per_term", {}).get("violations", [])
    crashed = details.get("crashed", {})
    problems = []
    if not result.valid:
        problems.append(result.summary())
    if result.unchecked:
        problems.append(f"unchecked {len(result.unchecked)}")
    for final in result.of_class("final-read-incomplete")[:LISTED_PROBLEMS]:
        problems.append(f"{final.key}: {final.explanation}")
    problems += _replica_problems(replicas, "replicas")
    if two_leaders:
        problems.append(f"two leaders in one term: {len(two_leaders)}")
    if crashed:
        problems.append(f"nodes exited on their own: {crashed}")
    if details.get("not_healthy"):
        problems.append(f"a node did not come back after the heal: {details['not_healthy'][:160]}")
    if details.get("recovery_s") == float("inf"):
        problems.append("a partition did not recover")
    if details.get("sink_crashed"):
        problems.append(f"sink nodes exited on their own: {details['sink_crashed']}")
    problems += _sink_problems(details)
    if config.mirror and "mirror" not in details:
        problems.append("the mirror was not checked")
    elif "FAILED" in details.get("mirror", {}).get("promote", ""):
        problems.append(f"promote {details['mirror']['promote']}")
    if details.get("mirror", {}).get("source_unread"):  # not compared: say so, never pass quietly
        problems.append(f"mirror: source partitions not read: {details['mirror']['source_unread']}")
    if details.get("mirror", {}).get("follow", {}).get("source_unread"):
        problems.append(f"mirror: grown or truncated source partitions not read: "
                        f"{details['mirror']['follow']['source_unread']}")
    if details.get("mirror", {}).get("filtered", {}).get("source_unread"):
        problems.append(f"mirror: filtered source partitions not read: {details['mirror']['filtered']['source_unread']}")
    if details.get("moves_unsettled"):
        problems.append(f"decommissioned nodes not back after the heal: {details['moves_unsettled']}")
    ok = not problems
    line = (
        f"chaos: seed {config.seed}, {config.nodes} nodes, {config.duration_s:.0f} s"
        f"{', UNSAFE ' + ','.join(config.unsafe) if config.unsafe else ''}"
        f"{', far catch-up on' if config.far_catchup else ''}{', mirror on' if config.mirror else ''}; faults: {faults}"
        f"{' (skipped: ' + ','.join(details['faults_skipped']) + ')' if details.get('faults_skipped') else ''}"
        f"{_skipped_why(details)}"
        f"{'; moves: ' + details['moves_summary'] if 'moves_summary' in details else ''}"
        f"{'; ' + far_summary(details['far_catchup']) if 'far_catchup' in details else ''}"
        f"{'; ' + details['mirror']['summary'] if 'mirror' in details else ''}; "
        f"ops: {stats.get('values-acknowledged', 0)} values acked, {stats.get('send-ok', 0)} sends ok, "
        f"{stats.get('send-info', 0)} info, {stats.get('send-fail', 0)} fail, {stats.get('poll-ok', 0)} polls ok, "
        f"{stats.get('commit-ok', 0)} commits ok"
        f"{_group_ops(stats) if config.groups else ''}; {result.summary()}; "
        f"replicas byte-identical: {identical}/{compared} groups; "
        f"{_sink_part(details)}"
        f"leaders per term: {'ok' if not two_leaders else 'VIOLATED'}; "
        f"worst recovery after heal: {details.get('recovery_s', float('nan')):.1f} s; "
        f"{'PASS' if ok else 'FAIL: ' + '; '.join(problems)}"
    )
    return line, ok
