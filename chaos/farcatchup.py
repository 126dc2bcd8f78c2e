"""`--far-catchup`: runs that drive far-horizon catch-up hard, and count what it did.

Far-horizon catch-up (multiraft/node/catchup_leader.py, catchup_follower.py,
storage/far_install.py) *replaces a follower's log* with the leader's closed segment
files: exactly where acknowledged data could be lost under faults. With the node
defaults (20,000 entries or 32 MiB of closed segments behind) and the runner's topics
(64 MiB segments) a chaos run never takes it. With this option:

- every node gets a TOML file (`raftlog serve --config`) with far thresholds of
  LAG_ENTRIES entries and LAG_BYTES bytes, so a follower back from a kill, a pause or a
  partition of a second or two is "far";
- the chaos topics get `segment_bytes` = SEGMENT_BYTES, so segments close every few
  hundred records and there are closed files to send.

Afterwards the nodes' logs are read for the path's events (`count_events`): the
run's summary says how many installs happened, failed or were refused, and says so
loudly when the path was never taken (a run that claims to test it and did not).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LAG_ENTRIES = 4  # a partition takes a few entries a second from the workload
LAG_BYTES = 4 * 1024  # one closed segment of SEGMENT_BYTES: a follower behind a segment boundary
SEGMENT_BYTES = 4 * 1024  # the topic setting's floor (multiraft/metadata/commands.py)
CONFIG_NAME = "far-catchup.toml"
# Leader side: started (offer accepted), refused (offer not taken), idle (the follower
# stopped asking), abandoned (the core's hold ended first: leadership lost, timed out, a
# probe), done (the follower's word, ok or not). Follower side: installed, failed
# (staging or install raised), not_needed (caught up by appends meanwhile).
EVENTS = ("far_catchup_started", "far_catchup_refused", "far_catchup_idle", "far_catchup_abandoned",
          "far_catchup_done", "far_catchup_installed", "far_catchup_failed", "far_catchup_not_needed")
RECORDED = ("far_catchup_installed", "far_catchup_failed", "far_catchup_idle", "far_catchup_abandoned")
RECORDED_FIELDS = ("node_id", "group_id", "leader", "follower", "upto", "files", "bytes", "stage_s", "install_s",
                   "error", "reason", "timestamp")


def node_config_text(lag_entries: int = LAG_ENTRIES, lag_bytes: int = LAG_BYTES) -> str:
    return f"far_catchup_lag_entries = {lag_entries}\nfar_catchup_lag_bytes = {lag_bytes}\n"


def write_node_config(directory: Path) -> Path:
    """The TOML file every node is started with (`--config`); flags still win over it."""
    path = directory / CONFIG_NAME
    path.write_text(node_config_text())
    return path


def topic_config() -> dict[str, Any]:
    return {"segment_bytes": SEGMENT_BYTES}


def count_events(logs: Iterable[Path]) -> dict[str, Any]:
    """The far-horizon events in the nodes' JSON-lines logs: a count per event (every
    name in EVENTS, zeros included; `far_catchup_done` split by its `ok`), and the
    installs, failures and idle ends one by one."""
    counts: Counter[str] = Counter(dict.fromkeys(EVENTS, 0))
    counts["far_catchup_done_ok"] = counts["far_catchup_done_failed"] = 0
    records: list[dict[str, Any]] = []
    for path in logs:
        with open(path, errors="replace") as lines:
            for line in lines:
                if "far_catchup_" not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                event = entry.get("event") if isinstance(entry, dict) else None
                if event not in EVENTS:
                    continue
                counts[event] += 1
                if event == "far_catchup_done":
                    counts["far_catchup_done_ok" if entry.get("ok") is True else "far_catchup_done_failed"] += 1
                if event in RECORDED:
                    records.append({"event": event} | {k: entry[k] for k in RECORDED_FIELDS if k in entry})
    records.sort(key=lambda record: str(record.get("timestamp", "")))
    return {"counts": dict(counts), "events": records}


def never_taken(far: dict[str, Any]) -> bool:
    return far["counts"]["far_catchup_installed"] == 0


def summary_part(far: dict[str, Any]) -> str:
    """`far catch-up: 7 installed, 1 failed, 2 refused (9 offers taken, 1 not needed, 0 idle,
    0 abandoned)`;
    with no install, in capitals, so a run that never took the path cannot pass unnoticed."""
    counts = far["counts"]
    text = (f"{counts['far_catchup_installed']} installed, {counts['far_catchup_failed']} failed, "
            f"{counts['far_catchup_refused']} refused ({counts['far_catchup_started']} offers taken, "
            f"{counts['far_catchup_not_needed']} not needed, {counts['far_catchup_idle']} idle, "
            f"{counts['far_catchup_abandoned']} abandoned)")
    if never_taken(far):
        return f"far catch-up: NEVER TAKEN, 0 installs in this --far-catchup run: {text}"
    return f"far catch-up: {text}"
