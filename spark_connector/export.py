"""`raftlog export TOPIC --to parquet:DIR`: a topic's fixed range into files, with Spark.

1. Resolve the range once, here on the driver: `--from` (default: the group's
   committed offsets with `--group`, else earliest) and `--until` (default:
   latest, the high watermark now). Both take `earliest`, `latest`, an offset
   for every partition, `P:N,P:N` or `{"P": N}` per partition, or a time
   (ISO 8601 such as `2024-05-01T12:00:00Z`, or `@<epoch ms>`), which becomes
   the first offset at or after it.
2. Read it through the `raftlog` format with those exact offsets and write it
   (mode append, so repeated exports add files next to the earlier ones).
3. With `--group`, commit the end offsets only after the write succeeded: the
   next export starts exactly there, so none is missed or written twice
   (unless the process dies between the write and the commit; the next export
   then repeats that range, which its files make visible).

Records and key+value bytes are counted by an `Observation` of the write
itself; bytes written are the sizes of the new files (local paths only).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from multiraft.client import AsyncClient, read_token_file
from spark_connector.cluster import concrete_offsets, partition_states, subscribed_partitions
from spark_connector.errors import ConnectorError, OptionError
from spark_connector.options import EARLIEST, LATEST, Bound, ReadOptions, Subscription
from spark_connector.planning import OffsetRange, resolve_ranges

FORMATS = ("parquet", "csv", "json")
PROGRESS_INTERVAL_S = 0.5


@dataclass
class ExportSummary:
    topic: str
    target: str
    ranges: list[OffsetRange]
    records: int = 0
    payload_bytes: int = 0
    written_bytes: int | None = None
    seconds: float = 0.0
    committed: dict[int, int] = field(default_factory=dict)

    def line(self) -> str:
        written = "" if self.written_bytes is None else f", {_size(self.written_bytes)} written"
        partitions = sum(1 for r in self.ranges if r.size)
        text = (f"exported {self.records} records ({_size(self.payload_bytes)} of keys and values{written}) "
                f"from {partitions} of {len(self.ranges)} partitions of {self.topic} to {self.target} "
                f"in {self.seconds:.1f} s")
        if self.committed:
            text += "; committed " + ",".join(f"{p}:{o}" for p, o in sorted(self.committed.items()))
        return text


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def parse_target(to: str, fmt: str | None) -> tuple[str, str]:
    """`parquet:DIR` (or csv:, json:, or a bare DIR with --format) -> (format, path)."""
    prefix, sep, rest = to.partition(":")
    if sep and prefix in FORMATS:
        if fmt is not None and fmt != prefix:
            raise OptionError("--format", f"{fmt} contradicts --to {to}")
        fmt, path = prefix, rest
    else:
        path = to
    if not path:
        raise OptionError("--to", f"names no directory: {to!r} (expected e.g. parquet:/tmp/out)")
    if "://" not in path:
        path = str(Path(path).expanduser().resolve())
    return fmt or "parquet", path


def parse_position(text: str, flag: str, side: str, topic: str, partitions: list[int]) -> Bound:
    """--from/--until as a Bound over `topic`'s partitions: EARLIEST/LATEST, offsets or a time."""
    value = text.strip()
    default = EARLIEST if side == "starting" else LATEST
    lowered = value.lower()
    if lowered in ("earliest", "latest"):
        if (lowered == "latest") == (side == "starting"):
            raise OptionError(flag, f"{lowered!r} here would export nothing")
        return Bound(flag, EARLIEST if lowered == "earliest" else LATEST)
    if value.lstrip("-").isdigit():
        if int(value) < 0:
            raise OptionError(flag, f"offset {value} is negative")
        return Bound(flag, default, offsets={(topic, p): int(value) for p in partitions})
    if value.startswith("@") and value[1:].isdigit():
        return Bound(flag, default, timestamp_ms=int(value[1:]))
    if value.startswith("{") or (":" in value and all(_pair(p) for p in value.split(","))):
        pairs = _partition_offsets(value, flag)
        missing = sorted(set(pairs) - set(partitions))
        if missing:
            raise OptionError(flag, f"names partition {missing[0]}, which topic {topic!r} does not have")
        return Bound(flag, default, offsets={(topic, p): o for p, o in pairs.items()})
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(flag, f"{text!r} is not earliest, latest, an offset, P:N,P:N, JSON "
                                f"{{\"P\": N}}, an ISO 8601 time or @<epoch ms>") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return Bound(flag, default, timestamp_ms=int(moment.timestamp() * 1000))


def _pair(text: str) -> bool:
    partition, sep, offset = text.strip().partition(":")
    return bool(sep) and partition.isdigit() and offset.isdigit()


