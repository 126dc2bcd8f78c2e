"""Compact, stable text for entries, messages and Readies.

One line per message and per entry, fields in a fixed order, and only the fields
a message type uses: a script's output is read by people, so every character
should carry meaning. Entries print as `term/index KIND payload`, as etcd does.
"""

from __future__ import annotations

from raftlog.core.ready import Ready
from raftlog.messages import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    ReadState,
    Snapshot,
    SoftState,
    decode_conf_change,
)

MT = MessageType


def ids(nodes: frozenset[int] | set[int]) -> str:
    return "(" + ",".join(str(node) for node in sorted(nodes)) + ")"


def membership(value: Membership) -> str:
    text = f"voters={ids(value.voters)}"
    if value.learners:
        text += f" learners={ids(value.learners)}"
    return text


def entry(value: Entry) -> str:
    head = f"{value.term}/{value.index} {value.kind.name}"
    if value.kind is EntryKind.CONFIG:
        change = decode_conf_change(value.payload)
        return f"{head} {change.op.name.lower()} {change.node_id}"
    if value.kind is EntryKind.NOOP:
        return head
    return f"{head} {_quote(value.payload)}"


def entries_inline(values: tuple[Entry, ...] | list[Entry]) -> str:
    return "[" + ", ".join(entry(value) for value in values) + "]"


def snapshot(value: Snapshot) -> str:
    meta = value.meta
    return f"index={meta.index} term={meta.term} {membership(meta.membership)}"


def message(value: Message) -> str:
    kind = value.type
    parts = [f"{value.source}->{value.target} {kind.name} term={value.term}"]
    if kind is MT.APPEND:
        parts.append(f"log_term={value.log_term} index={value.index} commit={value.commit}")
        if value.entries:
            parts.append(f"entries={entries_inline(value.entries)}")
    elif kind is MT.APPEND_RESPONSE:
        parts.append(f"index={value.index}")
        if value.reject:
            parts.append(f"reject hint={value.reject_hint} hint_term={value.log_term}")
    elif kind in (MT.VOTE, MT.PRE_VOTE):
        parts.append(f"log_term={value.log_term} index={value.index}")
        if value.transfer:
            parts.append("transfer")
    elif kind in (MT.VOTE_RESPONSE, MT.PRE_VOTE_RESPONSE):
        if value.reject:
            parts.append("reject")
    elif kind is MT.HEARTBEAT:
        parts.append(f"commit={value.commit}")
    elif kind is MT.SNAPSHOT:
        assert value.snapshot is not None
        parts.append(f"snapshot=[{snapshot(value.snapshot)}]")
    elif kind is MT.READ_INDEX_RESPONSE:
        parts.append(f"index={value.index}")
    if value.context:
        parts.append(f"ctx={_quote(value.context)}")
    return " ".join(parts)


def hard_state(value: HardState) -> str:
    return f"term={value.term} vote={value.vote} commit={value.commit}"


def soft_state(value: SoftState) -> str:
    return f"role={value.role.value} leader={value.leader}"


def read_state(value: ReadState) -> str:
    return f"index={value.index} ctx={_quote(value.context)}"


def ready(value: Ready) -> list[str]:
    """A Ready as indented lines; empty sections are left out."""
    lines = [f"Ready must_sync={str(value.must_sync).lower()}:"]
    if value.soft_state is not None:
        lines.append(f"  soft_state: {soft_state(value.soft_state)}")
    if value.hard_state is not None:
        lines.append(f"  hard_state: {hard_state(value.hard_state)}")
    if value.snapshot is not None:
        lines.append(f"  snapshot: {snapshot(value.snapshot)}")
    sections: list[tuple[str, list[str]]] = [
        ("entries", [entry(e) for e in value.entries]),
        ("messages", [message(m) for m in value.messages]),
        ("persisted_messages", [message(m) for m in value.persisted_messages]),
        ("committed_entries", [entry(e) for e in value.committed_entries]),
        ("read_states", [read_state(r) for r in value.read_states]),
    ]
    for title, body in sections:
        if body:
            lines.append(f"  {title}:")
            lines.extend("    " + line for line in body)
    return lines


def _quote(payload: bytes) -> str:
    return '"' + payload.decode("utf-8", "backslashreplace") + '"'
