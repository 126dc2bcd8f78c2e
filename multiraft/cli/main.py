"""The `raftlog` command line (DESIGN.md section 7).

    raftlog serve ...                      one node (see multiraft.node.config for the flags)
    raftlog cluster up [--nodes 3] [--dir ./data]
    raftlog cluster status
    raftlog cluster wait [--timeout S]      until a metadata leader and every node live (exit 0), else 1
    raftlog cluster verify [--topic T] [--fast]  replicas compared by tictac trees; exit 1 if any differs
    raftlog topic create|list|describe|delete ...
    raftlog produce TOPIC [--key K] [--partition P] [--acks A]
    raftlog consume TOPIC [--partition P] [--from-beginning|--offset N] [--group G] [--follow]
    raftlog group list | describe G | delete G
    raftlog group reset-offsets G --topic T[:P,P] --to-earliest|--to-latest|--to-offset N|--to-datetime T|--shift-by N
                                  [--dry-run|--execute]
    raftlog topic alter TOPIC [--partitions N] [--config K=V] [--delete-config K]
    raftlog node drain N [--wait] | undrain N     leadership off a node (rolling restart), and back
    raftlog node decommission N [--wait] | recommission N   take a node out of the cluster, or cancel
    raftlog node promote N [--replace M]     a metadata learner votes (in place of dead voter M)
    raftlog cluster config [--set replica_move_bytes_per_s=N]   run-time settings (the move throttle)
    raftlog cluster features [finalize [--level N]]   the feature level: each node's, and raise the cluster's
    raftlog leaders balance
    raftlog token create NAME --right R [--output FILE] | list | delete NAME
    raftlog mirror create NAME --source HOST:PORT[,..] --topics PATTERN [--priority P]
                   [--source-tls [--source-ca FILE]] | list | status NAME
                   | pause NAME | resume NAME | delete NAME | promote NAME --topic T
                   | verify NAME [--topic T] [--no-repair]   (docs/mirror.md)
    raftlog export TOPIC --to parquet:DIR [--format csv|json] [--from F] [--until U] [--group G] [--master M]

`--server` (or RAFTLOG_SERVER) picks the HTTP address, several separated by
commas; the default is node 1 of `raftlog cluster up`. A cluster serving HTTPS
takes `--ca FILE` (or RAFTLOG_CA), the CA that signed its certificates, which
also makes plain HOST:PORT addresses https; `--server https://HOST:PORT` with no
CA trusts the system's CAs. A cluster with auth on
takes a bearer token from `--token-file FILE` or RAFTLOG_TOKEN, never from the
command line (`--token VALUE` is refused). Exit codes: 0 done,
1 the cluster refused or failed (the message names the error code), 2 bad
usage or configuration, 3 no server reachable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from multiraft.cli import commands
from multiraft.cli.feature_commands import add_features_parser
from multiraft.cli.group_commands import add_group_parsers
from multiraft.cli.mirror_commands import add_mirror_parsers
from multiraft.cli.serve import add_cluster_up, add_serve_parsers

EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C


class _NoTokenOnTheCommandLine(argparse.Action):
    """`--token VALUE` was replaced by `--token-file` and $RAFTLOG_TOKEN: a command line is
    visible to every user of the machine (`ps`) and kept in shell history. Refused with
    that advice (and without echoing the value), rather than taken, through argparse's
    prefix matching, as an abbreviation of `--token-file`."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error("--token: a token on the command line is visible to other users (ps) and kept in shell "
                     "history; use --token-file FILE (mode 0600) or $RAFTLOG_TOKEN")


def _client_command(parser: argparse.ArgumentParser, func: Callable[..., int], *, inherited: bool = False) -> None:
    """The client options and the command's function. `inherited`: a subcommand of a parser
    that has them too (`cluster features finalize`): absent here they are left out of its
    namespace (argparse.SUPPRESS), else a subparser's None would overwrite the parent's
    `--server X` given before the subcommand."""
    default = argparse.SUPPRESS if inherited else None
    parser.add_argument("--server", default=default,
                        help="HTTP address(es) of the cluster, comma-separated: HOST:PORT or https://HOST:PORT "
                             "(default: $RAFTLOG_SERVER or 127.0.0.1:8080)")
    parser.add_argument("--ca", type=Path, default=default, metavar="FILE",
                        help="the CA certificate (PEM) that signed the cluster's HTTPS certificates; turns on "
                             "HTTPS (default: $RAFTLOG_CA)")
    parser.add_argument("--token-file", type=Path, default=default, metavar="FILE",
                        help="file holding the bearer token (mode 0600), for a cluster started with "
                             "--admin-token-file (default: the token in $RAFTLOG_TOKEN)")
    parser.add_argument("--token", nargs="?", action=_NoTokenOnTheCommandLine, help=argparse.SUPPRESS)
    parser.set_defaults(func=func, client=True)


