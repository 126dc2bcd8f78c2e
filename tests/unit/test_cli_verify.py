"""`raftlog cluster verify` (multiraft/cli/commands.py): pages through the scrubber's
answers, prints one row per partition, and exits 1 when any is not identical."""

from __future__ import annotations

import argparse
from typing import Any

from multiraft.cli import commands


def _partition(number: int, status: str, ranges: list[list[int]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    odd = [] if status == "identical" else [{"node": 3, "status": status}]
    return {"topic": "t", "partition": number, "status": status, "leader": 1, "high_watermark": 12_000,
            "ranges": list(ranges), "repair_started": status == "different",
            "replicas": [{"node": 2, "status": "identical"}, *odd]}


class _Client:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages, self.asked = pages, []

    def verify(self, topics: list[str] | None, start: int) -> dict[str, Any]:
        self.asked.append((topics, start))
        return self.pages[len(self.asked) - 1]


def test_all_identical_exits_0_after_every_page(capsys) -> None:  # type: ignore[no-untyped-def]
    client = _Client([{"partitions": [_partition(0, "identical")], "next_start": 1},
                      {"partitions": [_partition(1, "identical")], "next_start": None}])
    assert commands.cluster_verify(client, argparse.Namespace(topic=["t"])) == commands.EXIT_OK  # type: ignore[arg-type]
    assert client.asked == [(["t"], 0), (["t"], 1)]
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["TOPIC", "PARTITION", "STATUS", "LEADER", "HW", "REPLICAS", "RANGES", "REPAIR"]
    assert len(out) == 3


def test_a_different_partition_is_printed_with_its_ranges_and_exits_1(capsys) -> None:  # type: ignore[no-untyped-def]
    client = _Client([{"partitions": [_partition(0, "identical"), _partition(1, "different", [[4096, 8192]])],
                       "next_start": None}])
    assert commands.cluster_verify(client, argparse.Namespace(topic=None)) == commands.EXIT_FAILED  # type: ignore[arg-type]
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row == ["t", "1", "different", "1", "12000", "3", "[4096,8192)", "yes"]
