"""`raftlog mirror ...`: mirror links of a sink cluster (docs/mirror.md).

    raftlog mirror create NAME --source HOST:PORT[,..] --topics PATTERN [--priority high|normal|low]
                          [--source-token-file FILE] [--verify-interval-s SECONDS]
                          [--source-tls [--source-ca FILE]] [--on-source-truncated stop|resync]
                          [--filter key-prefix=P | --filter header=NAME[=VALUE] ...]
    raftlog mirror alter NAME --on-source-truncated stop|resync
    raftlog mirror list | status NAME | pause NAME | resume NAME | delete NAME
    raftlog mirror promote NAME --topic TOPIC
    raftlog mirror verify NAME [--topic TOPIC] [--no-repair]

The source's token comes from a file (mode 0600), never the command line, as the
cluster's own token does; it is stored in the sink's catalog and never shown back.
`--source-tls` reads the source over HTTPS; `--source-ca` gives the PEM CA certificates
trusted for it (public: the file's mode is not checked), sent to the sink and kept in
the link; without it the sink nodes' system trust store ($SSL_CERT_FILE, $SSL_CERT_DIR).
`--on-source-truncated` says what a mirror partition does when the source's retention
deleted offsets it had not copied (`ON_SOURCE_TRUNCATED_HELP`). `--filter` (repeatable)
copies only the records a clause matches; the others become gaps (docs/mirror.md, "Record filters").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multiraft.cli.commands import EXIT_FAILED, EXIT_OK, _table

if TYPE_CHECKING:
    from multiraft.client import Client

ClientCommand = Callable[[argparse.ArgumentParser, Callable[..., int]], None]
ON_SOURCE_TRUNCATED_HELP = (
    "what a mirror partition does when the source's retention deleted offsets it had not copied yet (a paused or "
    "slow mirror): stop (the default) waits in state source_truncated and discards nothing; resync starts the "
    "partition again at the source's log start: besides what the source deleted, the mirror discards its own copy "
    "of the older offsets (all it held) and the consumer offsets committed on it, and reads below the new start "
    "get 416 OFFSET_OUT_OF_RANGE")


def add_mirror_parsers(subcommands: argparse._SubParsersAction, client_command: ClientCommand) -> None:  # type: ignore[type-arg]
    mirror = subcommands.add_parser("mirror", help="mirror topics of a source cluster here (links; admin)")
    mirrors = mirror.add_subparsers(dest="mirror_command", required=True,
                                    metavar="{create,alter,list,status,pause,resume,delete,promote,verify}")
    create = mirrors.add_parser("create", help="link a source cluster: its topics matching --topics are mirrored")
    create.add_argument("name")
    create.add_argument("--source", required=True, help="the source's HTTP addresses, HOST:PORT[,HOST:PORT..]")
    create.add_argument("--topics", required=True, help="a topic pattern (* any run, ? one character)")
    create.add_argument("--priority", choices=("high", "normal", "low"), default="normal")
    create.add_argument("--source-token-file", type=Path, default=None, metavar="FILE",
                        help="file holding a bearer token of the source (read rights on the topics)")
    create.add_argument("--verify-interval-s", type=int, default=None, metavar="SECONDS",
                        help="a full sync of each mirror partition this often, with repair (default: on demand)")
    create.add_argument("--source-tls", action="store_true",
                        help="the source serves HTTPS (--tls-cert): read it over TLS, its certificate verified and "
                             "its host name checked")
    create.add_argument("--source-ca", type=Path, default=None, metavar="FILE",
                        help="with --source-tls: PEM CA certificates trusted for the source, and only they (kept in "
                             "the link, at most 64 KiB; default: the sink nodes' system trust store, "
                             "$SSL_CERT_FILE/$SSL_CERT_DIR)")
    create.add_argument("--on-source-truncated", choices=("stop", "resync"), default=None,
                        help=ON_SOURCE_TRUNCATED_HELP)
    create.add_argument("--filter", action="append", default=None, metavar="key-prefix=P|header=NAME[=VALUE]",
                        help="copy only the records whose key starts with P, or that carry header NAME (with that "
                             "VALUE); repeatable: any clause matching copies a record; the others become gaps in the "
                             "mirror, whose offsets stay the source's (needs feature level 3; fixed with the link)")
    client_command(create, mirror_create)
    alter = mirrors.add_parser("alter", help="change a link's --on-source-truncated (the rest is set at creation)")
    alter.add_argument("name")
    alter.add_argument("--on-source-truncated", choices=("stop", "resync"), required=True,
                       help=ON_SOURCE_TRUNCATED_HELP)
    client_command(alter, mirror_alter)
    client_command(mirrors.add_parser("list", help="links: sources, pattern, state"), mirror_list)
    for action, func, text in (("status", mirror_status, "per mirror partition: state, position, lag, bytes"),
                               ("pause", mirror_pause, "stop copying (positions stay)"),
                               ("resume", mirror_resume, "copy again"),
                               ("delete", mirror_delete, "delete a link (its mirrors promoted or deleted first)")):
        parser = mirrors.add_parser(action, help=text)
        parser.add_argument("name")
        client_command(parser, func)
    promote = mirrors.add_parser("promote", help="make a mirror topic writable (its copying stops)")
    promote.add_argument("name")
    promote.add_argument("--topic", required=True)
    client_command(promote, mirror_promote)
    verify = mirrors.add_parser("verify", help="the full sync: compare each mirror partition with the source "
                                                "(tictac trees, root first); resync the different ones")
    verify.add_argument("name")
    verify.add_argument("--topic", default=None)
    verify.add_argument("--no-repair", dest="repair", action="store_false",
                        help="report only: no resync of a different partition")
    verify.add_argument("--deep", action="store_true",
                        help="the sink and the source read every segment (finds rot); without it closed "
                             "segments count by their tree sidecars")
    client_command(verify, mirror_verify)


def _link_row(link: dict[str, Any]) -> list[Any]:
    return [link["name"], link.get("scheme", "http"), ",".join(link["sources"]), link["topics"], link["priority"],
            link["state"], "yes" if link["credentials"] else "no", _ca_cell(link),
            link.get("on_source_truncated", "stop"), _filter_cell(link.get("record_filter")),
            len(link.get("mirror_topics", []))]


def _filter_cell(record_filter: list[dict[str, str]] | None) -> str:
    """The FILTER column: `-` (all records), else the clauses as --filter takes them."""
    if not record_filter:
        return "-"
    return " ".join(f"key-prefix={c['key_prefix']}" if "key_prefix" in c else
                    f"header={c['header']}" + (f"={c['value']}" if "value" in c else "") for c in record_filter)


def parse_filters(clauses: list[str] | None) -> list[dict[str, str]] | None:
    """--filter key-prefix=P | header=NAME[=VALUE], repeated, as the API's record_filter (None: none given)."""
    if not clauses:
        return None
    parsed: list[dict[str, str]] = []
    for clause in clauses:
        kind, equals, rest = clause.partition("=")
        if kind == "key-prefix" and equals:
            parsed.append({"key_prefix": rest})
        elif kind == "header" and equals:
            name, has_value, value = rest.partition("=")
            parsed.append({"header": name, **({"value": value} if has_value else {})})
        else:
            raise ValueError(f"--filter {clause!r}: key-prefix=PREFIX or header=NAME[=VALUE]")
    return parsed


