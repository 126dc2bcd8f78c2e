"""`--far-catchup` (chaos/farcatchup.py): the node settings it gives, where it runs, and how
a run's summary counts the far-horizon installs from the nodes' logs."""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields
from pathlib import Path

from chaos import farcatchup
from chaos.__main__ import FAR_CATCHUP_RUNS, SUITES, _parser
from multiraft.node.config import NodeConfig


def _line(event: str, **values: object) -> str:
    return json.dumps({"node_id": 1, **values, "event": event, "level": "info",
                       "timestamp": "2026-11-26T15:00:00Z"})


def test_the_node_file_sets_only_far_thresholds_below_the_defaults(tmp_path: Path) -> None:
    # Goal: every node's --config file is a valid TOML of NodeConfig settings, with
    # thresholds far below the defaults, and the topics get small segments.
    path = farcatchup.write_node_config(tmp_path)
    settings = tomllib.loads(path.read_text())
    assert set(settings) <= {f.name for f in fields(NodeConfig)}
    defaults = {f.name: f.default for f in fields(NodeConfig) if f.name in settings}
    assert settings == {"far_catchup_lag_entries": farcatchup.LAG_ENTRIES,
                        "far_catchup_lag_bytes": farcatchup.LAG_BYTES}
    assert all(0 < settings[name] < defaults[name] for name in settings)
    assert farcatchup.topic_config() == {"segment_bytes": farcatchup.SEGMENT_BYTES}
    assert 4096 <= farcatchup.SEGMENT_BYTES <= farcatchup.LAG_BYTES


def test_the_standard_suite_has_a_far_run_and_the_smoke_run_has_none() -> None:
    # Goal: `make chaos` takes the path; `make chaos-smoke` (CI) is unchanged.
    assert FAR_CATCHUP_RUNS["standard"] and "smoke" not in FAR_CATCHUP_RUNS
    assert all("kill" in faults for faults in FAR_CATCHUP_RUNS["standard"])  # restarts open the window
    assert SUITES["smoke"] == [("kill", "pause", "partition", "corrupt")]
    assert _parser().parse_args(["run", "--far-catchup"]).far_catchup is True
    assert _parser().parse_args(["run"]).far_catchup is False


def test_events_are_counted_from_every_node_log(tmp_path: Path) -> None:
    # Goal: the counts come from the JSON lines the nodes wrote, whatever else is in them.
    (tmp_path / "node1.log").write_text("\n".join([
        _line("far_catchup_started", group_id=3, follower=2, upto=75, files=2, bytes=8225),
        _line("far_catchup_done", group_id=3, follower=2, upto=75, ok=True),
        _line("far_catchup_done", group_id=4, follower=2, upto=80, ok=False),
        _line("far_catchup_refused", group_id=5, follower=3, upto=90, reason="it holds that entry already"),
        _line("far_install_started", group_id=3, target=2, index=75),  # the core's, not counted
        "Traceback (most recent call last): far_catchup_installed",  # not JSON
    ]) + "\n")
    (tmp_path / "node2.log").write_text("\n".join([
        _line("far_catchup_installed", group_id=3, leader=1, upto=75, files=2, bytes=8225),
        _line("far_catchup_failed", group_id=4, leader=1, upto=80, error="RpcError()"),
        _line("far_catchup_not_needed", group_id=6, leader=1, upto=99, reason="it holds the install's end"),
        _line("far_catchup_abandoned", group_id=7, follower=3, upto=120, reason="the hold ended"),
    ]) + "\n")
    far = farcatchup.count_events(sorted(tmp_path.glob("node*.log")))
    counts = far["counts"]
    assert (counts["far_catchup_installed"], counts["far_catchup_failed"], counts["far_catchup_refused"]) == (1, 1, 1)
    assert (counts["far_catchup_started"], counts["far_catchup_not_needed"], counts["far_catchup_idle"]) == (1, 1, 0)
    assert (counts["far_catchup_done"], counts["far_catchup_done_ok"], counts["far_catchup_done_failed"]) == (2, 1, 1)
    assert counts["far_catchup_abandoned"] == 1
    assert sorted(record["event"] for record in far["events"]) == [
        "far_catchup_abandoned", "far_catchup_failed", "far_catchup_installed"]
    assert farcatchup.summary_part(far) == ("far catch-up: 1 installed, 1 failed, 1 refused "
                                            "(1 offers taken, 1 not needed, 0 idle, 1 abandoned)")


def test_a_run_that_never_took_the_path_says_so(tmp_path: Path) -> None:
    # Goal: a --far-catchup run with no install cannot pass unnoticed.
    (tmp_path / "node1.log").write_text(_line("far_catchup_refused", group_id=1, follower=2, upto=9) + "\n")
    far = farcatchup.count_events([tmp_path / "node1.log"])
    assert farcatchup.never_taken(far)
    assert farcatchup.summary_part(far).startswith("far catch-up: NEVER TAKEN, 0 installs")
    assert farcatchup.never_taken(farcatchup.count_events([]))


def test_the_standard_suite_runs_the_far_run_last_with_its_own_seed(tmp_path: Path, monkeypatch) -> None:
    # Goal: `python -m chaos suite standard --seed 100` runs the far run, seed 108, on three
    # nodes after every run it had before (the mirror run, added later, follows it with
    # 109, so the seeds of the earlier runs stay), and no other run of the suite has the option.
    import chaos.__main__ as entry

    calls = []

    async def one(out: Path, seed: int, nodes: int, duration: float, faults: list[str], unsafe: list[str],
                  groups: bool = False, far_catchup: bool = False, mirror: bool = False) -> bool:
        calls.append((out.name, seed, nodes, tuple(faults), far_catchup, mirror))
        return True

    monkeypatch.setenv("RAFTLOG_CHAOS_NO_NS", "1")
    monkeypatch.setattr(entry, "_one", one)
    assert entry.main(["suite", "standard", "--seed", "100", "--out", str(tmp_path)]) == 0
    assert [call[5] for call in calls] == [False] * (len(calls) - 1) + [True]  # the mirror run last
    calls = calls[:-1]
    assert [call[4] for call in calls] == [False] * (len(calls) - 1) + [True]
    name, seed, nodes, faults, _, _ = calls[-1]
    assert (seed, nodes, faults) == (108, 3, FAR_CATCHUP_RUNS["standard"][0])
    assert name.endswith(f"-far-seed{seed}")
