"""The flags every chaos node starts with (chaos/cluster.py): the source's and a mirror's sink's."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster import ChaosCluster
from chaos.mirror import SINK_FIRST_HOST


def test_chaos_nodes_run_no_scheduled_scrubs(tmp_path: Path) -> None:
    # Goal: scheduled scrubs are on by default (a week, at a random point within it); a chaos
    # run turns them off on every node, so a run (a negative control above all) depends only
    # on its seed and its faults, and any `--config` given after keeps its other settings.
    for cluster in (ChaosCluster(tmp_path / "source", 3, lambda node: {}, extra_args=("--config", "x.toml")),
                    ChaosCluster(tmp_path / "sink", 3, lambda node: {}, first_host=SINK_FIRST_HOST, name="s")):
        for node in cluster.local.nodes:
            command = cluster.local.command(node)
            at = command.index("--scrub-interval-s")
            assert command[at + 1] == "0" and command.count("--scrub-interval-s") == 1
            assert command[command.index("--tick-ms") + 1] == "50"
