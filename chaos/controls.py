"""The negative controls (`make chaos-controls`): each unsafe server switch must be caught.

A control is caught when its run shows *safety evidence*: an anomaly of a safety class,
replicas that differ, or two leaders in one term. A run that fails only for another
reason (a final read that stopped short, a replica stuck behind, a node that did not come
back, the harness raising) proves nothing about the checker: counting it as caught, as
"the run failed" once did, would let a checker that sees nothing pass every control on a
slow day. Such a control is reported `NOT CAUGHT` with what the run did fail on.

Pure: the verdict is taken from a run's `details.json` dictionary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Control:
    faults: tuple[str, ...]  # the faults that expose the switch
    groups: bool = False  # needs the consumer-group workload
    mirror: bool = False  # needs a mirror (link pauses make chunks)


CONTROLS: dict[str, Control] = {
    "ack-before-fsync": Control(("kill",)),
    "no-dedup": Control(("kill", "partition")),
    "read-uncommitted": Control(("kill", "partition")),
    "skip-crc": Control(("corrupt",)),
    "vote-without-persist": Control(("power", "kill")),
    "group-early-assign": Control(("kill", "pause"), groups=True),  # must show as group-two-owners
    "mirror-skip-batch": Control(("kill", "pause"), mirror=True),
}

# Anomaly classes that say an operation could not be checked or a read did not finish:
# liveness, not safety. Every other class of chaos/anomalies.py is safety evidence.
NOT_EVIDENCE = frozenset({"final-read-incomplete", "group-drain-incomplete", "mirror-incomplete"})


def evidence(details: Mapping[str, Any]) -> list[str]:
    """What in a run's details shows a safety violation (empty: nothing does)."""
    found = [f"{name}={count}" for name, count in sorted(details.get("anomalies", {}).items())
             if count and name not in NOT_EVIDENCE]
    for what in ("replicas", "sink_replicas"):
        mismatched = details.get(what, {}).get("mismatched")
        if mismatched:
            found.append(f"{what} differ in {len(mismatched)} groups")
    for what in ("leaders_per_term", "sink_leaders_per_term"):
        violations = details.get(what, {}).get("violations")
        if violations:
            found.append(f"{what}: two leaders in one term ({len(violations)})")
    return found


@dataclass(frozen=True, slots=True)
class Verdict:
    switch: str
    caught: bool
    why: str

    def line(self) -> str:
        return f"chaos-control: {self.switch}: {'CAUGHT' if self.caught else 'NOT CAUGHT'} ({self.why})"


def verdict(switch: str, ok: bool | None, details: Mapping[str, Any] | None, error: str | None = None) -> Verdict:
    """The control's verdict from its run: `ok` the run's own verdict (None: it raised,
    `error` says how), `details` its details.json."""
    if ok is None or details is None:
        return Verdict(switch, False, f"the run raised: {error}")
    if ok:
        return Verdict(switch, False, "the run passed")
    shown = evidence(details)
    if shown:
        return Verdict(switch, True, ", ".join(shown))
    return Verdict(switch, False, f"the run failed without safety evidence: {details.get('summary', '?')}")
