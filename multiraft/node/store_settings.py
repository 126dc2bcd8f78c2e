"""The store settings a topic's config decides (Kafka's names, spelled with underscores)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from storage.config import FlushPolicy, StoreConfig

if TYPE_CHECKING:
    from multiraft.node.config import NodeConfig
    from storage.segments import SegmentStore

__all__ = ["apply_topic_config", "retention_settings", "topic_store_settings"]


def retention_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """StoreConfig fields from a topic's config (Kafka's segment.bytes, segment.ms,
    retention.ms, retention.bytes, spelled with underscores, and the flush policy);
    absent keys keep the defaults."""
    settings: dict[str, Any] = {}
    if "segment_bytes" in config:
        settings["segment_bytes_max"] = int(config["segment_bytes"])
    if "segment_ms" in config:
        settings["segment_ms_max"] = int(config["segment_ms"])
    if "flush" in config:
        settings["flush"] = FlushPolicy.parse(str(config["flush"]))
    for key in ("retention_ms", "retention_bytes"):
        if key in config:
            value = int(config[key])
            settings[key] = None if value < 0 else value  # -1: unlimited, as in Kafka
    return settings


def topic_store_settings(node: NodeConfig, topic_config: Mapping[str, Any]) -> dict[str, Any]:
    """The StoreConfig fields a topic's config decides, with the defaults (the node's, else
    StoreConfig's) for keys it does not set (so removing a key restores the default)."""
    defaults = StoreConfig()
    return {"segment_bytes_max": node.segment_bytes_max, "segment_ms_max": defaults.segment_ms_max,
            "retention_ms": defaults.retention_ms, "retention_bytes": defaults.retention_bytes,
            "flush": node.flush} | retention_settings(topic_config)


def apply_topic_config(store: SegmentStore | None, node: NodeConfig, topic_config: Mapping[str, Any],
                       logger: Any, group_id: int) -> None:
    """A topic's settings changed after its replica opened: the store takes them at once
    (retention at the next compaction round, segment size at the next roll)."""
    if store is None:
        return
    wanted = dataclasses.replace(store.config, **topic_store_settings(node, topic_config))
    if wanted != store.config:
        store.config = wanted
        logger.info("topic_config_applied", group_id=group_id, segment_bytes_max=wanted.segment_bytes_max,
                    segment_ms_max=wanted.segment_ms_max, retention_ms=wanted.retention_ms,
                    retention_bytes=wanted.retention_bytes, flush=wanted.flush.mode.value)