def _topic_parsers(commands_parser: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    topic = commands_parser.add_parser("topic", help="create, list, describe, alter or delete topics")
    topics = topic.add_subparsers(dest="topic_command", required=True,
                                  metavar="{create,list,describe,alter,delete}")
    create = topics.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=None, help="default: min(3, live nodes)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic setting, e.g. min_insync_replicas=2 (repeatable)")
    _client_command(create, commands.topic_create)
    _client_command(topics.add_parser("list", help="list topics"), commands.topic_list)
    describe = topics.add_parser("describe", help="partitions, leaders, ISR, offsets")
    describe.add_argument("name")
    _client_command(describe, commands.topic_describe)
    alter = topics.add_parser("alter", help="change topic settings, or add partitions")
    alter.add_argument("name")
    alter.add_argument("--partitions", type=int, default=None, metavar="N",
                       help="grow the topic to N partitions (increase only; keyed records may move)")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="set a setting, e.g. retention_ms=3600000 (repeatable)")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                       help="remove a setting: back to its default (repeatable)")
    _client_command(alter, commands.topic_alter)
    delete = topics.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    _client_command(delete, commands.topic_delete)


def _data_parsers(commands_parser: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    produce = commands_parser.add_parser("produce", help="produce stdin lines as records")
    produce.add_argument("topic")
    produce.add_argument("--key", help="key of every record (placement by murmur2)")
    produce.add_argument("--partition", type=int, help="partition of every record")
    produce.add_argument("--acks", default="quorum", choices=("none", "leader", "quorum", "all"))
    produce.add_argument("--linger-ms", type=int, default=10)
    produce.add_argument("--idempotent", action="store_true", help="deduplicated retries (producer id)")
    _client_command(produce, commands.produce)
    consume = commands_parser.add_parser("consume", help="print records, one value per line")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int)
    where = consume.add_mutually_exclusive_group()
    where.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    where.add_argument("--offset", type=int, help="start at this offset")
    consume.add_argument("--group", help="consumer group: without --partition, join it as a member (the cluster "
                                         "splits the partitions among members); with one, resume from and commit "
                                         "its offsets")
    consume.add_argument("--session-timeout-ms", type=int, default=None, metavar="MS",
                         help="with --group, when the group is created: how long a silent member keeps its "
                              "partitions (default 45000)")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new records (Ctrl-C stops)")
    consume.add_argument("--max-records", type=int, default=None, help="stop after this many records")
    consume.add_argument("--wait-ms", type=int, default=5000, help="long-poll wait per request")
    consume.add_argument("--show-offsets", action="store_true", help="print partition, offset, key, value")
    _client_command(consume, commands.consume)
    export = commands_parser.add_parser("export", help="write a topic's records to Parquet/CSV/JSON with Spark")
    export.add_argument("topic")
    export.add_argument("--to", required=True, metavar="FORMAT:DIR", help="e.g. parquet:/tmp/out (csv:, json:)")
    export.add_argument("--format", choices=("parquet", "csv", "json"), help="instead of the --to prefix")
    export.add_argument("--from", dest="start", metavar="F", help="earliest (default), N, P:N,P:N, "
                        "{\"P\":N}, an ISO 8601 time or @MS; with --group: the group's committed offsets")
    export.add_argument("--until", metavar="U", help="latest (default: the high watermark now), or as --from")
    export.add_argument("--group", help="start from its committed offsets; commit the end after the write")
    export.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    export.add_argument("--skip-lost", action="store_true",
                        help="skip records retention removed instead of failing (failOnDataLoss=false)")
    _client_command(export, commands.export)