def _ca_cell(link: dict[str, Any]) -> str:
    """The CA column: `-` for plain HTTP, `system` for the trust store, else the count of
    certificates and the first one's fingerprint, cut (never the bundle)."""
    if link.get("scheme", "http") != "https":
        return "-"
    ca = link.get("source_ca")
    if not ca:
        return "system"
    first = (ca.get("fingerprints_sha256") or ["?"])[0]
    return f"{ca['certificates']} cert(s), sha256 {first[:23]}.."


_LINK_HEADER = ["LINK", "SCHEME", "SOURCES", "TOPICS", "PRIORITY", "STATE", "TOKEN", "CA", "ON TRUNCATED",
                "FILTER", "MIRRORS"]
SOURCE_CA_BYTES_MAX = 64 * 1024  # the sink refuses more (multiraft/metadata/pem_bundle.py); read no further


def _read_source_ca(path: Path) -> str:
    """The PEM text of --source-ca (the sink checks it: shape, then its OpenSSL)."""
    try:
        with path.open("rb") as file:
            data = file.read(SOURCE_CA_BYTES_MAX + 1)
    except OSError as error:
        raise ValueError(f"--source-ca: cannot read {path}: {error.strerror}") from None
    if len(data) > SOURCE_CA_BYTES_MAX:
        raise ValueError(f"--source-ca: {path} is larger than {SOURCE_CA_BYTES_MAX} bytes")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"--source-ca: {path} is not PEM text (a DER file? openssl x509 -inform der "
                         "-in FILE -out FILE.pem)") from None