def _partition_offsets(value: str, flag: str) -> dict[int, int]:
    if not value.startswith("{"):
        return {int(p.split(":")[0]): int(p.split(":")[1]) for p in value.split(",")}
    try:
        decoded = json.loads(value)
    except ValueError as error:
        raise OptionError(flag, f"is not valid JSON ({error})") from None
    if not isinstance(decoded, dict) or not all(
            str(k).isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in decoded.items()):
        raise OptionError(flag, 'expected JSON like {"0": 42, "1": 7}')
    return {int(k): v for k, v in decoded.items()}


async def resolve_export(servers: list[str], topic: str, start: str | None, until: str | None,
                         group: str | None, fail_on_data_loss: bool = True) -> list[OffsetRange]:
    """The fixed ranges of one export (the group's commits are the default start)."""
    async with AsyncClient(servers, timeout_s=30.0, attempts=6) as client:
        partitions = await subscribed_partitions(client, Subscription("topic", topics=(topic,)))
        numbers = partitions[topic]
        if start is not None:
            start_bound = parse_position(start, "--from", "starting", topic, numbers)
        elif group is not None:
            committed = await client.fetch_offsets(group, topic)
            start_bound = Bound(f"--group {group}", EARLIEST, offsets={(topic, p): o for p, o in committed.items()})
        else:
            start_bound = Bound("--from", EARLIEST)
        until_bound = parse_position(until, "--until", "ending", topic, numbers) if until is not None else \
            Bound("--until", LATEST)
        states = await partition_states(client, partitions)
        options = ReadOptions(tuple(servers), Subscription("topic", topics=(topic,)), start_bound, until_bound)
        starting = await concrete_offsets(client, start_bound, states, options, "starting")
        ending = await concrete_offsets(client, until_bound, states, options, "ending")
    return resolve_ranges(list(states.values()), starting, ending, fail_on_data_loss=fail_on_data_loss,
                          starting_option=start_bound.option, ending_option=until_bound.option)


def _files(path: str) -> dict[str, int]:
    if "://" in path or not os.path.isdir(path):
        return {}
    return {str(p): p.stat().st_size for p in Path(path).rglob("*") if p.is_file()}


@contextlib.contextmanager
def _progress(spark: Any, stream: TextIO, started: float) -> Iterator[None]:
    """A line on `stream` as tasks finish (rewritten in place on a terminal)."""
    stop = threading.Event()
    tty = stream.isatty()

    def report() -> None:
        tracker = spark.sparkContext.statusTracker()
        last = None
        while not stop.wait(PROGRESS_INTERVAL_S):
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            stages = [s for s in stages if s is not None]
            if not stages:
                continue
            done, total = sum(s.numCompletedTasks for s in stages), sum(s.numTasks for s in stages)
            if (done, total) != last:
                last = (done, total)
                text = f"export: {done}/{total} tasks done, {time.monotonic() - started:.1f} s"
                print(f"\r{text}" if tty else text, end="" if tty else "\n", file=stream, flush=True)
        if tty and last is not None:
            print(file=stream)

    thread = threading.Thread(target=report, name="raftlog-export-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def write_ranges(spark: Any, servers: list[str], topic: str, ranges: list[OffsetRange], fmt: str, path: str,
                 progress: TextIO | None = None) -> tuple[int, int]:
    """Read exactly `ranges` and append them to `path`; (records, key+value bytes)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    offsets = {topic: {str(r.partition): r.start for r in ranges}}
    ends = {topic: {str(r.partition): r.end for r in ranges}}
    frame = (spark.read.format("raftlog").option("servers", ",".join(servers)).option("topic", topic)
             .option("startingOffsets", json.dumps(offsets)).option("endingOffsets", json.dumps(ends))
             .option("includeHeaders", "true").load())
    observation = Observation("raftlog_export")
    payload = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
    frame = frame.observe(observation, F.count(F.lit(1)).alias("records"),
                          F.coalesce(F.sum(payload), F.lit(0)).alias("bytes"))
    if fmt == "csv":  # CSV has no binary or nested columns: text and JSON text
        frame = frame.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                             "topic", "partition", "offset", "timestamp", "timestampType",
                             F.to_json("headers").alias("headers"))
    started = time.monotonic()
    with _progress(spark, progress, started) if progress is not None else contextlib.nullcontext():
        writer = frame.write.mode("append").format(fmt)
        if fmt == "csv":
            writer = writer.option("header", "true")
        writer.save(path)
    metrics = observation.get
    return int(metrics["records"]), int(metrics["bytes"])


def concise(error: BaseException) -> str:
    """The connector's own message out of a Spark exception (which wraps a whole traceback)."""
    text = str(error)
    for line in reversed(text.splitlines()):
        stripped = line.strip()
        for name in ("DataLossError", "ReadTimeoutError", "ConnectorError", "OptionError", "CorruptBatchError"):
            if stripped.startswith(f"spark_connector.errors.{name}: ") or stripped.startswith(f"{name}: "):
                return stripped.split(": ", 1)[1]
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:500]


