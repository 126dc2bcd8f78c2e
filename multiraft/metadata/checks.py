"""Shape checks shared by the metadata commands (multiraft/metadata/commands.py and
multiraft/metadata/mirror_commands.py): bounds, names, topic configs, node statuses.

Split from commands.py so that the mirror commands can use the same checks without
an import cycle (commands.py lists every command type, mirror ones included).
"""

from __future__ import annotations

import enum
import re

from multiraft.errors import InvalidConfig, InvalidRequest, InvalidTopic
from multiraft.metadata.patterns import TOPIC_NAME_PATTERN

# Kafka refuses more than this many partitions per request only by default quotas;
# 10,000 keeps one CreateTopic entry (and its apply) bounded.
PARTITIONS_MAX = 10_000
REPLICATION_FACTOR_MAX = 7  # beyond 7 copies a Raft group pays more than it gains
CONFIG_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_.]{0,99}")
CONFIG_ENTRIES_MAX = 100
CONFIG_STRING_CHARS_MAX = 1024
ADDRESS_CHARS_MAX = 255
RACK_CHARS_MAX = 255
# Kafka hands out producer ids in blocks of 1,000 per broker.
PRODUCER_ID_BLOCK_MAX = 10_000

ConfigValue = str | int | float | bool


class NodeStatus(enum.StrEnum):
    ALIVE = "alive"
    FENCED = "fenced"  # reserved: the controller sets only ALIVE and DEAD so far
    DEAD = "dead"  # silent past node_dead_after_ms: placed on no more, leads no balancing moves


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_node_id(node_id: object) -> None:
    if not is_int(node_id) or node_id < 1:
        raise InvalidRequest(f"node id {node_id!r} is not a positive integer")


def check_text(value: object, what: str, chars_max: int) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= chars_max:
        raise InvalidRequest(f"{what} must be 1..{chars_max} characters")


def check_topic_name(name: object) -> None:
    if not isinstance(name, str) or not TOPIC_NAME_PATTERN.fullmatch(name):
        raise InvalidTopic(f"topic name {name!r} must match {TOPIC_NAME_PATTERN.pattern}")
    if name in (".", ".."):
        raise InvalidTopic(f"topic name {name!r} is reserved")


def altered_config(config: dict[str, ConfigValue], changes: dict[str, ConfigValue | None]) -> dict[str, ConfigValue]:
    """`config` with `changes` made: each key set to its value, or removed when it is None."""
    altered = dict(config)
    for key, value in changes.items():
        if value is None:
            altered.pop(key, None)
        else:
            altered[key] = value
    return altered


def check_config(config: object) -> None:
    if not isinstance(config, dict) or len(config) > CONFIG_ENTRIES_MAX:
        raise InvalidConfig(f"config is an object of at most {CONFIG_ENTRIES_MAX} entries")
    for key, value in config.items():
        check_config_entry(key, value)


def check_config_entry(key: object, value: object) -> None:
    if not isinstance(key, str) or not CONFIG_KEY_PATTERN.fullmatch(key):
        raise InvalidConfig(f"config key {key!r} must match {CONFIG_KEY_PATTERN.pattern}")
    if not isinstance(value, str | int | float | bool):
        raise InvalidConfig(f"config value of {key} must be a string, number or boolean")
    if isinstance(value, str) and len(value) > CONFIG_STRING_CHARS_MAX:
        raise InvalidConfig(f"config value of {key} exceeds {CONFIG_STRING_CHARS_MAX} characters")
    if key == "flush":
        _check_flush(value)
    bounds = TYPED_CONFIG.get(key)
    if bounds is not None:
        low, high, unlimited = bounds
        if not isinstance(value, int) or isinstance(value, bool) or not (
            low <= value <= high or (unlimited and value == -1)
        ):
            extra = " (or -1 for unlimited)" if unlimited else ""
            raise InvalidConfig(f"config {key} must be an integer in [{low}, {high}]{extra}")


def _check_flush(value: object) -> None:
    """A topic's flush policy, spelled as the node's --flush (DESIGN.md section 4)."""
    from storage.config import FlushPolicy

    try:
        FlushPolicy.parse(value)  # type: ignore[arg-type]
    except (ValueError, AssertionError, AttributeError, TypeError):
        raise InvalidConfig(f"config flush must be fsync, none or interval_ms=N (N > 0), got {value!r}") from None


# Topic settings the node acts on: key -> (low, high, -1 allowed for "unlimited").
# Also `flush` (fsync, none or interval_ms=N), checked by `_check_flush`.
TYPED_CONFIG: dict[str, tuple[int, int, bool]] = {
    "min_insync_replicas": (1, 5, False),
    "segment_bytes": (4096, 1 << 30, False),
    "segment_ms": (1, 2**62, False),
    "retention_ms": (1, 2**62, True),
    "retention_bytes": (1, 2**62, True),
}


# What a client may set: Kafka refuses a config it does not know, so a typo never
# passes silently. Enforced where requests enter (HTTP), not when commands are
# applied, so a catalog written before this rule still replays.
TOPIC_CONFIG_KEYS = frozenset(TYPED_CONFIG) | {"flush"}


def check_known_config(config: dict[str, object]) -> None:
    """Refuse a key no topic setting has; removing one (value None) is always allowed."""
    for key, value in config.items():
        if value is not None and key not in TOPIC_CONFIG_KEYS:
            raise InvalidConfig(f"unknown config key {key!r}; known: {', '.join(sorted(TOPIC_CONFIG_KEYS))}")