def mirror_create(client: Client, args: argparse.Namespace) -> int:
    from multiraft.client.credentials import read_token_file

    if args.source_ca is not None and not args.source_tls:
        raise ValueError("--source-ca is for a source that serves HTTPS: add --source-tls")
    source_ca = _read_source_ca(args.source_ca) if args.source_ca is not None else None
    token = read_token_file(args.source_token_file, "source_token_file") if args.source_token_file else None
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    link = client.create_mirror(args.name, sources, args.topics, args.priority, token, args.verify_interval_s,
                                args.source_tls, source_ca, args.on_source_truncated,
                                record_filter=parse_filters(args.filter))
    print(_table([_link_row(link)], _LINK_HEADER))
    return EXIT_OK


def mirror_alter(client: Client, args: argparse.Namespace) -> int:
    print(_table([_link_row(client.alter_mirror(args.name, args.on_source_truncated))], _LINK_HEADER))
    return EXIT_OK


def mirror_list(client: Client, args: argparse.Namespace) -> int:
    print(_table([_link_row(link) for link in client.list_mirrors()], _LINK_HEADER))
    return EXIT_OK


def mirror_status(client: Client, args: argparse.Namespace) -> int:
    """Exit 1 unless every mirror partition is running (or the link is paused)."""
    status = client.mirror_status(args.name)
    print(_table([_link_row(status)], _LINK_HEADER))
    discovery = status.get("discovery") or {}
    if discovery.get("last_error") or discovery.get("conflicts"):
        print(f"discovery: {discovery.get('last_error') or ''} conflicts: {', '.join(discovery['conflicts'])}")
    rows, healthy = [], True
    for topic in status["topics"]:
        for p in topic["partitions"]:
            state = "promoted" if topic["promoted"] else p["state"]
            healthy &= state in ("running", "paused", "promoted")
            window = p.get("in_flight")  # absent for a partition whose pull did not answer
            chunks = f"{window['chunks']}/{window['chunks_max']}" if window else None
            window_bytes = f"{window['bytes']}/{window['bytes_max']}" if window else None
            rows.append([topic["topic"], p["partition"], state, p.get("position"), p.get("lag_records"),
                         p.get("bytes_copied"), chunks, window_bytes, p.get("node"), p.get("truncated_resyncs"),
                         p.get("last_error") if state != "running" else None])
    print(_table(rows, ["TOPIC", "PARTITION", "STATE", "POSITION", "LAG", "BYTES", "IN FLIGHT", "IN FLIGHT BYTES",
                        "NODE", "TRUNCATED RESYNCS", "LAST ERROR"]))
    return EXIT_OK if healthy else EXIT_FAILED


def mirror_pause(client: Client, args: argparse.Namespace) -> int:
    print(_table([_link_row(client.mirror_action(args.name, "pause"))], _LINK_HEADER))
    return EXIT_OK


def mirror_resume(client: Client, args: argparse.Namespace) -> int:
    print(_table([_link_row(client.mirror_action(args.name, "resume"))], _LINK_HEADER))
    return EXIT_OK


def mirror_delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_mirror(args.name)
    print(f"deleted mirror link {args.name}")
    return EXIT_OK


def mirror_promote(client: Client, args: argparse.Namespace) -> int:
    client.mirror_action(args.name, "promote", args.topic)
    print(f"promoted {args.topic}: it takes producers once each partition's leader applied the promotion "
          "(MIRROR_READ_ONLY until then, a moment)")
    return EXIT_OK


def mirror_verify(client: Client, args: argparse.Namespace) -> int:
    """Every mirror partition of the link (or of --topic) against the source, call after call
    until done; exits 1 unless every one is identical (behind counts: it was not compared whole)."""
    rows, start, clean = [], 0, True
    while start is not None:
        body: dict[str, Any] = {"start": start, "repair": args.repair, **({"topic": args.topic} if args.topic else {}),
                                **({"deep": True} if args.deep else {})}  # absent: a node of an earlier version
        answer = client.mirror_action(args.name, "verify", body=body)
        for p in answer["partitions"]:
            clean = clean and p["status"] == "identical"
            ranges = " ".join(f"[{lo},{hi})" for lo, hi in p["ranges"]) or "-"
            rows.append([p["topic"], p["partition"], p["status"], p["leader"], f"[{p['lo']},{p['hi']})",
                         p["source_high_watermark"], p["nodes_compared"], ranges,
                         (p["repair"] or "-") + (f", kept below {p['kept_below']}" if p.get("kept_below") else "")])
        start = answer["next_start"]
    print(_table(rows, ["TOPIC", "PARTITION", "STATUS", "LEADER", "COMPARED", "SOURCE HW", "NODES", "RANGES",
                        "REPAIR"]))
    return EXIT_OK if clean else EXIT_FAILED
