"""The client commands of `raftlog`: topics, produce, consume, cluster status, leaders, export.

Each talks to the cluster through `multiraft.client` exactly as a user's
program would. Errors leave as one line on stderr naming the code and what to
do; exit codes: 0 done, 1 the cluster refused or failed, 3 no server reachable.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

from multiraft.cli.group_commands import consume_as_member
from multiraft.cli.interrupt import StopOnInterrupt
from multiraft.client import Client, RaftlogError
from multiraft.net.secret_files import create_private_file

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
PROGRESS_EVERY_RECORDS = 10_000
STDIN_CHUNK_LINES = 1000
CLUSTER_WAIT_POLL_S = 0.2
CLUSTER_WAIT_MAX_S = 3600.0


def _chunks(stream: Any, size: int) -> Any:
    """Lines in lists of at most `size`; a short read of a pipe ends a chunk early only at EOF."""
    chunk: list[bytes] = []
    for line in stream:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _config_pairs(pairs: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--config expects KEY=VALUE, got {pair!r}")
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    return config


def topic_create(client: Client, args: argparse.Namespace) -> int:
    topic = client.create_topic(args.name, args.partitions, args.replication_factor, _config_pairs(args.config))
    print(f"created topic {topic['name']}: {len(topic['partitions'])} partitions, "
          f"replication factor {topic['replication_factor']}")
    return EXIT_OK


def topic_alter(client: Client, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = _config_pairs(args.config) | dict.fromkeys(args.delete_config)
    partitions = getattr(args, "partitions", None)
    if not changes and partitions is None:
        raise ValueError("give --partitions N, or at least one --config KEY=VALUE or --delete-config KEY")
    if partitions is not None:
        topic = client.create_partitions(args.name, partitions)
        print(f"topic {topic['name']}: {len(topic['partitions'])} partitions "
              "(keyed records may now map to other partitions)")
        if not changes:
            return EXIT_OK
    topic = client.alter_topic_config(args.name, changes)
    settings = ", ".join(f"{k}={v}" for k, v in sorted(topic["config"].items())) or "defaults"
    print(f"topic {topic['name']}: {settings}")
    return EXIT_OK


def topic_list(client: Client, args: argparse.Namespace) -> int:
    topics = client.list_topics()
    print(_table([[t["name"], t["partitions"], t["replication_factor"]] for t in topics],
                 ["TOPIC", "PARTITIONS", "REPLICATION"]))
    return EXIT_OK


def _merged_partitions(client: Client, topic: str, servers: list[str]) -> list[dict[str, Any]]:
    """Each partition as its leader sees it (ISR, offsets), with the lag of the slowest replica."""
    views: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for server in servers:
        try:
            for partition in client.describe_topic(topic, server=server)["partitions"]:
                views[partition["partition"]].append(partition)
        except RaftlogError:
            continue
    merged = []
    for number in sorted(views):
        seen = views[number]
        leader_view = next((v for v in seen if v.get("role") == "leader"), seen[0])
        ends = [v["high_watermark"] for v in seen if v["high_watermark"] is not None]
        lag = (max(ends) - min(ends)) if ends else None
        merged.append({**leader_view, "lag": lag})
    return merged


def _alive_servers(client: Client) -> list[str]:
    cluster = client.cluster()
    return [n["http_addr"] for n in cluster["nodes"] if n["status"] == "alive"]


def topic_describe(client: Client, args: argparse.Namespace) -> int:
    topic = client.describe_topic(args.name)
    print(f"topic {topic['name']}  replication factor {topic['replication_factor']}  config {topic['config']}")
    rows = [[p["partition"], p["group_id"], p["leader"], ",".join(map(str, p["replicas"])),
             ",".join(map(str, p["isr"])) if p["isr"] is not None else None, p["log_start_offset"],
             p["high_watermark"], p["lag"]] for p in _merged_partitions(client, args.name, _alive_servers(client))]
    print(_table(rows, ["PARTITION", "GROUP", "LEADER", "REPLICAS", "ISR", "START", "HWM", "LAG"]))
    return EXIT_OK


def topic_delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_topic(args.name)
    print(f"deleted topic {args.name}")
    return EXIT_OK


def cluster_status(client: Client, args: argparse.Namespace) -> int:
    cluster = client.cluster()
    leader = cluster["metadata_leader"]
    rows = [[n["node_id"] if n["node_id"] != leader else f"{n['node_id']}*", n["http_addr"], n["raft_addr"],
             n["rack"], n["status"] + (", drained" if n.get("drained") else ""), n.get("partitions_led")]
            for n in cluster["nodes"]]
    print(f"metadata group: leader {leader or 'none'}, term {cluster['term']}, "
          f"commit index {cluster['commit_index']}  (* = metadata leader)")
    print(_table(rows, ["NODE", "HTTP", "RAFT", "RACK", "STATUS", "LEADS"]))
    servers = [n["http_addr"] for n in cluster["nodes"] if n["status"] == "alive"]
    rows = []
    for topic in client.list_topics():
        for p in _merged_partitions(client, topic["name"], servers):
            isr = ",".join(map(str, p["isr"])) if p["isr"] is not None else None
            leaving = p.get("leaving") or []
            moving = f"from {','.join(map(str, leaving))}" if leaving else ""
            rows.append([topic["name"], p["partition"], p["group_id"], p["leader"],
                         ",".join(map(str, p["replicas"])), isr, p["high_watermark"], p["lag"], moving])
    print()
    print(_table(rows, ["TOPIC", "PARTITION", "GROUP", "LEADER", "REPLICAS", "ISR", "HWM", "LAG", "MOVING"])
          if rows else "no topics")
    moving = sum(1 for row in rows if row[-1])
    if moving:
        print(f"\n{moving} partition(s) moving: a copy is made on the new replicas, then the leaving ones drop theirs")
    return EXIT_OK


def cluster_wait(client: Client, args: argparse.Namespace) -> int:
    """Poll `GET /v1/health?ready=cluster` on every given server until each answers ready
    (a metadata leader, every known node live), for at most `--timeout` seconds; then the
    last refusal (exit 1) or unreachable server (exit 3) stands."""
    if not 0 < args.timeout <= CLUSTER_WAIT_MAX_S:
        raise ValueError(f"--timeout: seconds, above 0 and at most {CLUSTER_WAIT_MAX_S:.0f}")
    deadline = time.monotonic() + args.timeout
    waiting = list(client.aio.servers)
    while waiting:
        try:
            answer = client.health(server=waiting[0], ready="cluster")
        except RaftlogError:  # not ready yet, or not reachable yet: ask again until the deadline
            if time.monotonic() >= deadline:
                raise
            time.sleep(CLUSTER_WAIT_POLL_S)
            continue
        waiting.pop(0)
    print(f"cluster ready: metadata leader {answer['metadata_leader']}, "
          f"nodes {', '.join(map(str, answer['nodes']))}")
    return EXIT_OK


def token_create(client: Client, args: argparse.Namespace) -> int:
    """The token alone on stdout, for scripts; or, with --output, in a new 0600 file (a
    shell's `> FILE` makes it as the umask says, usually readable by all, and then
    `--token-file` refuses it)."""
    output: Path | None = args.output
    if output is not None and (output.exists() or output.is_symlink()):
        raise ValueError(f"--output: {output} exists; name a new file (the token is written once)")
    made = client.create_token(args.name, args.right)
    rights = f"token {made['name']} with rights {', '.join(made['rights'])}"
    if output is None:
        print(made["token"])  # TOKEN=$(raftlog token create ...)
        print(f"{rights}: shown once, keep it", file=sys.stderr)
        return EXIT_OK
    try:
        written = create_private_file(output, made["token"].encode() + b"\n")
    except OSError as error:
        written, reason = False, error.strerror
    else:
        reason = "it appeared meanwhile, and is left as it is"
    if not written:
        raise ValueError(f"--output: token {made['name']} was made but not written to {output} ({reason}); "
                         f"create it again (the same name replaces it)")
    print(f"{rights}: written to {output} (mode 0600)", file=sys.stderr)
    return EXIT_OK


def token_list(client: Client, args: argparse.Namespace) -> int:
    print(_table([[t["name"], ", ".join(t["rights"])] for t in client.list_tokens()], ["TOKEN", "RIGHTS"]))
    return EXIT_OK


def token_delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_token(args.name)
    print(f"deleted token {args.name}")
    return EXIT_OK


def leaders_balance(client: Client, args: argparse.Namespace) -> int:
    answer = client.balance_leaders()
    by_node = ", ".join(f"node {n}: {c if c >= 0 else 'not reached'}" for n, c in answer["by_node"].items())
    print(f"{answer['transfers_started']} leadership transfers started ({by_node})")
    return EXIT_OK if all(c >= 0 for c in answer["by_node"].values()) else EXIT_FAILED


def cluster_verify(client: Client, args: argparse.Namespace) -> int:
    """Every partition's replicas against its leader (the scrubber), call after call until
    done; exits 1 when any partition is not identical (behind counts: it was not compared whole)."""
    rows, start, clean = [], 0, True
    while start is not None:
        answer = client.verify(args.topic, start, not args.fast)
        for p in answer["partitions"]:
            clean = clean and p["status"] == "identical"
            ranges = " ".join(f"[{lo},{hi})" for lo, hi in p["ranges"]) or "-"
            odd = ",".join(str(r["node"]) for r in p["replicas"] if r["status"] != "identical") or "-"
            rows.append([p["topic"], p["partition"], p["status"], p["leader"], p["high_watermark"], odd, ranges,
                         "yes" if p["repair_started"] else "no"])
        start = answer["next_start"]
    print(_table(rows, ["TOPIC", "PARTITION", "STATUS", "LEADER", "HW", "REPLICAS", "RANGES", "REPAIR"]))
    return EXIT_OK if clean else EXIT_FAILED


def produce(client: Client, args: argparse.Namespace) -> int:
    key = args.key.encode() if args.key is not None else None
    sent = failed = 0
    pending: collections.deque[Any] = collections.deque()
    started = time.monotonic()
    first_error: BaseException | None = None
    with client.producer(args.topic, acks=args.acks, linger_ms=args.linger_ms, idempotent=args.idempotent) as p:
        chunk_lines = 1 if sys.stdin.isatty() else STDIN_CHUNK_LINES  # typed lines go at once
        for chunk in _chunks(sys.stdin.buffer, chunk_lines):
            pending.extend(p.send_many([line.rstrip(b"\r\n") for line in chunk], key, partition=args.partition))
            before = sent
            sent += len(chunk)
            while pending and (pending[0].done() or len(pending) > 100_000):
                error = pending.popleft().exception()
                if error is not None:
                    failed += 1
                    first_error = first_error or error
            if sent // PROGRESS_EVERY_RECORDS > before // PROGRESS_EVERY_RECORDS:
                print(f"\rproduced {sent} records ({sent / (time.monotonic() - started):.0f}/s)", end="",
                      file=sys.stderr, flush=True)
        p.flush()
    for future in pending:
        error = future.exception()
        if error is not None:
            failed += 1
            first_error = first_error or error
    if sent >= PROGRESS_EVERY_RECORDS:
        print(file=sys.stderr)
    print(f"produced {sent - failed} of {sent} records to {args.topic}", file=sys.stderr)
    if first_error is not None:
        print(f"raftlog produce: {failed} records failed: {first_error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def consume(client: Client, args: argparse.Namespace) -> int:
    if args.group and args.partition is None:
        return consume_as_member(client, args)  # the cluster splits the partitions (group_commands.py)
    if args.session_timeout_ms is not None:
        raise ValueError("--session-timeout-ms is for a group member (--group without --partition)")
    start: str | dict[int, int] = "earliest" if args.from_beginning else "latest"
    if args.offset is not None:
        partitions = [args.partition] if args.partition is not None else [
            p["partition"] for p in client.describe_topic(args.topic)["partitions"]]
        start = {p: args.offset for p in partitions}
    consumer = client.consumer(args.topic, group=args.group, start=start,
                               partitions=None if args.partition is None else [args.partition],
                               wait_ms=args.wait_ms if args.follow else min(args.wait_ms, 1000))
    printed = 0
    with StopOnInterrupt(consumer.wakeup) as interrupt:
        while (args.max_records is None or printed < args.max_records) and not interrupt.requested:
            records = consumer.poll()  # Ctrl-C ends its long poll early, without moving a position
            if not records and not args.follow:
                break
            if args.max_records is not None and printed + len(records) > args.max_records:
                records, rest = records[: args.max_records - printed], records[args.max_records - printed :]
                for record in reversed(rest):  # give back what is not printed, so a group does not skip it
                    consumer.seek(record.partition, record.offset)
            for record in records:  # printed even after a Ctrl-C: their positions have moved
                value = (record.value or b"").decode("utf-8", "replace")
                if args.show_offsets:
                    key = (record.key or b"").decode("utf-8", "replace")
                    print(f"{record.partition}\t{record.offset}\t{key}\t{value}")
                else:
                    print(value)
                printed += 1
            sys.stdout.flush()
            if args.group and records:
                consumer.commit()
        if args.group:
            consumer.commit()
    return EXIT_OK


def export(client: Client, args: argparse.Namespace) -> int:
    """Runs Spark (spark_connector.export); imported here so other commands never load PySpark."""
    from spark_connector.export import export_command

    return export_command(args, client.aio.servers)


DRAIN_POLL_S = 1.0


def _drain_done(cluster: dict[str, Any], node_id: int) -> tuple[bool, int, bool]:
    """(done, partitions led, leads the metadata group) for a drained node, from one node's view.
    Done once it leads no partition, and no longer leads the metadata group unless no other
    voter of it is registered, alive and not drained (then that leadership cannot move)."""
    nodes = {n["node_id"]: n for n in cluster["nodes"]}
    led = nodes[node_id]["partitions_led"] if node_id in nodes else 0
    leads_metadata = cluster["metadata_leader"] == node_id
    movable = any(v != node_id and v in nodes and nodes[v]["status"] == "alive" and not nodes[v]["drained"]
                  for v in cluster.get("metadata_voters", []))
    return led == 0 and not (leads_metadata and movable), led, leads_metadata


def node_drain(client: Client, args: argparse.Namespace) -> int:
    """Drain, and with --wait print the partitions it still leads until none (a second apart)."""
    if not 0 < args.timeout <= CLUSTER_WAIT_MAX_S:
        raise ValueError(f"--timeout: seconds, above 0 and at most {CLUSTER_WAIT_MAX_S:.0f}")
    status = client.drain_node(args.node_id)
    print(f"node {args.node_id} drained: leads {status['partitions_led']} partitions"
          f"{' and the metadata group' if status['leads_metadata'] else ''}")
    if not args.wait:
        return EXIT_OK
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        done, led, leads_metadata = _drain_done(client.cluster(), args.node_id)
        if (led, leads_metadata) != last:
            print(f"node {args.node_id}: leads {led} partitions{' and the metadata group' if leads_metadata else ''}")
            last = (led, leads_metadata)
        if done:
            extra = " (and the metadata group: no other voter can take it)" if leads_metadata else ""
            print(f"node {args.node_id} leads no partition{extra}")
            return EXIT_OK
        if time.monotonic() >= deadline:
            print(f"raftlog: node {args.node_id} still leads {led} partitions after {args.timeout:.0f} s",
                  file=sys.stderr)
            return EXIT_FAILED
        time.sleep(DRAIN_POLL_S)


def _describe_decommission(node_id: int, status: dict[str, Any]) -> str:
    stage = status["stage"]
    if stage is None:
        return f"node {node_id} is not decommissioning"
    if stage == "done":
        return f"node {node_id} is decommissioned: it holds no replica and is out of the metadata group; stop it"
    text = (f"node {node_id}: {stage.replace('_', ' ')}, {status['replicas']} replicas left, "
            f"leads {status['partitions_led']} partitions, metadata {status['metadata_member']}")
    return text + (f" ({status['waiting_for']})" if status["waiting_for"] else "")


def cluster_config(client: Client, args: argparse.Namespace) -> int:
    """`cluster config` prints the run-time settings; `--set KEY=VALUE` (VALUE an integer, or
    `default` for each node's own) changes them first."""
    changes: dict[str, Any] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: KEY=VALUE, got {item!r}")
        if value == "default":
            changes[key] = None
        else:
            try:
                changes[key] = int(value)
            except ValueError:
                raise ValueError(f"--set {key}: an integer or 'default', got {value!r}") from None
    settings = client.set_cluster_settings(changes) if changes else client.cluster_settings()
    for key, setting in sorted(settings.items()):
        source = "cluster setting" if setting["cluster"] is not None else "this node's own"
        print(f"{key} = {setting['value']} ({source})")
    return EXIT_OK


def node_decommission(client: Client, args: argparse.Namespace) -> int:
    """Decommission, and with --wait print progress until it is done (a second apart)."""
    if not 0 < args.timeout <= CLUSTER_WAIT_MAX_S:
        raise ValueError(f"--timeout: seconds, above 0 and at most {CLUSTER_WAIT_MAX_S:.0f}")
    status = client.decommission_node(args.node_id)
    print(_describe_decommission(args.node_id, status))
    if not args.wait:
        return EXIT_OK
    deadline = time.monotonic() + args.timeout
    last = _describe_decommission(args.node_id, status)
    while status["stage"] not in ("done", None):  # None: recommissioned meanwhile
        if time.monotonic() >= deadline:
            print(f"raftlog: node {args.node_id} is not decommissioned after {args.timeout:.0f} s: {last}",
                  file=sys.stderr)
            return EXIT_FAILED
        time.sleep(DRAIN_POLL_S)
        status = client.decommission_status(args.node_id)
        text = _describe_decommission(args.node_id, status)
        if text != last:
            print(text)
            last = text
    return EXIT_OK if status["stage"] == "done" else EXIT_FAILED


def node_promote(client: Client, args: argparse.Namespace) -> int:
    status = client.promote_node(args.node_id, args.replace)
    replaced = f" in place of node {args.replace}" if args.replace is not None else ""
    print(f"node {args.node_id} votes in the metadata group{replaced}: voters "
          f"{', '.join(map(str, status['metadata_voters']))}; learners "
          f"{', '.join(map(str, status['metadata_learners'])) or 'none'}")
    return EXIT_OK


def node_recommission(client: Client, args: argparse.Namespace) -> int:
    status = client.recommission_node(args.node_id)
    print(f"node {args.node_id} recommissioned: it keeps {status['replicas']} replicas and may take new ones; "
          "balancing brings its preferred leaderships back")
    return EXIT_OK


def node_undrain(client: Client, args: argparse.Namespace) -> int:
    status = client.undrain_node(args.node_id)
    print(f"node {args.node_id} undrained: leads {status['partitions_led']} partitions now; balancing brings "
          "its preferred leaderships back")
    return EXIT_OK
