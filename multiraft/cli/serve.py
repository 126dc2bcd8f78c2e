"""`raftlog serve` and `raftlog cluster up`: the processes of a cluster.

`serve` runs one node and its HTTP API until SIGTERM or SIGINT, then stops
both cleanly (HTTP first, so no request meets a stopped node).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from pathlib import Path

import structlog
import uvloop

from multiraft.cli import logs
from multiraft.cli.launcher import HTTP_PORT_DEFAULT, RAFT_PORT_DEFAULT, LauncherError, LocalCluster
from multiraft.node.config import ConfigError, load_config
from multiraft.node.diagnostics import dump_tasks
from multiraft.node.unsafe import ChaosHooks

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def serve(args: argparse.Namespace) -> int:
    settings = {k: v for k, v in vars(args).items() if k != "log_level"}
    try:
        config = load_config(argparse.Namespace(**settings))
        hooks = ChaosHooks.from_environment()  # an unknown RAFTLOG_UNSAFE name refuses to start
    except ConfigError as error:
        print(f"raftlog serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(args.log_level)
    try:
        # uvloop: the same asyncio programme with a libuv loop and C transports. A write
        # passes through Python a handful of times per node; measured on this machine,
        # each node spent 10-15 % less CPU per sequential write, and the p99 fell with it.
        uvloop.run(_serve(config, hooks))
    except OSError as error:
        print(f"raftlog serve: cannot listen: {error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


async def _serve(config: object, hooks: ChaosHooks) -> None:
    from multiraft.http import HttpServer
    from multiraft.node.node import Node

    node = Node(config, hooks=hooks)  # type: ignore[arg-type]
    server = HttpServer(node.api, node.config.http_addr.host, node.config.http_addr.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    logger = structlog.get_logger("raftlog.serve").bind(node_id=node.id)
    loop.add_signal_handler(signal.SIGUSR1, lambda: dump_tasks(logger, _peer_states(node)))
    try:
        await node.start()
        await server.start()
        logger.info("serving", http=server.url, raft=str(node.config.raft_addr))
        await stop.wait()
        logger.info("stopping")
    finally:
        await server.stop()
        await node.stop()


def _peer_states(node: object) -> dict[str, object]:
    transport = getattr(node, "transport", None)
    if transport is None:
        return {}
    return {"peers": {peer: dataclasses.asdict(stats) for peer, stats in transport.stats().peers.items()}}


def cluster_up(args: argparse.Namespace) -> int:
    # Ctrl-C must stop the cluster even if whoever started us ignored SIGINT (a child
    # inherits an ignored signal, and Python then leaves it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cluster = LocalCluster(Path(args.dir), args.nodes, raft_port=args.raft_port, http_port=args.http_port,
                               tls=args.tls)
        cluster.start()
    except LauncherError as error:
        print(f"raftlog cluster up: {error}", file=sys.stderr)
        return EXIT_FAILED
    interrupted = False
    try:
        print(f"starting {len(cluster.nodes)} nodes, data under {cluster.directory}", file=sys.stderr)
        started = time.monotonic()
        cluster.wait_healthy(args.wait)
        # Ready too (a metadata leader, every node live), so the printed commands work at
        # once: a topic created a second after start asks for every node's replica.
        cluster.wait_ready(max(1.0, args.wait - (time.monotonic() - started)))
        scheme = cluster.scheme
        for node in cluster.nodes:
            print(f"node {node.node_id}: {scheme}://{node.http_addr}  raft {node.raft_addr}  "
                  f"pid {node.process.pid if node.process else '-'}  log {node.log_file}")
        first = cluster.nodes[0].http_addr
        ca = f" --ca {cluster.ca.cert}" if cluster.tls else ""
        curl = f"curl --cacert {cluster.ca.cert}" if cluster.tls else "curl"
        tls_note = (f"  (TLS: HTTPS and mutual TLS between nodes, a throwaway CA in {cluster.ca.cert.parent};\n"
                    f"   export RAFTLOG_CA={cluster.ca.cert} to drop --ca; a browser warns about the\n"
                    "   certificate unless it is told to trust that CA)\n") if cluster.tls else ""
        print(f"\nready. try:\n  echo hello | raftlog produce demo --server {first}{ca}\n"
              f"  raftlog consume demo --from-beginning --server {first}{ca}\n"
              f"  {curl} {scheme}://{first}/v1/cluster\n  open {scheme}://{first}/ui in a browser\n"
              f"{tls_note}Ctrl-C stops the cluster.", flush=True)
        _wait_for_interrupt(cluster)
        interrupted = True
    except LauncherError as error:
        print(f"raftlog cluster up: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        codes = cluster.stop()
        print(f"stopped: {', '.join(f'node {n} exit {c}' for n, c in codes.items())}", file=sys.stderr)
    return EXIT_OK if interrupted else EXIT_FAILED


def _wait_for_interrupt(cluster: LocalCluster) -> None:
    """Block until Ctrl-C or SIGTERM; a child that dies is reported, the rest keep running."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    reported: set[int] = set()
    while True:
        for node in cluster.nodes:
            if node.process is not None and node.process.poll() is not None and node.node_id not in reported:
                reported.add(node.node_id)
                print(f"node {node.node_id} exited with code {node.process.returncode}; see {node.log_file}",
                      file=sys.stderr, flush=True)
        time.sleep(0.5)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def add_serve_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from multiraft.node.config import add_serve_arguments

    serve_parser = commands.add_parser("serve", help="run one node")
    add_serve_arguments(serve_parser)
    serve_parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve_parser.set_defaults(func=serve)


def add_cluster_up(cluster_commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = cluster_commands.add_parser("up", help="start a local cluster of child processes (Ctrl-C stops it)")
    up.add_argument("--nodes", type=int, default=3, help="1, 3 or 5 nodes on 127.0.0.1..N (default 3)")
    up.add_argument("--dir", default="./data", help="data directory (default ./data)")
    up.add_argument("--raft-port", type=int, default=RAFT_PORT_DEFAULT)
    up.add_argument("--http-port", type=int, default=HTTP_PORT_DEFAULT)
    up.add_argument("--wait", type=float, default=60.0,
                    help="seconds to wait for the nodes to be healthy and the cluster ready")
    up.add_argument("--tls", action="store_true",
                    help="HTTPS and mutual TLS between nodes, with a throwaway CA and certificates made in --dir "
                         "(needs the openssl command; kept for later runs on the same --dir)")
    up.set_defaults(func=cluster_up)
