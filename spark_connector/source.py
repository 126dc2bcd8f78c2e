"""The PySpark data source `raftlog`: `spark.read.format("raftlog")` and `df.write.format("raftlog")`.

Where each part runs (Spark's Python data source protocol):

- `schema()` in a Python worker when `load()` is called: options are parsed
  and checked here, so a bad option fails at `load()`, naming the option;
- `DataSourceReader.partitions()` once per query, on the driver side: the
  ranges are resolved there (`spark_connector.cluster.plan`) and travel inside
  the input partitions, so every executor reads the same fixed range;
- `read(partition)` on executors (`spark_connector.reader`), yielding Arrow
  record batches of exactly the declared schema;
- `writer()` on the driver (checks the DataFrame's columns), `write()` on executors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_connector.cluster import plan
from spark_connector.errors import OptionError
from spark_connector.options import (
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from spark_connector.planning import ReadTask
from spark_connector.reader import read_task
from spark_connector.writer import Layout, layout_of, write_rows

FORMAT = "raftlog"
HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()), StructField("value", BinaryType())])))
# Spark's Kafka source schema (KafkaRecordToRowConverter), field for field.
SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
    StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
])
SCHEMA_WITH_HEADERS = StructType([*SCHEMA.fields, HEADERS_FIELD])


def schema_for(include_headers: bool) -> StructType:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


class RaftlogInputPartition(InputPartition):
    """One planned range and its servers (pickled to the executor that reads it)."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task

    def __repr__(self) -> str:
        r = self.task.range
        return f"RaftlogInputPartition({r.topic}/{r.partition} [{r.start}, {r.end}) from {self.task.servers[0]})"


class RaftlogReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [RaftlogInputPartition(task) for task in asyncio.run(plan(self.options))]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, RaftlogInputPartition):
            return iter(())  # nothing to read: Spark stands in one empty partition for none
        return read_task(partition.task, self.options)


@dataclass
class RaftlogCommitMessage(WriterCommitMessage):
    records: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)


class RaftlogWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions, layout: Layout) -> None:
        self.options = options
        self.layout = layout
        self.records_written = 0

    def write(self, iterator: Iterator) -> RaftlogCommitMessage:
        result = asyncio.run(write_rows(iterator, self.layout, self.options))
        return RaftlogCommitMessage(result.records, result.by_topic)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.records_written = sum(m.records for m in messages if isinstance(m, RaftlogCommitMessage))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: what the finished tasks produced is in the log, which is append-only."""


class RaftlogDataSource(DataSource):
    """Format `raftlog`: the options and schema of Spark's Kafka source (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return schema_for(parse_read_options(self.options).include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options)
        expected = schema_for(options.include_headers)
        if schema != expected:
            raise OptionError("schema", "the raftlog source has a fixed schema (that of Spark's Kafka source, "
                                        f"{expected.simpleString()}); do not set one with .schema()")
        return RaftlogReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("mode", "a raftlog topic is an append-only log: use mode('append'), "
                                      "not mode('overwrite')")
        options = parse_write_options(self.options)
        layout = layout_of([(f.name, f.dataType.simpleString()) for f in schema.fields], options)
        return RaftlogWriter(options, layout)


def auto_registered(spark: Any) -> bool:
    """Whether PySpark found the format on its own (the module `pyspark_raftlog` on its path)."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(FORMAT))
    except Exception:  # a Spark without this (internal) lookup, or Spark Connect: register anyway
        return False


def register(spark: Any) -> None:
    """Make `format("raftlog")` known to a session, unless PySpark already found it.

    Installed from a wheel, PySpark finds it by itself through the top-level module
    `pyspark_raftlog` (its `DefaultSource`); an editable install is not listed by
    that scan, so this registers it with `spark.dataSource.register`.
    """
    if not auto_registered(spark):
        spark.dataSource.register(RaftlogDataSource)
