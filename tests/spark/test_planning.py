"""Goal: the connector's parts without Spark or a cluster: option parsing (every bad
option names itself), range resolution with data loss both ways, splitting by
minPartitions / maxRecordsPerPartition, spreading reads over replicas, the batch
decoder against the storage codec, the exact Arrow schema Spark demands, and the
reader meeting retention mid-read (a client double)."""

from __future__ import annotations

import asyncio
import itertools
import random

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from multiraft.client.http import BatchRead, RaftlogError
from spark_connector.decode import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, to_record_batch
from spark_connector.errors import DataLossError, DataLossWarning, OptionError
from spark_connector.export import parse_position, parse_target
from spark_connector.options import EARLIEST, LATEST, parse_read_options, parse_write_options
from spark_connector.planning import (
    OffsetRange,
    PartitionState,
    ReadTask,
    assign_servers,
    resolve_ranges,
    split_ranges,
)
from spark_connector.reader import PartitionReader
from spark_connector.source import SCHEMA, SCHEMA_WITH_HEADERS
from storage.batch import Compression, Record, encode_batch

BASE = {"servers": "127.0.0.1:8080", "topic": "t"}


@pytest.mark.parametrize(("options", "named"), [
    ({"topic": "t"}, "servers"),
    ({"servers": "nohost", "topic": "t"}, "servers"),
    ({"servers": "127.0.0.1:8080"}, "topic"),
    ({**BASE, "assign": '{"t":[0]}'}, "topic"),
    ({**BASE, "startingOffset": "earliest"}, "startingOffset"),
    ({**BASE, "startingOffsets": "latest"}, "startingOffsets"),
    ({**BASE, "startingOffsets": "{nope"}, "startingOffsets"),
    ({**BASE, "startingOffsets": '{"t":{"0":-1}}'}, "startingOffsets"),
    ({**BASE, "endingOffsets": "earliest"}, "endingOffsets"),
    ({**BASE, "endingOffsets": '{"t":{"x":5}}'}, "endingOffsets"),
    ({**BASE, "startingOffsets": "earliest", "startingTimestamp": "5"}, "startingTimestamp"),
    ({**BASE, "startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({**BASE, "minPartitions": "0"}, "minPartitions"),
    ({**BASE, "maxRecordsPerPartition": "lots"}, "maxRecordsPerPartition"),
    ({**BASE, "includeHeaders": "yes"}, "includeHeaders"),
    ({**BASE, "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({**BASE, "isolation": "serializable"}, "isolation"),
    ({**BASE, "fetchMaxBytes": "1"}, "fetchMaxBytes"),
    ({**BASE, "subscribePattern": "(", "topic": ""}, "subscribePattern"),
    ({"servers": "127.0.0.1:8080", "assign": '{"t":[0]}', "startingOffsets": '{"u":{"0":1}}'},
     "startingOffsets"),
    ({**BASE, "path": "/tmp/x"}, "path"),
])
def test_bad_read_options_name_the_option(options: dict[str, str], named: str) -> None:
    # Goal: every malformed, unknown or contradictory option fails naming that option.
    with pytest.raises(OptionError) as caught:
        parse_read_options(options)
    assert caught.value.option == named
    assert f"'{named}'" in str(caught.value)


def test_good_read_options_and_kafka_spellings() -> None:
    # Goal: Kafka's option names and values are accepted, case-insensitively.
    options = parse_read_options({"kafka.bootstrap.servers": "a:1,b:2", "SUBSCRIBE": "t,u",
                                  "startingOffsets": '{"t":{"0":5,"1":-2}}', "endingoffsets": "latest",
                                  "kafka.isolation.level": "read_uncommitted", "includeHeaders": "TRUE",
                                  "minPartitions": "4"})
    assert options.servers == ("a:1", "b:2")
    assert options.subscription.topics == ("t", "u")
    assert options.starting.offsets == {("t", 0): 5, ("t", 1): EARLIEST}
    assert options.ending.default == LATEST and options.isolation == "uncommitted"
    assert options.include_headers and options.min_partitions == 4 and options.fail_on_data_loss
    with pytest.raises(OptionError, match="'acks'"):
        parse_write_options({"servers": "a:1", "topic": "t", "acks": "some"})


def _state(partition: int, start: int, end: int, replicas: tuple[str, ...] = ("a", "b", "c")) -> PartitionState:
    return PartitionState("t", partition, replicas, replicas[0], start, end, end)


def test_resolve_ranges_and_data_loss_both_ways() -> None:
    # Goal: earliest/latest/explicit offsets resolve against the states; a start below the
    # log start raises by default and is skipped with a warning when failOnDataLoss=false.
    states = [_state(0, 10, 100), _state(1, 0, 50)]
    ranges = resolve_ranges(states, {("t", 0): EARLIEST, ("t", 1): 20}, {("t", 0): LATEST, ("t", 1): 40})
    assert ranges == [OffsetRange("t", 0, 10, 100), OffsetRange("t", 1, 20, 40)]
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        resolve_ranges(states, {("t", 0): 3, ("t", 1): 0}, {("t", 0): LATEST, ("t", 1): LATEST})
    with pytest.warns(DataLossWarning, match=r"\[3, 10\)"):
        ranges = resolve_ranges(states, {("t", 0): 3, ("t", 1): 0}, {("t", 0): LATEST, ("t", 1): LATEST},
                                fail_on_data_loss=False)
    assert ranges[0] == OffsetRange("t", 0, 10, 100)
    with pytest.raises(OptionError, match=r"'endingOffsets'.*past its end"):
        resolve_ranges(states, {("t", 0): EARLIEST, ("t", 1): EARLIEST}, {("t", 0): 101, ("t", 1): LATEST})
    with pytest.raises(OptionError, match=r"'startingOffsets'.*after its end"):
        resolve_ranges(states, {("t", 0): 60, ("t", 1): EARLIEST}, {("t", 0): 50, ("t", 1): LATEST})


def test_split_by_max_records_and_min_partitions() -> None:
    # Goal: pieces cover each range exactly, respect maxRecordsPerPartition, and reach at
    # least minPartitions in proportion to range sizes; empty ranges vanish.
    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 5, 105), OffsetRange("t", 2, 7, 7)]
    assert split_ranges(ranges) == ranges[:2]
    pieces = split_ranges(ranges, max_records=300)
    assert [p.size for p in pieces] == [250, 250, 250, 250, 100]
    pieces = split_ranges(ranges, min_partitions=11)
    assert len(pieces) >= 11
    assert sum(p.size for p in pieces if p.partition == 0) == 1000
    assert sum(1 for p in pieces if p.partition == 0) == 10
    for partition in (0, 1):
        mine = [p for p in pieces if p.partition == partition]
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))


