"""`raftlog consume TOPIC --group G` as a group member, and `raftlog group ...`.

A consumer started with `--group` (and no `--partition`) is a member of the group:
the cluster splits the topic's partitions among the members, so N of them in N
terminals share the work and take over from one another (one that stops with Ctrl-C
leaves at once; one that is killed, after the group's session timeout). It commits
what it printed after each batch, and what it read when partitions move or it
leaves, so the next owner starts where it stopped. Partitions it gets and gives back
are reported on stderr.

`raftlog group list|describe|delete|reset-offsets` are Kafka's `kafka-consumer-groups.sh
--list|--describe|--delete|--reset-offsets`; a reset is a dry run unless `--execute`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from multiraft.cli.interrupt import StopOnInterrupt
from multiraft.client import Client

EXIT_OK = 0
EXIT_USAGE = 2
TopicPartition = tuple[str, int]


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _partitions_text(partitions: set[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}/{','.join(map(str, ps))}" for t, ps in by_topic.items())


def _note(what: str) -> Any:
    def report(partitions: set[TopicPartition]) -> None:
        print(f"{what}: {_partitions_text(partitions)}", file=sys.stderr, flush=True)

    return report


def _print(record: Any, show_offsets: bool) -> None:
    value = (record.value or b"").decode("utf-8", "replace")
    if show_offsets:
        key = (record.key or b"").decode("utf-8", "replace")
        print(f"{record.partition}\t{record.offset}\t{key}\t{value}")
    else:
        print(value)


def consume_as_member(client: Client, args: argparse.Namespace) -> int:
    """Poll as a member until --max-records, Ctrl-C, or (without --follow) a poll that
    finds nothing while the member is settled; then leave the group."""
    if args.offset is not None:
        raise ValueError("--offset with --group needs --partition: a member starts at the group's committed "
                         "offsets (move them with 'raftlog group reset-offsets')")
    member = client.group_consumer(args.group, topics=[args.topic], wait_ms=args.wait_ms if args.follow else
                                   min(args.wait_ms, 1000), auto_offset_reset="earliest" if args.from_beginning
                                   else "latest", session_timeout_ms=args.session_timeout_ms,
                                   on_assigned=_note("assigned"), on_revoked=_note("revoked"), on_lost=_note("lost"))
    printed = 0
    with StopOnInterrupt(member.wakeup) as interrupt:
        while (args.max_records is None or printed < args.max_records) and not interrupt.requested:
            records = member.poll()  # Ctrl-C ends its long poll early, without moving a position
            if not records and not args.follow and member.aio.view.get("state") == "stable":
                break
            if args.max_records is not None and printed + len(records) > args.max_records:
                records, rest = records[: args.max_records - printed], records[args.max_records - printed :]
                for record in reversed(rest):  # give back what is not printed, so the group does not skip it
                    member.seek(record.topic, record.partition, record.offset)
            for record in records:  # printed even after a Ctrl-C: their positions have moved
                _print(record, args.show_offsets)
                printed += 1
            sys.stdout.flush()
            if records:
                member.commit()
        member.close()  # commits what it read, and leaves: the others take its partitions at once
    return EXIT_OK


def group_list(client: Client, args: argparse.Namespace) -> int:
    rows = [[g["group"], g["state"], g["members"], g["group_epoch"], g["assignor"],
             ",".join(g["topics"] + g["topic_patterns"])] for g in client.list_groups()]
    print(_table(rows, ["GROUP", "STATE", "MEMBERS", "EPOCH", "ASSIGNOR", "SUBSCRIBED"]) if rows
          else "no consumer groups with members")
    return EXIT_OK


def group_describe(client: Client, args: argparse.Namespace) -> int:
    group = client.describe_group(args.group, args.topic)
    if not group["members"]:
        print(f"group {group['group']}  state {group['state']}: no active members")
    else:
        print(f"group {group['group']}  state {group['state']}  epoch {group['group_epoch']}  "
              f"assignor {group['assignor']}  session timeout {group['session_timeout_ms']} ms  "
              f"members {len(group['members'])}")
    owners = {}
    rows = []
    for number, member in enumerate(group["members"], 1):
        name = member["member_id"] or f"member-{number}"  # ids are shown to admin only
        for item in member["assignment"] + member["revoking"]:
            for partition in item["partitions"]:
                owners[(item["topic"], partition)] = name
        seen = member.get("last_seen_ms_ago")
        rows.append([name, member["member_epoch"], member["state"],
                     _partitions_text({(a["topic"], p) for a in member["assignment"] for p in a["partitions"]}),
                     _partitions_text({(a["topic"], p) for a in member["revoking"] for p in a["partitions"]}) or None,
                     None if seen is None else f"{seen / 1000:.1f}s"])
    if rows:
        print(_table(rows, ["MEMBER", "EPOCH", "STATE", "ASSIGNED", "REVOKING", "LAST-SEEN"]))
    print()
    rows = [[p["topic"], p["partition"], owners.get((p["topic"], p["partition"])), p["committed_offset"],
             p["high_watermark"], p["lag"], None if p["lag_ms"] is None else f"{p['lag_ms'] / 1000:.1f}"]
            for p in group["partitions"]]
    print(_table(rows, ["TOPIC", "PARTITION", "OWNER", "COMMITTED", "LOG-END", "LAG", "LAG-SECONDS"]))
    if group.get("partitions_truncated"):
        print(f"(the first {len(group['partitions'])} of {group['partitions_total']} partitions)", file=sys.stderr)
    return EXIT_OK


def group_delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_group(args.group)
    print(f"deleted consumer group {args.group}")
    return EXIT_OK


def _topics(values: list[str]) -> list[dict[str, Any]]:
    """--topic T or --topic T:0,2 (Kafka's form) -> the reset's topics."""
    chosen: dict[str, dict[str, Any]] = {}
    for value in values:
        topic, _, listed = value.partition(":")
        entry: dict[str, Any] = {"topic": topic}
        if listed:
            try:
                entry["partitions"] = sorted({int(p) for p in listed.split(",")})
            except ValueError:
                raise ValueError(f"--topic {value!r}: partitions are numbers, as TOPIC:0,1,2") from None
        chosen[topic] = entry
    return list(chosen.values())


def _when_ms(text: str) -> int:
    """An ISO 8601 time (Kafka's 'YYYY-MM-DDTHH:mm:SS.sss'; local time without a zone, as
    Kafka's tool reads it) or @MS, Unix milliseconds."""
    if text.startswith("@"):
        try:
            return int(text[1:])
        except ValueError:
            raise ValueError(f"--to-datetime {text!r}: @ takes Unix milliseconds") from None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"--to-datetime {text!r}: an ISO 8601 time such as 2026-01-31T12:00:00Z, "
                         "or @MS") from None


def group_reset_offsets(client: Client, args: argparse.Namespace) -> int:
    if args.to_earliest:
        strategy, value = "earliest", None
    elif args.to_latest:
        strategy, value = "latest", None
    elif args.to_offset is not None:
        strategy, value = "offset", args.to_offset
    elif args.shift_by is not None:
        strategy, value = "shift", args.shift_by
    else:
        strategy, value = "timestamp", _when_ms(args.to_datetime)
    plan = client.reset_offsets(args.group, strategy, _topics(args.topic), value=value, execute=args.execute)
    rows = [[r["topic"], r["partition"], r["committed_offset"], r["new_offset"], r["log_start_offset"],
             r["high_watermark"]] for r in plan["offsets"]]
    print(_table(rows, ["TOPIC", "PARTITION", "CURRENT", "NEW", "LOG-START", "LOG-END"]))
    if not plan["executed"]:
        print("dry run: nothing changed (add --execute to apply)", file=sys.stderr)
    return EXIT_OK


def add_group_parsers(commands_parser: Any, client_command: Any) -> None:
    group = commands_parser.add_parser("group", help="consumer groups: list, describe (with lag), delete, "
                                                     "reset-offsets")
    groups = group.add_subparsers(dest="group_command", required=True,
                                  metavar="{list,describe,delete,reset-offsets}")
    client_command(groups.add_parser("list", help="groups with members"), group_list)
    describe = groups.add_parser("describe", help="members, assignment, committed offsets and lag")
    describe.add_argument("group")
    describe.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                          help="also this topic's offsets and lag; describes a group without members too "
                               "(repeatable)")
    client_command(describe, group_describe)
    delete = groups.add_parser("delete", help="delete a group without members: its committed offsets (admin)")
    delete.add_argument("group")
    client_command(delete, group_delete)
    reset = groups.add_parser("reset-offsets", help="move a group's committed offsets, as Kafka's tool; the "
                                                    "group must have no members (admin)")
    reset.add_argument("group")
    reset.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,P]",
                       help="a topic, or some of its partitions (repeatable)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start")
    to.add_argument("--to-latest", action="store_true", help="the log end: skip everything not read")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped to the log)")
    to.add_argument("--to-datetime", metavar="TIME", help="the first record at or after TIME (ISO 8601, or @MS)")
    to.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)")
    run = reset.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="show the plan only (the default)")
    run.add_argument("--execute", action="store_true", help="apply the plan")
    client_command(reset, group_reset_offsets)