def _node_parsers(commands_parser: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    node = commands_parser.add_parser("node", help="drain a node (leadership, for a rolling restart) or "
                                                   "decommission it (take it out of the cluster)")
    nodes = node.add_subparsers(dest="node_command", required=True,
                                metavar="{drain,undrain,decommission,recommission,promote}")
    drain = nodes.add_parser("drain", help="move every leadership off a node; it takes none until undrained")
    drain.add_argument("node_id", type=int)
    drain.add_argument("--wait", action="store_true",
                       help="print progress until it leads no partition (nor the metadata group, when "
                            "another voter can take it)")
    drain.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up waiting after S s")
    _client_command(drain, commands.node_drain)
    undrain = nodes.add_parser("undrain", help="let a drained node lead again (balancing brings it back)")
    undrain.add_argument("node_id", type=int)
    _client_command(undrain, commands.node_undrain)
    decommission = nodes.add_parser("decommission", help="take a node out: it leads nothing, its replicas move "
                                                         "to the other nodes, then it leaves the metadata group")
    decommission.add_argument("node_id", type=int)
    decommission.add_argument("--wait", action="store_true", help="print progress until it is done")
    decommission.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="give up waiting after S s")
    _client_command(decommission, commands.node_decommission)
    promote = nodes.add_parser("promote", help="make a learner of the metadata group a voter (--replace M: in "
                                               "place of dead voter M, without a restart)")
    promote.add_argument("node_id", type=int)
    promote.add_argument("--replace", type=int, metavar="M", help="the dead voter it replaces")
    _client_command(promote, commands.node_promote)
    recommission = nodes.add_parser("recommission", help="cancel a decommission (moved replicas stay moved)")
    recommission.add_argument("node_id", type=int)
    _client_command(recommission, commands.node_recommission)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftlog", description="A replicated, partitioned message log.")
    subcommands = parser.add_subparsers(dest="command", required=True,
                                        metavar="{serve,cluster,topic,produce,consume,group,node,mirror,token,leaders,export}")
    add_serve_parsers(subcommands)
    cluster = subcommands.add_parser("cluster", help="local cluster and cluster status")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True,
                                              metavar="{up,status,wait,verify,config,features}")
    add_cluster_up(cluster_commands)
    _client_command(cluster_commands.add_parser("status", help="nodes, groups, leaders, ISR, lag"),
                    commands.cluster_status)
    wait = cluster_commands.add_parser("wait", help="wait until the cluster is ready: a metadata leader, "
                                                    "every node live (GET /v1/health?ready=cluster)")
    wait.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds (60)")
    _client_command(wait, commands.cluster_wait)
    verify = cluster_commands.add_parser("verify", help="compare every partition's replicas with its leader "
                                                        "(tictac trees); exit 1 if any is not identical (admin)")
    verify.add_argument("--topic", action="append", metavar="T", help="only this topic; repeatable")
    verify.add_argument("--fast", action="store_true",
                        help="closed segments count by their tree sidecars, only the open ones are read (rot "
                             "under a sidecar is not seen); without it every replica reads its whole log")
    _client_command(verify, commands.cluster_verify)
    config = cluster_commands.add_parser("config", help="run-time cluster settings: the move throttle "
                                                        "replica_move_bytes_per_s (admin)")
    config.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="set a setting for every node (VALUE an integer, or 'default'); repeatable")
    _client_command(config, commands.cluster_config)
    add_features_parser(cluster_commands, _client_command)
    _topic_parsers(subcommands)
    _data_parsers(subcommands)
    add_mirror_parsers(subcommands, _client_command)
    token = subcommands.add_parser("token", help="bearer tokens of a cluster with auth on (admin)")
    tokens = token.add_subparsers(dest="token_command", required=True, metavar="{create,list,delete}")
    create = tokens.add_parser("create", help="make a token (replaces one of the same name); prints it once")
    create.add_argument("name")
    create.add_argument("--right", action="append", required=True, metavar="RIGHT",
                        help="admin, read:TOPIC or write:TOPIC (TOPIC or *); repeatable")
    create.add_argument("--output", type=Path, metavar="FILE",
                        help="write the token to FILE, created mode 0600 (refused if it exists), not stdout")
    _client_command(create, commands.token_create)
    _client_command(tokens.add_parser("list", help="token names and rights"), commands.token_list)
    delete = tokens.add_parser("delete", help="delete a token")
    delete.add_argument("name")
    _client_command(delete, commands.token_delete)
    add_group_parsers(subcommands, _client_command)
    _node_parsers(subcommands)
    leaders = subcommands.add_parser("leaders", help="partition leadership")
    leaders_commands = leaders.add_subparsers(dest="leaders_command", required=True, metavar="{balance}")
    _client_command(leaders_commands.add_parser("balance", help="even out leaders per node"),
                    commands.leaders_balance)
    return parser


def _run_client_command(args: argparse.Namespace) -> int:
    from multiraft.client import DEFAULT_SERVER, Client, RaftlogError, UnavailableError

    server = args.server or os.environ.get("RAFTLOG_SERVER") or DEFAULT_SERVER
    try:
        with Client(server, attempts=4, timeout_s=max(30.0, getattr(args, "wait_ms", 0) / 1000 + 15),
                    token_file=args.token_file, ca_file=args.ca) as client:
            return args.func(client, args)
    except UnavailableError as error:
        print(f"raftlog: cannot reach the cluster at {server}: {error.message}\n"
              f"(is it running? start one with 'raftlog cluster up', or pass --server / RAFTLOG_SERVER)",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    except RaftlogError as error:
        print(f"raftlog: {error.code}: {error.message}", file=sys.stderr)
        return commands.EXIT_FAILED
    except ValueError as error:
        print(f"raftlog: {error}", file=sys.stderr)
        return commands.EXIT_USAGE
    except KeyboardInterrupt:  # a second Ctrl-C (the first asks a consumer to stop cleanly: interrupt.py)
        return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script `raftlog`."""
    if sys.flags.optimize:
        print("raftlog: refusing to run under python -O (assertions guard invariants)", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if getattr(args, "client", False):
        return _run_client_command(args)
    return args.func(args)