def test_reads_spread_over_replicas() -> None:
    # Goal: the preferred servers of the pieces balance records over all replicas, not leaders.
    states = {("t", p): _state(p, 0, 900) for p in range(3)}
    pieces = split_ranges([OffsetRange("t", p, 0, 900) for p in range(3)], max_records=300)
    tasks = assign_servers(pieces, states, ("a", "b", "c", "d"))
    load: dict[str, int] = {}
    for task in tasks:
        load[task.servers[0]] = load.get(task.servers[0], 0) + task.range.size
        assert sorted(task.servers) == ["a", "b", "c", "d"] and task.servers[-1] == "d"
    assert load == {"a": 900, "b": 900, "c": 900}


def test_arrow_schema_is_exactly_what_spark_expects() -> None:
    # Goal: the schema the reader builds equals PySpark's own conversion of the declared one.
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert to_arrow_schema(SCHEMA_WITH_HEADERS, timezone="UTC").equals(ARROW_SCHEMA_WITH_HEADERS)


def test_decoder_matches_the_storage_codec() -> None:
    # Goal: null keys and values, arbitrary bytes, headers, zlib batches and range trimming
    # decode to exactly the records the storage codec encoded.
    rng = random.Random(7)
    frames, expected, base = [], [], 100
    for number in range(6):
        records = []
        for i in range(rng.randint(1, 30)):
            key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 6))
            value = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 12))
            headers = tuple((f"h{j}", rng.randbytes(j)) for j in range(rng.randint(0, 2))) if number % 2 else ()
            records.append(Record(key, value, headers, i * 3))
        compression = Compression.ZLIB if number == 3 else Compression.NONE
        frames.append((base, encode_batch(records, first_timestamp_ms=1_700_000_000_000 + number,
                                          compression=compression)))
        expected += [(base + i, r, 1_700_000_000_000 + number + 3 * i) for i, r in enumerate(records)]
        base += len(records)
    for start, end in ((0, base), (103, base - 4), (110, 111)):
        batch = to_record_batch("t", 2, frames, start, end, include_headers=True)
        assert batch is not None and batch.schema.equals(ARROW_SCHEMA_WITH_HEADERS)
        want = [e for e in expected if start <= e[0] < end]
        rows = batch.to_pylist()
        assert [r["offset"] for r in rows] == [e[0] for e in want]
        for row, (_, record, stamp) in zip(rows, want, strict=True):
            assert (row["key"], row["value"]) == (record.key, record.value)
            assert row["headers"] == ([{"key": k, "value": v} for k, v in record.headers] or None)
            assert int(row["timestamp"].timestamp() * 1000) == stamp
            assert (row["topic"], row["partition"], row["timestampType"]) == ("t", 2, 0)
    plain = to_record_batch("t", 0, frames, 0, base)
    assert plain is not None and plain.schema.equals(ARROW_SCHEMA)
    assert plain.column("value").type == pa.binary()
    assert to_record_batch("t", 0, frames, base, base + 5) is None


