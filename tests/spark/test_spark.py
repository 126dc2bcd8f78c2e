"""Goal: the `raftlog` Spark format and `raftlog export` against a real 3-process cluster
with a real local Spark session: exact round trips (null keys, binary values, headers),
every offset option, minPartitions / maxRecordsPerPartition splits, a range crossing a
retention boundary with failOnDataLoss both ways, a partition leader killed during an
export, incremental exports with --group, the writer, and bad options that name
themselves.

One cluster (fixed ports 17500/18500 on 127.0.0.1-3, apart from the other process
tests) and one SparkSession (local[2], UI off, loopback) serve the whole module; each
test uses its own topics.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.cli.main import main as raftlog_main
from multiraft.client import Client
from multiraft.client.http import RaftlogError
from spark_connector.source import SCHEMA, SCHEMA_WITH_HEADERS
from tests.free_ports import process_cluster

pytestmark = pytest.mark.integration
RAFT_PORT = 17500
HTTP_PORT = 18500
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
REPO = Path(__file__).resolve().parents[2]
CONDITION_TIMEOUT_S = 30.0
RETENTION_TIMEOUT_S = 25.0
T = TypeVar("T")


def until(probe: Callable[[], T | None], what: str, timeout_s: float = CONDITION_TIMEOUT_S) -> T:
    """Poll `probe` until it returns something other than None, within a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)  # poll interval, not a condition wait


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with process_cluster(tmp_path_factory.mktemp("spark-cluster"), HOSTS, RAFT_PORT, HTTP_PORT,
                         "the Spark tests") as local:
        yield local


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # An editable install is not on the scan PySpark's auto-registration does; the
    # repository root on PYTHONPATH (as a wheel in site-packages would be) lets it find
    # `pyspark_raftlog` from any working directory.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved]))
    from spark_connector.session import spark_session

    session = spark_session("local[2]", "raftlog-tests", conf={"spark.sql.shuffle.partitions": "2"})
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.http_addresses, attempts=6, timeout_s=30) as made:
        yield made


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.http_addresses)


def create_topic(client: Client, cluster: LocalCluster, name: str, partitions: int,
                 config: dict[str, Any] | None = None) -> None:
    client.create_topic(name, partitions, 3, config)

    def ready() -> bool | None:
        for node in cluster.nodes:
            try:
                views = client.describe_topic(name, server=node.http_addr)["partitions"]
            except RaftlogError as error:
                if error.code == "UNKNOWN_TOPIC":  # that node has not applied the catalog change yet
                    return None
                raise
            if len(views) != partitions or any(v["leader"] is None or v["high_watermark"] is None for v in views):
                return None
        return True

    until(ready, f"leaders of {name} on every node")


def produce(client: Client, topic: str, records: list[tuple[bytes | None, bytes | None, tuple, int | None]],
            ) -> dict[tuple[int, int], tuple[bytes | None, bytes | None, tuple]]:
    """Produce (key, value, headers, partition) records; {(partition, offset): record}."""
    with client.producer(topic, idempotent=True, linger_ms=5) as producer:
        futures = [(producer.send(v, k, partition=p, headers=h), (k, v, h)) for k, v, h, p in records]
        producer.flush()
    return {future.result(30): record for future, record in futures}


def produce_values(client: Client, topic: str, values_by_partition: dict[int, list[bytes]],
                   batch_records: int = 1000) -> None:
    """Many unkeyed records fast: one hop to the client's loop per partition."""
    with client.producer(topic, idempotent=True, linger_ms=5, batch_records_max=batch_records) as producer:
        futures = [f for p, values in values_by_partition.items() for f in producer.send_many(values, partition=p)]
        producer.flush()
    assert all(f.result(30)[1] >= 0 for f in futures)


def rows_by_position(rows: list[Any]) -> dict[tuple[int, int], Any]:
    return {(r["partition"], r["offset"]): r for r in rows}


