"""Spark export rate: a 3-partition topic of 2,000,000 100-byte records to Parquet in local[2].

Starts a real 3-node cluster (127.0.0.1-3, fsync on, replication factor 3) with
the local launcher, produces the records in binary batches of 1,000, then in
one local[2] SparkSession (UI off, loopback) times, alternately, `--rounds` of:

- **raftlog**: `spark.read.format("raftlog")` over the topic (3 input partitions,
  readers spread over the replicas, Arrow batches) written to Parquet;
- **baseline**: the same job over an in-memory Arrow source of the same rows
  (same schema, same 3 partitions, batches memory-mapped from Arrow IPC files
  in the page cache): what a Python data source can reach on this machine,
  with no cluster, network or decoding in the way.

Each job is warmed up once first (Python worker start-up is not the rate).
It prints records/s per round, the medians and their ratio; the targets are
>= 1,000,000 records/s and >= 0.7 of the baseline. The cluster nodes share the
machine's cores with Spark during the raftlog job (they serve the reads).

    .venv/bin/python bench/spark_export.py [--records 2000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient
from spark_connector.decode import ARROW_SCHEMA, TIMESTAMP_TYPE_CREATE_TIME
from spark_connector.session import spark_session
from spark_connector.source import SCHEMA
from storage.batch import Record, encode_batch

PARTITIONS = 3
RECORD_BYTES = 100
RECORDS_PER_BATCH = 1000
ARROW_BATCH_ROWS = 70_000  # about what one 8 MiB raftlog fetch turns into
IN_FLIGHT_PER_PARTITION = 4
EVENT_TYPES = (b"click", b"view", b"cart", b"buy")
RAFT_PORT, HTTP_PORT = 17700, 18700


def value_of(partition: int, offset: int) -> bytes:
    """A distinct 100-byte JSON event (log-like text, as exports usually carry), the same for both jobs."""
    n = partition * 10**8 + offset
    value = b'{"id":%010d,"user":"u%06d","type":"%s","page":"/products/%06d","ms":%04d}' % (
        n, n * 7919 % 10**6, EVENT_TYPES[n % len(EVENT_TYPES)], n * 104_729 % 10**6, n % 9973)
    return value.ljust(RECORD_BYTES, b" ")


async def produce(servers: list[str], topic: str, per_partition: int) -> float:
    started = time.monotonic()
    async with AsyncClient(servers, timeout_s=60, attempts=8) as client:
        async def partition_writer(partition: int, lane: int) -> None:
            for first in range(lane * RECORDS_PER_BATCH, per_partition, RECORDS_PER_BATCH * IN_FLIGHT_PER_PARTITION):
                count = min(RECORDS_PER_BATCH, per_partition - first)
                records = [Record(None, value_of(partition, first + i)) for i in range(count)]
                batch = encode_batch(records, first_timestamp_ms=int(time.time() * 1000))
                await client.produce_batch(topic, partition, batch)

        await asyncio.gather(*(partition_writer(p, lane) for p in range(PARTITIONS)
                               for lane in range(IN_FLIGHT_PER_PARTITION)))
    return time.monotonic() - started


def baseline_files(directory: Path, per_partition: int) -> list[str]:
    """One Arrow IPC file per partition holding the same rows the topic holds."""
    paths = []
    now_us = int(time.time() * 1_000_000)
    for partition in range(PARTITIONS):
        path = directory / f"baseline-{partition}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
            for first in range(0, per_partition, ARROW_BATCH_ROWS):
                rows = min(ARROW_BATCH_ROWS, per_partition - first)
                values = pa.array([value_of(partition, first + i) for i in range(rows)], pa.binary())
                writer.write_batch(pa.RecordBatch.from_arrays([
                    pa.nulls(rows, pa.binary()), values, pa.array(["bench"] * rows, pa.string()),
                    pa.array(np.full(rows, partition, np.int32)), pa.array(np.arange(first, first + rows)),
                    pa.array(np.full(rows, now_us), pa.timestamp("us", tz="UTC")),
                    pa.array(np.full(rows, TIMESTAMP_TYPE_CREATE_TIME, np.int32)),
                ], schema=ARROW_SCHEMA))
        paths.append(str(path))
    return paths


class ArrowFilesSource(DataSource):
    """The baseline: yields prepared Arrow record batches, memory-mapped (no copy, no decode)."""

    @classmethod
    def name(cls) -> str:
        return "arrow_files"

    def schema(self) -> object:
        return SCHEMA

    def reader(self, schema: object) -> DataSourceReader:
        return ArrowFilesReader(self.options["paths"].split(","))


class ArrowFilesReader(DataSourceReader):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(path) for path in self.paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(partition.value) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def timed_write(frame: object, path: Path | None) -> float:
    """Seconds to write `frame` to Parquet at `path` (None: the noop sink, the source's own rate)."""
    started = time.monotonic()
    writer = frame.write.mode("overwrite")  # type: ignore[attr-defined]
    if path is None:
        writer.format("noop").save()
    else:
        writer.parquet(str(path))
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    per_partition = args.records // PARTITIONS
    total = per_partition * PARTITIONS
    work = Path(tempfile.mkdtemp(prefix="raftlog-spark-bench-"))
    cluster = LocalCluster(work / "cluster", 3, raft_port=RAFT_PORT, http_port=HTTP_PORT)
    spark = None
    try:
        cluster.start()
        cluster.wait_healthy(60)
        servers = cluster.http_addresses

        async def create() -> None:
            async with AsyncClient(servers) as client:
                await client.create_topic("bench", PARTITIONS, 3)
                for _ in range(300):
                    views = (await client.describe_topic("bench"))["partitions"]
                    if all(v["leader"] for v in views):
                        return
                    await asyncio.sleep(0.1)

        asyncio.run(create())
        seconds = asyncio.run(produce(servers, "bench", per_partition))
        print(f"produced {total:,} records of {RECORD_BYTES} bytes in {seconds:.1f} s "
              f"({total / seconds:,.0f} rec/s, RF 3, fsync on)")
        paths = baseline_files(work, per_partition)
        spark = spark_session("local[2]", "raftlog-bench")
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(ArrowFilesSource)
        raftlog = spark.read.format("raftlog").option("servers", ",".join(servers)).option("topic", "bench").load()
        baseline = spark.read.format("arrow_files").option("paths", ",".join(paths)).load()
        out = work / "out"
        for frame in (raftlog, baseline):  # warm-up: Python worker start-up and first-read costs
            timed_write(frame, None)
        rates: dict[tuple[str, str], list[float]] = {}
        for round_number in range(1, args.rounds + 1):
            for sink, path in (("noop", None), ("parquet", out)):
                # raftlog last: its Parquet output is the one checked below
                for name, frame in (("baseline", baseline), ("raftlog", raftlog)):
                    rate = total / timed_write(frame, path)
                    rates.setdefault((name, sink), []).append(rate)
                    print(f"round {round_number}: {name:8s} -> {sink:7s} {rate:12,.0f} rec/s", flush=True)
        rows = spark.read.parquet(str(out)).count()
        assert rows == total, f"parquet holds {rows} rows, expected {total}"
        median = {key: statistics.median(values) for key, values in rates.items()}
        for sink in ("noop", "parquet"):
            ours, base = median[("raftlog", sink)], median[("baseline", sink)]
            print(f"{sink:7s}: raftlog {ours:12,.0f} rec/s, in-memory Arrow baseline {base:12,.0f} rec/s, "
                  f"ratio {ours / base:.2f}")
        ours, base = median[("raftlog", "parquet")], median[("baseline", "parquet")]
        print(f"export to Parquet in local[2]: {ours:,.0f} rec/s (target >= 1,000,000), "
              f"{ours / base:.2f} of the baseline (target >= 0.70)")
        return 0
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
