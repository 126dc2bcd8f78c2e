"""`raftlog cluster verify` (multiraft/cli/commands.py): pages through the scrubber's
answers, prints one row per partition, and exits 1 when any is not identical; so does
`raftlog mirror verify`; `raftlog mirror status` shows each partition's chunks in flight."""

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

    def verify(self, topics: list[str] | None, start: int, deep: bool = True) -> dict[str, Any]:
        self.asked.append((topics, start) if deep else (topics, start, "fast"))
        return self.pages[len(self.asked) - 1]


def test_all_identical_exits_0_after_every_page(capsys) -> None:  # type: ignore[no-untyped-def]
    client = _Client([{"partitions": [_partition(0, "identical")], "next_start": 1},
                      {"partitions": [_partition(1, "identical")], "next_start": None}])
    assert commands.cluster_verify(client, argparse.Namespace(topic=["t"], fast=False)) == commands.EXIT_OK  # type: ignore[arg-type]
    assert client.asked == [(["t"], 0), (["t"], 1)], "deep by default: a verify is for finding rot"
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["TOPIC", "PARTITION", "STATUS", "LEADER", "HW", "REPLICAS", "RANGES", "REPAIR"]
    assert len(out) == 3


def test_a_different_partition_is_printed_with_its_ranges_and_exits_1(capsys) -> None:  # type: ignore[no-untyped-def]
    client = _Client([{"partitions": [_partition(0, "identical"), _partition(1, "different", [[4096, 8192]])],
                       "next_start": None}])
    assert commands.cluster_verify(client, argparse.Namespace(topic=None, fast=True)) == commands.EXIT_FAILED  # type: ignore[arg-type]
    assert client.asked == [(None, 0, "fast")], "--fast asks every page to take closed segments' sidecars"
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row == ["t", "1", "different", "1", "12000", "3", "[4096,8192)", "yes"]


class _MirrorClient:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages, self.asked = pages, []

    def mirror_action(self, name: str, action: str, topic: str | None = None,
                      body: dict[str, Any] | None = None) -> dict[str, Any]:
        self.asked.append((name, action, body))
        return self.pages[len(self.asked) - 1]


def _verdict(number: int, status: str, ranges: list[list[int]] = (), repair: str = "") -> dict[str, Any]:  # type: ignore[assignment]
    return {"topic": "t", "partition": number, "status": status, "leader": 2, "lo": 0, "hi": 10_100,
            "source_high_watermark": 10_100, "nodes_compared": 1 + 3 * bool(ranges), "ranges": list(ranges),
            "repair": repair}


def test_mirror_verify_pages_prints_and_exits_1_on_a_difference(capsys) -> None:  # type: ignore[no-untyped-def]
    from multiraft.cli.mirror_commands import mirror_verify

    client = _MirrorClient([{"partitions": [_verdict(0, "identical")], "next_start": 1},
                            {"partitions": [_verdict(1, "different", [[8192, 10100]], "resync_started")],
                             "next_start": None}])
    args = argparse.Namespace(name="dr", topic="t", repair=True, deep=False)
    assert mirror_verify(client, args) == commands.EXIT_FAILED  # type: ignore[arg-type]
    assert [a[2] for a in client.asked] == [{"start": 0, "repair": True, "topic": "t"},
                                            {"start": 1, "repair": True, "topic": "t"}]
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["TOPIC", "PARTITION", "STATUS"]
    assert out[2].split() == ["t", "1", "different", "2", "[0,10100)", "10100", "4", "[8192,10100)", "resync_started"]
    client = _MirrorClient([{"partitions": [_verdict(0, "identical")], "next_start": None}])
    assert mirror_verify(client, argparse.Namespace(name="dr", topic=None, repair=False, deep=True)) == commands.EXIT_OK  # type: ignore[arg-type]
    assert client.asked[0][2] == {"start": 0, "repair": False, "deep": True}, "--deep: the sink and the source read all"


def test_mirror_status_prints_each_partitions_chunks_in_flight(capsys) -> None:  # type: ignore[no-untyped-def]
    # Goal: `raftlog mirror status` shows per partition its pipeline's chunks and bytes in
    # flight against the window's limits, and its resyncs after the source truncated past it;
    # "-" for a partition no node reported.
    from types import SimpleNamespace

    from multiraft.cli.mirror_commands import mirror_status

    running = {"partition": 0, "state": "running", "position": 300, "lag_records": 0, "bytes_copied": 9000,
               "node": 2, "last_error": None, "truncated_resyncs": 1, "in_flight": {"chunks": 2, "bytes": 1500, "chunks_max": 4,
                                                            "bytes_max": 4194304}}
    status = {"name": "dr", "sources": ["s:1"], "topics": [{"topic": "t", "promoted": False, "partitions": [
        running, {"partition": 1, "state": "unknown", "last_verify": None}]}],
        "priority": "normal", "state": "running", "credentials": False, "discovery": None}
    client = SimpleNamespace(mirror_status=lambda name: status)
    assert mirror_status(client, argparse.Namespace(name="dr")) == commands.EXIT_FAILED  # type: ignore[arg-type]
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["TOPIC", "PARTITION", "STATE", "POSITION", "LAG", "BYTES", "IN", "FLIGHT", "IN",
                              "FLIGHT", "BYTES", "NODE", "TRUNCATED", "RESYNCS", "LAST", "ERROR"]
    assert out[3].split() == ["t", "0", "running", "300", "0", "9000", "2/4", "1500/4194304", "2", "1", "-"]
    assert out[4].split() == ["t", "1", "unknown", "-", "-", "-", "-", "-", "-", "-", "-"]