def read(spark: Any, cluster: LocalCluster, name: str, /, **options: str) -> Any:
    reader = spark.read.format("raftlog").option("servers", servers(cluster)).option("topic", name)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_round_trip_with_nulls_binary_and_headers(spark: Any, cluster: LocalCluster, client: Client) -> None:
    # Goal: what was produced (null keys, null values, every byte value, headers) comes back
    # exactly, with the Kafka source's schema, topic/partition/offset/timestamp columns; the
    # format was found by PySpark's auto-registration (pyspark_raftlog).
    from spark_connector.source import auto_registered

    assert auto_registered(spark)
    create_topic(client, cluster, "roundtrip", 3)
    records = []
    for i in range(600):
        key = None if i % 5 == 0 else b"key-%d" % i
        value = None if i % 97 == 1 else bytes(range(256))[i % 256:] + b"\x00\xff" + i.to_bytes(4, "big")
        headers = (("trace", b"\x00%d" % i), ("trace", b"dup")) if i % 7 == 0 else ()
        records.append((key, value, headers, i % 3))
    produced = produce(client, "roundtrip", records)
    started_ms = time.time() * 1000
    frame = read(spark, cluster, "roundtrip", includeHeaders="true")
    assert frame.schema == SCHEMA_WITH_HEADERS
    rows = rows_by_position(frame.collect())
    assert set(rows) == set(produced)
    for position, (key, value, headers) in produced.items():
        row = rows[position]
        assert (row["key"], row["value"], row["topic"], row["timestampType"]) == (key, value, "roundtrip", 0)
        assert (None if not headers else [(h["key"], h["value"]) for h in row["headers"]]) == \
            (None if not headers else list(headers))
        assert abs(row["timestamp"].timestamp() * 1000 - started_ms) < 120_000
    plain = read(spark, cluster, "roundtrip")
    assert plain.schema == SCHEMA
    assert plain.count() == 600


def test_offset_options(spark: Any, cluster: LocalCluster, client: Client) -> None:
    # Goal: every offset option selects exactly the records Kafka's would: earliest/latest,
    # per-partition JSON with -2/-1, assign, subscribePattern, timestamps, isolation.
    create_topic(client, cluster, "offsets", 2)
    produce(client, "offsets", [(b"a", b"first-%d" % i, (), i % 2) for i in range(200)])
    time.sleep(0.05)  # the second half gets later producer timestamps than the first
    produce(client, "offsets", [(b"b", b"second-%d" % i, (), i % 2) for i in range(200)])
    everything = rows_by_position(read(spark, cluster, "offsets").collect())
    assert set(everything) == {(p, o) for p in (0, 1) for o in range(200)}

    def positions(**options: str) -> set[tuple[int, int]]:
        return set(rows_by_position(read(spark, cluster, "offsets", **options).collect()))

    assert positions(startingOffsets='{"offsets":{"0":150,"1":-2}}', endingOffsets='{"offsets":{"0":-1,"1":30}}') \
        == {(0, o) for o in range(150, 200)} | {(1, o) for o in range(30)}
    assert positions(startingOffsets="earliest", endingOffsets="latest") == set(everything)
    assert positions(endingOffsets='{"offsets":{"0":10}}', isolation="read_committed") == \
        {(0, o) for o in range(10)} | {(1, o) for o in range(200)}
    assert positions(isolation="uncommitted") == set(everything)
    assigned = read(spark, cluster, "offsets", topic="", assign='{"offsets":[1]}',
                    startingOffsets='{"offsets":{"1":190}}').collect()
    assert {(r["partition"], r["offset"]) for r in assigned} == {(1, o) for o in range(190, 200)}
    pattern = spark.read.format("raftlog").option("servers", servers(cluster)) \
        .option("subscribePattern", "off.e.s").load()
    assert pattern.count() == 400
    second = min(r["timestamp"] for r in everything.values() if r["value"].startswith(b"second"))
    cut = int(second.replace(tzinfo=datetime.UTC).timestamp() * 1000)
    after = positions(startingTimestamp=str(cut))
    assert after == {p for p, r in everything.items() if r["value"].startswith(b"second")}
    assert positions(endingTimestamp=str(cut)) == set(everything) - after
    assert positions(startingOffsetsByTimestamp=json.dumps({"offsets": {"0": cut}})) == \
        {p for p in after if p[0] == 0} | {(1, o) for o in range(200)}


def test_min_partitions_and_max_records_split(spark: Any, cluster: LocalCluster, client: Client) -> None:
    # Goal: minPartitions and maxRecordsPerPartition split partitions into offset ranges
    # (more Spark partitions) and the rows stay exactly the same, each read once.
    create_topic(client, cluster, "split", 2)
    produce(client, "split", [(None, b"v%d" % i, (), 0 if i < 900 else 1) for i in range(1000)])
    whole = read(spark, cluster, "split")
    assert whole.rdd.getNumPartitions() == 2
    for options, at_least in (({"minPartitions": "10"}, 10), ({"maxRecordsPerPartition": "100"}, 10)):
        frame = read(spark, cluster, "split", **options)
        assert frame.rdd.getNumPartitions() >= at_least
        offsets = sorted((r["partition"], r["offset"]) for r in frame.select("partition", "offset").collect())
        assert offsets == [(0, o) for o in range(900)] + [(1, o) for o in range(100)]