def run_export(spark: Any, servers: list[str], topic: str, to: str, *, fmt: str | None = None,
               start: str | None = None, until: str | None = None, group: str | None = None,
               fail_on_data_loss: bool = True, progress: TextIO | None = None) -> ExportSummary:
    """The whole export; raises OptionError / ConnectorError (the CLI prints their message).

    `progress`: where the planned ranges and task progress go (the CLI: stderr).
    """
    fmt, path = parse_target(to, fmt)
    if fmt not in FORMATS:
        raise OptionError("--format", f"expected one of {', '.join(FORMATS)}, got {fmt!r}")
    started = time.monotonic()
    ranges = asyncio.run(resolve_export(servers, topic, start, until, group, fail_on_data_loss))
    summary = ExportSummary(topic, f"{fmt}:{path}", ranges)
    if progress is not None:
        print(f"export: {topic}: " + ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in ranges)
              + f" -> {fmt}:{path}", file=progress, flush=True)
    before = _files(path)
    if any(r.size for r in ranges):
        try:
            summary.records, summary.payload_bytes = write_ranges(spark, servers, topic, ranges, fmt, path,
                                                                  progress)
        except Exception as error:
            if isinstance(error, ConnectorError):
                raise
            raise ConnectorError(f"the export failed: {concise(error)}") from error
    after = _files(path)
    summary.written_bytes = sum(size for name, size in after.items() if name not in before) if after else None
    if group is not None:
        summary.committed = {r.partition: r.end for r in ranges}
        asyncio.run(_commit(servers, group, topic, summary.committed))
    summary.seconds = time.monotonic() - started
    return summary


async def _commit(servers: list[str], group: str, topic: str, offsets: dict[int, int]) -> None:
    async with AsyncClient(servers, timeout_s=30.0, attempts=6) as client:
        await client.commit_offsets(group, [{"topic": topic, "partition": p, "offset": o}
                                            for p, o in sorted(offsets.items())])


_LOG4J_ERRORS_ONLY = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@contextlib.contextmanager
def _quiet_log4j() -> Iterator[str]:
    """A log4j2 file that keeps Spark's JVM to errors (the command prints its own progress).

    Made with `mkstemp` (0600) in a directory of its own (`mkdtemp`: 0700, a new name
    each time), removed when the export is done. A fixed name in the shared temporary
    directory let another user plant a configuration of their own for the JVM to load,
    or a symlink for the export to write through."""
    directory = tempfile.mkdtemp(prefix="raftlog-export-")
    try:
        fd, path = tempfile.mkstemp(prefix="log4j2-", suffix=".properties", dir=directory)
        with os.fdopen(fd, "w") as file:
            file.write(_LOG4J_ERRORS_ONLY)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def export_command(args: Any, servers: list[str]) -> int:
    """`raftlog export` (multiraft/cli/main.py): 0 done, 1 failed, 2 bad usage; summary on stdout."""
    try:
        from pyspark.sql import SparkSession

        from spark_connector.session import spark_session
    except ImportError as error:
        print(f"raftlog export: needs PySpark ({error}); install the extra: pip install 'raftlog[spark]'",
              file=sys.stderr)
        return 2
    if getattr(args, "token_file", None) is not None:
        # The connector's clients (the planning here, the readers in Spark's local
        # workers, which inherit this environment) take their token from $RAFTLOG_TOKEN.
        os.environ["RAFTLOG_TOKEN"] = read_token_file(args.token_file)
    owned = SparkSession.getActiveSession() is None  # a session we start, we stop
    with _quiet_log4j() as log4j:
        spark = spark_session(args.master, "raftlog export",
                              conf={"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}"})
        try:
            summary = run_export(spark, servers, args.topic, args.to, fmt=args.format, start=args.start,
                                 until=args.until, group=args.group, fail_on_data_loss=not args.skip_lost,
                                 progress=sys.stderr)
        except OptionError as error:
            print(f"raftlog export: {error}", file=sys.stderr)
            return 2
        except ConnectorError as error:
            print(f"raftlog export: {error}", file=sys.stderr)
            return 1
        finally:
            if owned:
                spark.stop()
    print(summary.line())
    return 0
