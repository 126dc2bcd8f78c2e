"""Where a decommission's time goes, from the nodes' logs (bench/decommission.py).

The time the move throttle implies: the throttle (multiraft/node/move_throttle.py) is
one token bucket per *sending* node, and a copy is sent by its partition's leader (a
far-horizon install of whole files, then appends: catchup_leader.py). Copies sent by
different nodes run side by side (each target node stages at most two at once, and is
not throttled). So, with B_s the bytes node s's leaders sent to the new copies and R
the rate per node:

    implied = max over sending nodes s of B_s / R

The bench reports it twice: as the copies were actually sent (B_s from each node's
`raftlog_move_throttle_sent_bytes_total`), and for the best spread the leaving node's
holding allows (its copies' sizes b_p, dealt largest first to the k staying nodes:
max(max_p b_p, sum_p b_p / k) / R when the deal comes out even).

The breakdown, from the events each node logs (JSON lines in `<dir>/node<n>/node.log`),
in seconds after the decommission was asked for:
- drain: until the leaving node led no group any more (its last `role_changed` away
  from leader);
- copies: from the first far-horizon transfer started (`far_catchup_started`, on a
  leader) to the last copy installed (`far_catchup_installed`, on a target, whose
  `stage_s` is the staging alone), with what came before the first (the controller's
  `replica_moving`, the groups' learners added);
- leave: from the last copy installed to the leaving node's last copy dropped
  (`group_closed` with `deleted`, after the group removed it and the catalog was told)
  and on to `done` (out of the metadata group).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # seconds since the epoch
    node: int
    name: str
    fields: dict


def read_events(directory: Path, since: float) -> list[Event]:
    """Every node's logged events at or after `since` (epoch seconds), in time order."""
    events = []
    for log in sorted(directory.glob("node*/node.log")):
        node = int(log.parent.name.removeprefix("node"))
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
                at = datetime.fromisoformat(record.pop("timestamp").replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError):
                continue
            if at >= since:
                events.append(Event(at, node, record.pop("event", ""), record))
    events.sort(key=lambda e: e.at)
    return events


def spread_implied_s(sizes: list[int], senders: int, rate: int) -> float:
    """The implied time for the best spread: copies dealt largest first to the least
    loaded of `senders` nodes, the busiest one's bytes over the rate."""
    assert senders >= 1 and rate > 0
    loads = [0] * senders
    for size in sorted(sizes, reverse=True):
        loads[loads.index(min(loads))] += size
    return max(loads) / rate


def _first(events: list[Event], name: str, **match: object) -> Event | None:
    return next((e for e in events if e.name == name and all(e.fields.get(k) == v for k, v in match.items())), None)


def _last(events: list[Event], name: str, **match: object) -> Event | None:
    return _first(list(reversed(events)), name, **match)


def breakdown(events: list[Event], began: float, done: float, leaving: int) -> list[str]:
    """Lines for people: the phases and the gaps between them (seconds after `began`)."""
    def at(event: Event | None) -> str:
        return f"{event.at - began:6.2f} s" if event is not None else "     -  "

    lines = []
    drained = _last([e for e in events if e.node == leaving], "role_changed", previous="leader")
    lines.append(f"  drain   node {leaving} led its last group until {at(drained)}")
    named = _first(events, "replica_moving")
    learner = _first(events, "replica_move_step", step="add_learner")
    started = [e for e in events if e.name == "far_catchup_started"]
    installed = [e for e in events if e.name == "far_catchup_installed"]
    lines.append(f"  copies  new replicas named {at(named)}, first learner asked for {at(learner)}, "
                 f"first transfer {at(started[0] if started else None)}, last installed "
                 f"{at(installed[-1] if installed else None)}")
    for event in installed:
        fields = event.fields
        staged = float(fields.get("stage_s", 0.0))
        lines.append(f"          group {fields.get('group_id')}: from node {fields.get('leader')} to node "
                     f"{event.node}, {int(fields.get('bytes', 0)) / 2**20:.0f} MiB staged in {staged:.2f} s "
                     f"({int(fields.get('bytes', 0)) / 2**20 / max(staged, 1e-9):.1f} MiB/s), "
                     f"{at(event)} installed")
    dropped = [e for e in events if e.node == leaving and e.name == "group_closed" and e.fields.get("deleted")]
    last_copy = installed[-1] if installed else None
    lines.append(f"  leave   last old copy dropped {at(dropped[-1] if dropped else None)}, metadata group left, "
                 f"done {done - began:6.2f} s")
    if last_copy is not None and dropped:
        lines.append(f"  phases  until the first transfer {started[0].at - began:.2f} s; transfers "
                     f"{last_copy.at - started[0].at:.2f} s; installed to dropped {dropped[-1].at - last_copy.at:.2f} s; "
                     f"dropped to done {done - dropped[-1].at:.2f} s")
    return lines