def test_fail_on_data_loss_both_ways(spark: Any, cluster: LocalCluster, client: Client) -> None:
    # Goal: a range that starts below the log start retention left: failOnDataLoss (the
    # default) fails naming the lost offsets and the option; false skips what is gone
    # and reads the rest exactly.
    create_topic(client, cluster, "retained", 1, {"segment_bytes": 65536, "retention_bytes": 131072})
    produce_values(client, "retained", {0: [b"%06d" % i + b"r" * 94 for i in range(10_000)]})

    def trimmed() -> int | None:
        # Each replica applies retention on its own: until all three have trimmed, a
        # reader finds offset 0 on a slower one and rightly reports no loss.
        views = client.run(client.aio.partition_views("retained")).get(0, [])
        starts = [v["log_start_offset"] for v in views if v["high_watermark"] is not None]
        return min(starts) if len(starts) == 3 and min(starts) > 0 else None

    log_start = until(trimmed, "retention to move the log start of every replica of retained/0",
                      RETENTION_TIMEOUT_S)
    with pytest.raises(Exception, match=r"(?s)DataLossError.*retained/0: offsets \[0, \d+\).*failOnDataLoss"):
        read(spark, cluster, "retained", startingOffsets='{"retained":{"0":0}}').count()
    rows = read(spark, cluster, "retained", startingOffsets='{"retained":{"0":0}}', failOnDataLoss="false") \
        .select("offset", "value").collect()
    offsets = [r["offset"] for r in rows]
    assert offsets == list(range(offsets[0], 10_000)) and offsets[0] >= log_start
    assert all(r["value"][:6] == b"%06d" % r["offset"] for r in rows)


