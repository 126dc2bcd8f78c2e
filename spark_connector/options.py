"""Option parsing for `format("raftlog")`: strings in, validated values out (pure).

The names and value shapes are those of Spark's Kafka source, so a Kafka job
moves over by changing the format and `kafka.bootstrap.servers` to `servers`
(which is also accepted). Spark passes every option as a string and matches
names case-insensitively; so do we. An unknown option is an error, not ignored:
a misspelt `startingOffset` must not quietly export the whole topic.

Offsets in JSON follow Kafka: `{"topic": {"0": 23, "1": -2}}` where -2 means
earliest and -1 latest. A batch read may not start at latest (it would read
nothing) nor end at earliest; Kafka refuses both too.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_connector.errors import OptionError

EARLIEST = -2
LATEST = -1
TopicPartition = tuple[str, int]

FETCH_MAX_BYTES_DEFAULT = 8 * 1024 * 1024  # per request; the server allows up to 64 MiB
FETCH_MAX_BYTES_LIMIT = 64 * 1024 * 1024  # the server's MAX_BYTES_MAX (partition_ops.py)
POLL_TIMEOUT_MS_DEFAULT = 120_000  # Kafka's kafkaConsumer.pollTimeoutMs default
WRITE_BATCH_RECORDS_DEFAULT = 1000
ISOLATIONS = {"committed": "committed", "read_committed": "committed",
              "uncommitted": "uncommitted", "read_uncommitted": "uncommitted"}
ACKS = ("none", "leader", "quorum", "all")
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")

READ_OPTIONS = (
    "servers", "topic", "subscribe", "assign", "subscribePattern", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "minPartitions", "maxRecordsPerPartition", "includeHeaders",
    "failOnDataLoss", "isolation", "fetchMaxBytes", "pollTimeoutMs",
)
WRITE_OPTIONS = ("servers", "topic", "acks", "batchRecords")
# Kafka's spellings, accepted so that a Kafka job only changes its format.
ALIASES = {"kafka.bootstrap.servers": "servers", "kafka.isolation.level": "isolation",
           "kafkaconsumer.polltimeoutms": "pollTimeoutMs"}


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of the range to read, per partition, before it meets the cluster's offsets.

    Exactly one shape is used: `default` for partitions not listed in `offsets`;
    or one `timestamp_ms` for all; or `timestamps_ms` per partition.
    """

    option: str  # where it came from, for error messages
    default: int = EARLIEST
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp_ms: int | None = None
    timestamps_ms: Mapping[TopicPartition, int] = field(default_factory=dict)

    @property
    def by_timestamp(self) -> bool:
        return self.timestamp_ms is not None or bool(self.timestamps_ms)

    def named_partitions(self) -> set[TopicPartition]:
        return set(self.offsets) | set(self.timestamps_ms)


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: listed topics, an explicit assignment, or a topic pattern."""

    option: str
    topics: tuple[str, ...] = ()
    assignment: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    servers: tuple[str, ...]
    subscription: Subscription
    starting: Bound
    ending: Bound
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    isolation: str = "committed"
    fetch_max_bytes: int = FETCH_MAX_BYTES_DEFAULT
    poll_timeout_ms: int = POLL_TIMEOUT_MS_DEFAULT


@dataclass(frozen=True, slots=True)
class WriteOptions:
    servers: tuple[str, ...]
    topic: str | None  # None: every row names its topic in a `topic` column
    acks: str = "quorum"
    batch_records: int = WRITE_BATCH_RECORDS_DEFAULT


def canonical(options: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, str]:
    """Options under their canonical names; an unknown name is an error with a suggestion."""
    by_lower = {name.lower(): name for name in known}
    by_lower |= {alias: name for alias, name in ALIASES.items() if name in known}
    out: dict[str, str] = {}
    for raw_name, value in options.items():
        name = by_lower.get(raw_name.lower())
        if name is None:
            if raw_name.lower() == "path":
                raise OptionError("path", "raftlog takes no path: use .option('topic', ...) and .load() "
                                          "or .save() without an argument")
            close = difflib.get_close_matches(raw_name, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known options: {', '.join(known)}"
            raise OptionError(raw_name, f"unknown option{hint}")
        if name in out:
            raise OptionError(name, "given twice (under two spellings)")
        out[name] = "" if value is None else str(value)
    return out


def _servers(options: dict[str, str]) -> tuple[str, ...]:
    listed = tuple(s.strip() for s in options.get("servers", "").split(",") if s.strip())
    if not listed:
        raise OptionError("servers", "required: the HTTP address(es) of the cluster, comma-separated, "
                                     "e.g. 127.0.0.1:8080,127.0.0.2:8080")
    for server in listed:
        host, sep, port = server.rpartition(":") if "://" not in server else ("x", ":", "1")
        if not sep or not host or not port.isdigit():
            raise OptionError("servers", f"{server!r} is not host:port")
    return listed


def parse_bool(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(name, f"expected true or false, got {value!r}")
    return lowered == "true"


def parse_int(options: dict[str, str], name: str, *, low: int, high: int = 2**63 - 1) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(name, f"expected an integer, got {value!r}") from None
    if not low <= number <= high:
        raise OptionError(name, f"{number} is out of range [{low}, {high}]")
    return number


def _json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as error:
        raise OptionError(name, f"is neither a keyword nor valid JSON ({error}): {value!r}") from None


def _topic_name(name: str, topic: Any) -> str:
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise OptionError(name, f"{topic!r} is not a valid topic name")
    return topic


def _per_partition(name: str, value: str, *, low: int, what: str) -> dict[TopicPartition, int]:
    """`{"topic": {"0": n, ...}}` -> {(topic, 0): n}."""
    decoded = _json(name, value)
    if not isinstance(decoded, dict) or not decoded:
        raise OptionError(name, f'expected JSON like {{"topic": {{"0": {what}}}}}, got {value!r}')
    out: dict[TopicPartition, int] = {}
    for topic, partitions in decoded.items():
        _topic_name(name, topic)
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(name, f'topic {topic!r} needs an object of partitions, like {{"0": {what}}}')
        for partition, number in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(name, f"{partition!r} of topic {topic!r} is not a partition number")
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                raise OptionError(name, f"{topic}/{partition}: {number!r} is not an integer >= {low}")
            out[(topic, int(partition))] = number
    return out


def parse_subscription(options: dict[str, str]) -> Subscription:
    given = [n for n in ("topic", "subscribe", "assign", "subscribePattern") if options.get(n, "").strip()]
    if len(given) != 1:
        problem = "one is required" if not given else f"only one may be given, got {', '.join(given)}"
        raise OptionError("topic", f"{problem} of topic/subscribe (comma-separated topics), "
                                   'assign (JSON like {"t":[0,1]}) or subscribePattern (a regex)')
    name = given[0]
    value = options[name].strip()
    if name in ("topic", "subscribe"):
        topics = tuple(_topic_name(name, t.strip()) for t in value.split(",") if t.strip())
        return Subscription(name, topics=tuple(dict.fromkeys(topics)))
    if name == "subscribePattern":
        try:
            re.compile(value)
        except re.error as error:
            raise OptionError(name, f"{value!r} is not a valid regular expression ({error})") from None
        return Subscription(name, pattern=value)
    decoded = _json(name, value)
    if not isinstance(decoded, dict) or not decoded:
        raise OptionError(name, f'expected JSON like {{"topic": [0, 1]}}, got {value!r}')
    assignment: dict[str, tuple[int, ...]] = {}
    for topic, partitions in decoded.items():
        _topic_name(name, topic)
        if not isinstance(partitions, list) or not partitions or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions):
            raise OptionError(name, f"topic {topic!r} needs a non-empty list of partition numbers")
        assignment[topic] = tuple(sorted(set(partitions)))
    return Subscription(name, assignment=assignment)


def parse_bound(options: dict[str, str], side: str) -> Bound:
    """`side` is "starting" or "ending": its offsets, timestamp or per-partition timestamps."""
    offsets_name = f"{side}Offsets"
    names = [offsets_name, f"{side}Timestamp", f"{side}OffsetsByTimestamp"]
    given = [n for n in names if options.get(n, "").strip()]
    if len(given) > 1:
        raise OptionError(given[1], f"cannot be combined with {given[0]}: give one of {', '.join(names)}")
    forbidden, forbidden_word = (LATEST, "latest") if side == "starting" else (EARLIEST, "earliest")
    default = EARLIEST if side == "starting" else LATEST
    if not given:
        return Bound(offsets_name, default)
    name = given[0]
    value = options[name].strip()
    if name.endswith("ByTimestamp"):
        return Bound(name, default, timestamps_ms=_per_partition(name, value, low=0, what="1700000000000"))
    if name.endswith("Timestamp"):
        return Bound(name, default, timestamp_ms=parse_int(options, name, low=0))
    if value.lower() in ("earliest", "latest"):
        if value.lower() == forbidden_word:
            raise OptionError(name, f"'{forbidden_word}' is not allowed for a batch read "
                                    f"(as in Spark's Kafka source): it would read nothing")
        return Bound(name, EARLIEST if value.lower() == "earliest" else LATEST)
    offsets = _per_partition(name, value, low=-2, what="42")
    for (topic, partition), offset in offsets.items():
        if offset == forbidden:
            raise OptionError(name, f"{topic}/{partition}: {offset} ({forbidden_word}) is not allowed for a "
                                    f"batch read (as in Spark's Kafka source)")
    return Bound(name, default, offsets=offsets)


def parse_read_options(raw: Mapping[str, Any]) -> ReadOptions:
    options = canonical(raw, READ_OPTIONS)
    subscription = parse_subscription(options)
    starting, ending = parse_bound(options, "starting"), parse_bound(options, "ending")
    if subscription.assignment:
        assigned = {(t, p) for t, ps in subscription.assignment.items() for p in ps}
        for bound in (starting, ending):
            extra = sorted(bound.named_partitions() - assigned)
            if extra:
                raise OptionError(bound.option, f"names {extra[0][0]}/{extra[0][1]}, which 'assign' does not")
    strategy = options.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy", f"expected error or latest, got {strategy!r}")
    isolation = options.get("isolation", "committed").strip().lower()
    if isolation not in ISOLATIONS:
        raise OptionError("isolation", f"expected committed or uncommitted (or Kafka's read_committed / "
                                       f"read_uncommitted), got {isolation!r}")
    return ReadOptions(
        servers=_servers(options),
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        min_partitions=parse_int(options, "minPartitions", low=1, high=100_000),
        max_records_per_partition=parse_int(options, "maxRecordsPerPartition", low=1),
        include_headers=parse_bool(options, "includeHeaders", False),
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", True),
        isolation=ISOLATIONS[isolation],
        fetch_max_bytes=parse_int(options, "fetchMaxBytes", low=1024, high=FETCH_MAX_BYTES_LIMIT)
        or FETCH_MAX_BYTES_DEFAULT,
        poll_timeout_ms=parse_int(options, "pollTimeoutMs", low=100, high=3_600_000) or POLL_TIMEOUT_MS_DEFAULT,
    )


def parse_write_options(raw: Mapping[str, Any]) -> WriteOptions:
    options = canonical(raw, WRITE_OPTIONS)
    topic = options.get("topic", "").strip() or None
    if topic is not None:
        _topic_name("topic", topic)
    acks = options.get("acks", "quorum").strip().lower()
    if acks not in ACKS:
        raise OptionError("acks", f"expected one of {', '.join(ACKS)}, got {acks!r}")
    return WriteOptions(
        servers=_servers(options), topic=topic, acks=acks,
        batch_records=parse_int(options, "batchRecords", low=1, high=100_000) or WRITE_BATCH_RECORDS_DEFAULT,
    )
