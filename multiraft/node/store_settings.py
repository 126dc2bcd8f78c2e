"""The store settings a topic's config decides (Kafka's names, spelled with underscores)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage.config import FlushPolicy

__all__ = ["retention_settings"]


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