def test_leader_killed_during_export(spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    # Goal: kill -9 a partition leader while the export runs (12 tasks in waves of 2: the
    # kill lands after the first tasks finished, with most still to run, a third of them
    # planned to read from the killed node); the readers fail over to other replicas and
    # the Parquet output is still exactly the planned range.
    create_topic(client, cluster, "failover", 3)
    count = 60_000
    produce_values(client, "failover", {p: [b"%02d%08d" % (p, i) + b"f" * 90 for i in range(count // 3)]
                                        for p in range(3)})
    leader = next(v["leader"] for v in client.describe_topic("failover")["partitions"] if v["partition"] == 0)
    killed: dict[str, bool] = {}

    def kill_when_running() -> None:
        tracker = spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stages = [s for s in map(tracker.getStageInfo, tracker.getActiveStageIds()) if s is not None]
            if any(s.numCompletedTasks >= 2 for s in stages):
                cluster.kill_node(leader)
                killed["during"] = any(s.numCompletedTasks < s.numTasks for s in stages)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    try:
        read(spark, cluster, "failover", maxRecordsPerPartition="5000").write.parquet(str(tmp_path / "out"))
    finally:
        killer.join(120)
        cluster.start_node(leader)
        cluster.wait_healthy(30, nodes=[leader])
    assert killed.get("during"), "the leader was not killed while the export ran"
    table = pq.read_table(tmp_path / "out", columns=["partition", "offset", "value"])
    positions = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert positions == sorted((p, o) for p in range(3) for o in range(count // 3))
    values = table.column("value").to_pylist()
    assert len(set(values)) == count and all(int(v[:2]) == p for v, p in zip(values, table.column("partition")
                                                                                 .to_pylist(), strict=True))


def export(cluster: LocalCluster, *args: str) -> int:
    return raftlog_main(["export", *args, "--server", servers(cluster), "--master", "local[2]"])


def test_incremental_exports_with_group(cluster: LocalCluster, client: Client, spark: Any, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Goal: `raftlog export --group` continues where the last export stopped: three
    # exports with produces in between hold every record exactly once, the group's
    # committed offsets are the exported ends, progress goes to stderr and a summary out.
    create_topic(client, cluster, "incremental", 2)
    target = f"parquet:{tmp_path / 'out'}"
    produce(client, "incremental", [(None, b"one-%d" % i, (), i % 2) for i in range(300)])
    assert export(cluster, "incremental", "--to", target, "--group", "nightly") == 0
    out, err = capsys.readouterr()
    assert "exported 300 records" in out and "from 2 of 2 partitions" in out and "committed 0:150,1:150" in out
    assert "export: incremental: 0:[0,150), 1:[0,150)" in err
    produce(client, "incremental", [(None, b"two-%d" % i, (), i % 2) for i in range(100)])
    assert export(cluster, "incremental", "--to", target, "--group", "nightly") == 0
    assert "exported 100 records" in capsys.readouterr().out
    assert export(cluster, "incremental", "--to", target, "--group", "nightly") == 0
    assert "exported 0 records" in capsys.readouterr().out
    assert client.fetch_offsets("nightly", "incremental") == {0: 200, 1: 200}
    table = pq.read_table(tmp_path / "out", columns=["partition", "offset", "value"])
    positions = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert positions == [(p, o) for p in (0, 1) for o in range(200)]


def test_export_formats_ranges_and_cli_errors(cluster: LocalCluster, client: Client, spark: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # Goal: --format csv/json with --from/--until offsets write exactly that range; bad
    # flags exit 2 with a message naming the flag; a real `raftlog export` process (its
    # own JVM, the session builder's environment) exports to Parquet.
    create_topic(client, cluster, "formats", 1)
    produce(client, "formats", [(b"k", b"text-%d" % i, (), 0) for i in range(50)])
    # The real process starts its JVM meanwhile (half a minute here), overlapping the rest.
    process = subprocess.Popen([sys.executable, "-m", "multiraft.cli", "export", "formats", "--to",
                                f"parquet:{tmp_path / 'process'}", "--master", "local[2]", "--server",
                                servers(cluster)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path)
    try:
        _export_in_process(cluster, tmp_path, capsys)
        stdout, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0, stderr[-3000:]
    assert "exported 50 records" in stdout
    assert pq.read_table(tmp_path / "process").num_rows == 50


def _export_in_process(cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export(cluster, "formats", "--to", str(tmp_path / "csv"), "--format", "csv", "--from", "10",
                  "--until", "20") == 0
    lines = "".join(p.read_text() for p in sorted((tmp_path / "csv").glob("part-*.csv"))).splitlines()
    values = sorted(line.split(",")[1] for line in lines if not line.startswith("key,"))
    assert values == sorted(f"text-{i}" for i in range(10, 20))
    assert export(cluster, "formats", "--to", f"json:{tmp_path / 'json'}", "--from", "0:45") == 0
    docs = [json.loads(line) for p in (tmp_path / "json").glob("part-*.json") for line in p.read_text().splitlines()]
    assert sorted(d["offset"] for d in docs) == list(range(45, 50))
    capsys.readouterr()
    for args, flag in ((["--from", "soon"], "--from"), (["--until", "99"], "--until"),
                       (["--to", "csv:/tmp/x", "--format", "json"], "--format")):
        argv = ["formats", "--to", f"parquet:{tmp_path / 'bad'}", *args]
        assert export(cluster, *argv) == 2
        assert flag in capsys.readouterr().err


def test_writer_round_trip_and_bad_options(spark: Any, cluster: LocalCluster, client: Client) -> None:
    # Goal: df.write.format("raftlog") produces key/value/partition/headers rows that read
    # back exactly; overwrite, a missing value column and bad options name the problem.
    create_topic(client, cluster, "written", 3)
    data = [(None if i % 4 == 0 else f"k{i}", f"value-{i}".encode(), i % 3, [("h", b"%d" % i)] if i % 5 == 0 else None)
            for i in range(300)]
    frame = spark.createDataFrame(data, "key string, value binary, partition int, "
                                        "headers array<struct<key:string,value:binary>>")
    frame.write.format("raftlog").option("servers", servers(cluster)).option("topic", "written") \
        .mode("append").save()
    rows = read(spark, cluster, "written", includeHeaders="true").collect()
    got = {r["value"]: (r["key"], r["partition"], [(h["key"], h["value"]) for h in r["headers"] or []])
           for r in rows}
    assert got == {v: (k.encode() if k else None, p, list(h or [])) for k, v, p, h in data}
    bad_writes = (
        (frame.write.mode("overwrite"), {"topic": "written"}, "mode"),
        (frame.select("key").write.mode("append"), {"topic": "written"}, "value"),
        (frame.write.mode("append"), {"topic": "written", "acks": "most"}, "acks"),
    )
    for writer, options, named in bad_writes:
        writer = writer.format("raftlog").option("servers", servers(cluster))
        for name, value in options.items():
            writer = writer.option(name, value)
        with pytest.raises(Exception, match=f"'{named}'"):
            writer.save()
    for options, named in (({"startingOffsets": "latest"}, "startingOffsets"),
                           ({"endingOffsets": '{"written":{"0":100000}}'}, "endingOffsets"),
                           ({"topic": "absent"}, "topic"),
                           ({"startingOfsets": "earliest"}, "startingOfsets")):
        with pytest.raises(Exception, match=f"(?i)raftlog option '{named}'"):
            read(spark, cluster, "written", **options).count()