def test_export_positions_and_targets() -> None:
    # Goal: --from/--until and --to accept the documented shapes and name the flag otherwise.
    assert parse_target("csv:out", None)[0] == "csv"
    assert parse_target("parquet:hdfs://nn/x", None) == ("parquet", "hdfs://nn/x")
    with pytest.raises(OptionError, match="--format"):
        parse_target("csv:/tmp/x", "json")
    assert parse_position("12", "--from", "starting", "t", [0, 1]).offsets == {("t", 0): 12, ("t", 1): 12}
    assert parse_position("1:5", "--from", "starting", "t", [0, 1]).offsets == {("t", 1): 5}
    assert parse_position('{"0": 3}', "--until", "ending", "t", [0]).offsets == {("t", 0): 3}
    assert parse_position("@1700000000000", "--from", "starting", "t", [0]).timestamp_ms == 1_700_000_000_000
    assert parse_position("2023-11-14T22:13:20Z", "--from", "starting", "t", [0]).timestamp_ms == 1_700_000_000_000
    for bad, flag in (("soon", "--from"), ("7:1", "--until"), ("latest", "--from")):
        with pytest.raises(OptionError, match=flag):
            parse_position(bad, flag, "starting" if flag == "--from" else "ending", "t", [0, 1])


class _TrimmedCluster:
    """A client double: every server answers OFFSET_OUT_OF_RANGE below `log_start`, else records."""

    def __init__(self, log_start: int, frames: list[tuple[int, bytes]]) -> None:
        self.log_start = log_start
        self.frames = frames
        self.asked: list[str | None] = []

    async def consume_batches(self, topic: str, partition: int, offset: int, **options: object) -> BatchRead:
        self.asked.append(options.get("server"))  # type: ignore[arg-type]
        if offset < self.log_start:
            raise RaftlogError("OFFSET_OUT_OF_RANGE", f"offset {offset} is outside [{self.log_start}, 40]", 416)
        frames = [(b, f) for b, f in self.frames if b + 10 > offset]
        return BatchRead(frames, 40 if frames else offset, 40, self.log_start)

    async def describe_topic(self, name: str, server: str | None = None) -> dict[str, object]:
        return {"partitions": [{"partition": 0, "log_start_offset": self.log_start}]}


def test_reader_meets_retention_mid_read_both_ways() -> None:
    # Goal: when every replica refuses the position because retention moved the log start
    # past it during the read, the reader raises DataLossError, or with
    # failOnDataLoss=false warns and resumes exactly at the new log start.
    frames = [(b, encode_batch([Record(None, b"%d" % (b + i)) for i in range(10)], first_timestamp_ms=1))
              for b in range(20, 40, 10)]
    task = ReadTask(OffsetRange("t", 0, 5, 40), ("a", "b", "c"))
    failing = parse_read_options(BASE)
    with pytest.raises(DataLossError, match=r"t/0: offsets \[5, 20\)"):
        asyncio.run(PartitionReader(_TrimmedCluster(20, frames), task, failing).next_batch())  # type: ignore[arg-type]
    cluster = _TrimmedCluster(20, frames)
    reader = PartitionReader(cluster, task, parse_read_options({**BASE, "failOnDataLoss": "false"}))  # type: ignore[arg-type]
    with pytest.warns(DataLossWarning, match=r"\[5, 20\)"):
        batch = asyncio.run(reader.next_batch())
    assert batch is not None and batch.column("offset").to_pylist() == list(range(20, 40))
    assert {"a", "b", "c"} <= set(cluster.asked)  # every replica was asked before giving up on 5..19
